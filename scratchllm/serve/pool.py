"""Where a serving engine keeps keys and values: a paged pool (fixed-size blocks addressed
through BlockManager's block tables) or one contiguous array per sequence, either in the
model's dtype or quantised (int8, fp8, int4: quantize.py, one group per token per head).

Both give the LM's decode what an attention layer's KVState gives it: GroupState, a view of
a group of sequences that hold the same number of tokens, with append(k, v), kv(),
positions(), n_seen and length. So LM.prefill and LM.decode run unchanged on a paged or
quantised cache: append quantises and scatters each token into its slot, kv() gathers (and
dequantises) the group's tokens into (B, Hkv, L, Dh).

    paged pool of a layer   codes (n_blocks, Hkv, bs, Dc), scales (n_blocks, Hkv, bs, G)
    contiguous              codes (1, Hkv, max_len, Dc) per sequence (as KVState)
(Dc = Dh, or Dh / 2 for int4; G groups per head vector; no scales unquantised.)

Glossary: B sequences in a group, Hkv KV heads, Dh head dim, L tokens held, bs block size.
"""
import numpy as np

from scratchllm.attention import Attention
from scratchllm.serve.blocks import BlockManager
from scratchllm.serve.quantize import FORMATS, default_group_size, dequantize_codes, quantize

KV_DTYPES = ("float32",) + FORMATS  # "float32": unquantised, in the model's own dtype


def attention_layers(model):
    """(Hkv, Dh) of each layer, checking every mixer is full causal GQA attention (what a paged
    cache holds; windows, MLA and recurrent mixers keep other states)."""
    shapes = []
    for i, layer in enumerate(model.layers):
        mixer = layer.mixer
        mask = getattr(getattr(mixer, "spec", None), "mask", None)
        if type(mixer) is not Attention or mask.window is not None or mask.block is not None \
                or mask.chunk is not None:  # chunks: Llama 4's local layers
            raise ValueError(f"serve: layer {i} is {type(mixer).__name__}"
                             f"{' with a window' if mask is not None and mask.window else ''}"
                             f"{' with chunks' if mask is not None and mask.chunk else ''}; "
                             f"the serving caches hold full causal GQA attention layers only")
        if mixer.spec.alibi:
            raise ValueError(f"serve: layer {i} uses ALiBi; the serving caches need RoPE or "
                             f"learned positions")
        shapes.append((mixer.spec.n_kv_heads, mixer.head_dim))
    return shapes


def paged_supported(model):
    """Whether the paged and quantised caches can hold this model (attention_layers)."""
    try:
        attention_layers(model)
    except ValueError:
        return False
    return True


class _Codec:
    """How one cache stores a (..., Dh) head vector: codes (..., Dc) and scales (..., G)."""

    def __init__(self, fmt, head_dim, dtype):
        if fmt not in KV_DTYPES:
            raise ValueError(f"serve: kv_dtype must be one of {KV_DTYPES}, got {fmt!r}")
        self.fmt, self.dtype = fmt, np.dtype(dtype)
        self.group = default_group_size(fmt, head_dim)
        if fmt == "int4" and head_dim % 2:
            raise ValueError(f"serve: int4 packs two values per byte; head_dim={head_dim} is odd")
        self.code_dim = head_dim // 2 if fmt == "int4" else head_dim
        self.n_groups = head_dim // self.group
        self.code_dtype = {"float32": self.dtype, "int8": np.int8, "int4": np.uint8,
                           "fp8": np.dtype(quantize(np.zeros(1), "fp8").codes.dtype)}[fmt]

    def empty(self, lead):
        """Zeroed (codes, scales) of leading shape `lead` (scales None unquantised)."""
        codes = np.zeros(lead + (self.code_dim,), self.code_dtype)
        return codes, (None if self.fmt == "float32" else np.zeros(lead + (self.n_groups,),
                                                                  np.float32))

    def encode(self, x):
        """x (..., Dh) -> (codes, scales)."""
        if self.fmt == "float32":
            return x, None
        q = quantize(x, self.fmt, group_size=self.group)
        return q.codes, q.scales

    def decode(self, codes, scales):
        if self.fmt == "float32":
            return codes
        return dequantize_codes(codes, scales, self.fmt, self.group, self.dtype)


