"""The bookkeeping of a paged KV cache (PagedAttention, Kwon et al. 2023, arXiv 2309.06180):
the cache is n_blocks fixed-size blocks of block_size tokens; a sequence owns a block table
(its logical block i lives in physical block table[i]); free blocks wait in a free list.

    token at position p of a sequence  ->  block table[p // block_size], slot p % block_size
    prefix sharing   a full block is named by the hash of (its parent's hash, its tokens); a
                     new sequence whose prompt starts with the same full blocks points its
                     table at them (a reference count per block) instead of computing them
    copy-on-write    a write into a block whose count is above 1 first copies it to a fresh
                     block (the caller copies the arrays; see BlockManager.slot)
    freed blocks     go to the end of the free list with their hash kept, so a later prompt
                     can still hit them; allocation takes the front (least recently freed) and
                     forgets its hash then
Arrays live elsewhere (pool.py); this is pure Python and the same for every layer.

Glossary: bs block size, n tokens held by a sequence.
"""
from collections import OrderedDict


class OutOfBlocks(Exception):
    """No free block is left: the engine preempts a sequence and tries again."""


class BlockManager:
    """Block tables, reference counts, the free list and the prefix hashes of one cache."""

    def __init__(self, n_blocks, block_size):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"BlockManager: need n_blocks >= 1 and block_size >= 1, got "
                             f"{n_blocks}, {block_size}")
        self.n_blocks, self.block_size = n_blocks, block_size
        self.free = OrderedDict((b, None) for b in range(n_blocks))  # LRU order, front first
        self.refs = [0] * n_blocks
        self.hash_of = {}  # physical block -> hash of its full contents (and prefix)
        self.by_hash = {}  # hash -> physical block
        self.tables = {}  # sequence -> [physical block per logical block]
        self.lengths = {}  # sequence -> tokens held
        self.hits = self.lookups = 0  # prefix-cache hits and lookups, in blocks

    @property
    def n_free(self):
        return len(self.free)

    def blocks_for(self, n_tokens):
        """Blocks that n_tokens tokens occupy."""
        return -(-n_tokens // self.block_size)

    def _chain(self, tokens):
        """Hashes of the full blocks of `tokens`, each over its parent's hash and its ids."""
        out, h, bs = [], None, self.block_size
        for i in range(len(tokens) // bs):
            h = hash((h, tuple(tokens[i * bs:(i + 1) * bs])))
            out.append(h)
        return out

    def _take(self):
        """A free block (refcount 1), forgetting the hash it held; OutOfBlocks if none."""
        if not self.free:
            raise OutOfBlocks
        b, _ = self.free.popitem(last=False)
        h = self.hash_of.pop(b, None)
        if h is not None and self.by_hash.get(h) == b:
            del self.by_hash[h]
        self.refs[b] = 1
        return b

    def _ref(self, b):
        if self.refs[b] == 0:
            del self.free[b]
        self.refs[b] += 1

    def cached_prefix(self, tokens):
        """Physical blocks of the longest run of full blocks of tokens[:-1] already cached."""
        found = []
        for h in self._chain(tokens[:-1]):
            if h not in self.by_hash:
                break
            found.append(self.by_hash[h])
        return found

    def fits(self, tokens, extra=0):
        """Whether a sequence of `tokens` (and `extra` tokens more) can start now: its
        uncached blocks, and its cached ones now on the free list, are all free."""
        cached = self.cached_prefix(tokens)
        shared_free = sum(self.refs[b] == 0 for b in cached)
        need = self.blocks_for(len(tokens) + extra) - len(cached) + shared_free
        return need <= self.n_free

    def add(self, seq, tokens):
        """Start sequence `seq` with `tokens` to be stored: point its table at the cached full
        blocks of its prefix. Returns how many tokens that covers (a multiple of block_size,
        below len(tokens), so at least the last token is computed); the caller then writes the
        rest through slot()."""
        if seq in self.tables:
            raise ValueError(f"BlockManager.add: sequence {seq!r} is already held")
        cached = self.cached_prefix(tokens)
        self.lookups += len(tokens[:-1]) // self.block_size
        self.hits += len(cached)
        for b in cached:
            self._ref(b)
        self.tables[seq] = list(cached)
        self.lengths[seq] = len(cached) * self.block_size
        return self.lengths[seq]

    def reserve(self, seq, n_new):
        """Make room for n_new more tokens of `seq`: new blocks, and copy-on-write of a shared
        last block about to be written. Returns [(src, dst)] block copies the caller must make
        in every layer's arrays; OutOfBlocks (with nothing changed) if the blocks are not free."""
        table, n, bs = self.tables[seq], self.lengths[seq], self.block_size
        need = self.blocks_for(n + n_new) - len(table)
        cow = n % bs != 0 and self.refs[table[-1]] > 1
        if need + cow > self.n_free:
            raise OutOfBlocks
        copies = []
        if cow:
            dst = self._take()
            copies.append((table[-1], dst))
            self.refs[table[-1]] -= 1  # still held by the other sequences
            table[-1] = dst
        table += [self._take() for _ in range(need)]
        return copies

    def slots(self, seq, start, count):
        """(physical block, offset) of positions start .. start + count - 1 of `seq`."""
        table, bs = self.tables[seq], self.block_size
        return [(table[p // bs], p % bs) for p in range(start, start + count)]

    def commit(self, seq, tokens):
        """`seq` now holds len(tokens) tokens (written by the caller): register the hash of
        every block that became full, so later prompts can share it."""
        table, old = self.tables[seq], self.lengths[seq]
        self.lengths[seq] = len(tokens)
        bs = self.block_size
        for i, h in enumerate(self._chain(tokens)):
            if (i + 1) * bs > old and h not in self.by_hash and table[i] not in self.hash_of:
                self.by_hash[h], self.hash_of[table[i]] = table[i], h

    def fork(self, parent, child):
        """`child` shares every block of `parent` (counts + 1): parallel sampling's start."""
        if child in self.tables:
            raise ValueError(f"BlockManager.fork: sequence {child!r} is already held")
        for b in self.tables[parent]:
            self._ref(b)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]

    def release(self, seq):
        """Drop `seq`: each of its blocks loses a reference; unreferenced ones join the end of
        the free list (keeping their hash for later hits)."""
        for b in reversed(self.tables.pop(seq)):  # the tail first: freed before its prefix
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free[b] = None
        del self.lengths[seq]

    def blocks_in_use(self):
        """Physical blocks referenced by at least one sequence."""
        return self.n_blocks - self.n_free