class GroupState:
    """One layer's KVState-like view of sequences `seqs` holding `lengths` tokens (an int for
    all, or (B,) ints: rows at different lengths, as KVState's rows may be)."""

    def __init__(self, cache, layer, seqs, lengths):
        self.cache, self.layer, self.seqs = cache, layer, seqs
        self.lengths = np.broadcast_to(np.asarray(lengths, np.int64), (len(seqs),)).copy()

    @property
    def length(self):
        return int(self.lengths.max())

    @property
    def n_seen(self):
        """An int while the rows are in step, else the (B,) lengths."""
        same = (self.lengths == self.lengths[0]).all()
        return int(self.lengths[0]) if same else self.lengths.copy()

    def restart(self, rows):
        """Rows (a (B,) bool mask or indices) start new sequences: they hold nothing."""
        self.lengths[rows] = 0

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) at positions lengths[b] .. + t - 1 of each sequence."""
        self.cache.write(self.layer, self.seqs, self.lengths, k, v)
        self.lengths += k.shape[2]

    def kv(self):
        """The group's keys and values, (B, Hkv, max length, Dh) each (dequantised)."""
        return self.cache.read(self.layer, self.seqs, self.lengths)

    def positions(self):
        return np.arange(self.length)  # (length,)

    def key_mask(self):
        """None while the rows are in step, else (B, 1, 1, length) bool: key j of row b is
        one of its tokens (j < lengths[b])."""
        if np.ndim(self.n_seen) == 0:
            return None
        return (np.arange(self.length) < self.lengths[:, None])[:, None, None, :]


class PagedCache:
    """Every layer's block pool and the one BlockManager they share; kernel: a quantised
    pool's decode_rows and one-token forward_rows attend in qattention's kernel (reading the
    codes) instead of dequantising first (off by default: no speed-up measured yet)."""
    batchable = True

    def __init__(self, model, n_blocks, block_size, kv_dtype="float32", kernel=False):
        self.kernel = kernel and kv_dtype != "float32"
        shapes = attention_layers(model)
        self.blocks = BlockManager(n_blocks, block_size)
        self.codecs = [_Codec(kv_dtype, dh, model.dtype) for _, dh in shapes]
        self.pools = [[c.empty((n_blocks, hkv, block_size)) for _ in "kv"]
                      for c, (hkv, _) in zip(self.codecs, shapes)]  # [layer][k|v] (codes, scales)

    def views(self, seqs, length):
        """Per-layer GroupStates of `seqs` (each holding `length` tokens) for LM.decode."""
        return [GroupState(self, i, seqs, length) for i in range(len(self.pools))]

    def copy_blocks(self, copies):
        """Copy-on-write: block src -> dst in every layer's pools."""
        for src, dst in copies:
            for pair in self.pools:
                for codes, scales in pair:
                    codes[dst] = codes[src]
                    if scales is not None:
                        scales[dst] = scales[src]

    def write(self, layer, seqs, starts, k, v):
        """k, v (B, Hkv, t, Dh) of sequence seqs[b] at positions starts[b] .. + t - 1."""
        B, _, t, _ = k.shape
        where = [w for seq, p in zip(seqs, starts) for w in self.blocks.slots(seq, int(p), t)]
        blk = np.array([w[0] for w in where])  # (B*t,)
        off = np.array([w[1] for w in where])  # (B*t,)
        for (codes, scales), x in zip(self.pools[layer], (k, v)):
            c, s = self.codecs[layer].encode(x.transpose(0, 2, 1, 3))  # (B, t, Hkv, Dc | G)
            codes[blk, :, off] = c.reshape((B * t,) + c.shape[2:])  # (B*t, Hkv, Dc)
            if scales is not None:
                scales[blk, :, off] = s.reshape((B * t,) + s.shape[2:])  # (B*t, Hkv, G)

    def table(self, seqs, L):
        """The block tables of seqs for their first L tokens, (B, nb) ints; a shorter table is
        padded with its first block (entries past a row's length are never read as its)."""
        nb = self.blocks.blocks_for(L)
        tables = [self.blocks.tables[s][:nb] for s in seqs]
        return np.array([t + t[:1] * (nb - len(t)) for t in tables])  # (B, nb)

    def read(self, layer, seqs, lengths):
        """Keys and values of seqs[b]'s first lengths[b] tokens, (B, Hkv, max length, Dh)
        each; a row past its own length holds padding (another block's entries)."""
        L = int(max(lengths))
        table = self.table(seqs, L)  # (B, nb)
        out = []
        for codes, scales in self.pools[layer]:
            c = _gather(codes, table, L)  # (B, Hkv, L, Dc)
            s = None if scales is None else _gather(scales, table, L)  # (B, Hkv, L, G)
            out.append(self.codecs[layer].decode(c, s))  # (B, Hkv, L, Dh)
        return out[0], out[1]


def _gather(pool, table, length):
    """pool (n_blocks, Hkv, bs, X) at block table (B, nb) -> (B, Hkv, length, X)."""
    B, nb = table.shape
    g = pool[table]  # (B, nb, Hkv, bs, X)
    g = g.transpose(0, 2, 1, 3, 4).reshape(B, pool.shape[1], nb * pool.shape[2], -1)
    return g[:, :, :length]  # (B, Hkv, L, X)


class ContiguousCache:
    """One preallocated (1, Hkv, max_len, .) array pair per sequence and layer, as KVState
    holds: the memory a server without paging reserves for a request's whole output."""
    batchable = True

    def __init__(self, model, kv_dtype="float32"):
        shapes = attention_layers(model)
        self.codecs = [_Codec(kv_dtype, dh, model.dtype) for _, dh in shapes]
        self.shapes = shapes
        self.arrays = {}  # seq -> [layer][k|v] (codes, scales)

    def add(self, seq, max_len):
        self.arrays[seq] = [[c.empty((1, hkv, max_len)) for _ in "kv"]
                            for c, (hkv, _) in zip(self.codecs, self.shapes)]

    def release(self, seq):
        del self.arrays[seq]

    def views(self, seqs, length):
        return [GroupState(self, i, seqs, length) for i in range(len(self.shapes))]

    def write(self, layer, seqs, starts, k, v):
        """k, v (B, Hkv, t, Dh) of sequence seqs[b] at positions starts[b] .. + t - 1."""
        t = k.shape[2]
        for b, (seq, p) in enumerate(zip(seqs, starts)):
            for (codes, scales), x in zip(self.arrays[seq][layer], (k, v)):
                c, s = self.codecs[layer].encode(x[b:b + 1])  # (1, Hkv, t, Dc | G)
                codes[:, :, p:p + t] = c
                if scales is not None:
                    scales[:, :, p:p + t] = s

    def read(self, layer, seqs, lengths):
        """Keys and values of seqs[b]'s first lengths[b] tokens, (B, Hkv, max length, Dh)
        each; a row past its own length holds padding."""
        L = int(max(lengths))
        out = []
        for j in range(2):  # k, v
            parts = [self.arrays[seq][layer][j] for seq in seqs]
            c = _stack([p[0] for p in parts], L)  # (B, Hkv, L, Dc)
            s = None if parts[0][1] is None else _stack([p[1] for p in parts], L)
            out.append(self.codecs[layer].decode(c, s))  # (B, Hkv, L, Dh)
        return out[0], out[1]

    def nbytes(self):
        """Bytes the sequences now held reserve (codes and scales of every layer)."""
        return sum(a.nbytes for layers in self.arrays.values() for pair in layers
                   for codes_scales in pair for a in codes_scales if a is not None)


class StateCache:
    """Each request's own decoding states from model.init_state(1, max_len) (any mixer:
    sliding windows, MLA's latents, Mamba's and the recurrences' states): the contiguous
    cache of a model the paged pool cannot hold. Its requests cannot share a decode call."""
    batchable = False

    def __init__(self, model):
        self.model, self.states = model, {}

    def add(self, seq, max_len):
        self.states[seq] = self.model.init_state(1, max_len)

    def release(self, seq):
        del self.states[seq]

    def views(self, seqs, length):
        """The one request's states (length: what it holds, checked by the LM's decode)."""
        if len(seqs) != 1:
            raise ValueError(f"StateCache.views: one request per call, got {len(seqs)}")
        return self.states[seqs[0]]

    def nbytes(self):
        """Bytes of every held state (KVState and its kin, or a tuple of arrays)."""
        return sum(st.nbytes if hasattr(st, "nbytes") else sum(a.nbytes for a in st)
                   for states in self.states.values() for st in states)


def _stack(arrays, L):
    """The first L tokens of each (1, Hkv, max_len, X) array, stacked: (B, Hkv, L, X); an
    array shorter than L is zero-padded; one array alone comes back as a view."""
    if len(arrays) == 1 and arrays[0].shape[2] >= L:
        return arrays[0][:, :, :L]
    out = np.zeros((len(arrays), arrays[0].shape[1], L, arrays[0].shape[3]), arrays[0].dtype)
    for b, a in enumerate(arrays):
        n = min(L, a.shape[2])
        out[b, :, :n] = a[0, :, :n]
    return out
