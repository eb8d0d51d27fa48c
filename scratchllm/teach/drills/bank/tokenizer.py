"""The drills of scratchllm.tokenizer: one merge step of byte-level BPE training; token
healing at the prompt boundary (tokenizer.healing.heal_table, used by lm.sampling.heal)."""
import numpy as np

from scratchllm.teach.drills.bank._common import drill
from scratchllm.tokenizer import heal_table
from scratchllm.tokenizer import train as bpe_train


# ---------------------------------------------------------------------------- bpe merge step
@drill("bpe_merge_step", 25, "scratchllm/tokenizer/train.py", '''
    def bpe_merge_step(word_counts):
        """One step of byte-level BPE training.

        word_counts: {tuple of bytes tokens: count}, e.g. {(b"l", b"o", b"w"): 5, ...}: each
        unique pre-token split into its current tokens, with its count in the corpus.
        Return (best, new_word_counts): best = the most frequent adjacent pair (a, b) counted
        inside words and weighted by their counts, ties to the lexicographically greatest
        (a, b) of bytes; new_word_counts = every word with each occurrence of best, left to
        right, replaced by the single token a + b.  If no word has two tokens: (None, word_counts).
        """
''', [
    ("Sennrich's low/lower/newest/widest, with a tie", lambda fn: _bpe_sennrich(fn)),
    ("overlapping pair merges left to right", lambda fn: _bpe_overlap(fn)),
    ("40 merges on a text equal scratchllm's train_bpe_ref", lambda fn: _bpe_vs_library(fn)),
])
def _bpe_merge_step(word_counts):
    return bpe_train.merge_step(word_counts)


def _split(word):
    return tuple(bytes([c]) for c in word.encode())


def _bpe_sennrich(fn):
    words = {_split("low"): 5, _split("lower"): 2, _split("newest"): 6, _split("widest"): 3}
    best, new = fn(words)  # (e, s) and (s, t) both occur 9 times: (s, t) is greater
    if best != (b"s", b"t"):
        raise AssertionError(f"best pair {best!r}, expected (b's', b't') (9 occurrences, the "
                             "greater of the tied (b'e', b's') and (b's', b't'))")
    want = {_split("low"): 5, _split("lower"): 2,
            (b"n", b"e", b"w", b"e", b"st"): 6, (b"w", b"i", b"d", b"e", b"st"): 3}
    if new != want:
        raise AssertionError(f"merged words {new!r}, expected {want!r}")
    return "ok"


def _bpe_overlap(fn):
    best, new = fn({_split("aaa"): 1, _split("aaaa"): 2})
    want = {(b"aa", b"a"): 1, (b"aa", b"aa"): 2}
    if best != (b"a", b"a") or new != want:
        raise AssertionError(f"got {best!r}, {new!r}; expected (b'a', b'a'), {want!r}")
    return "ok"


def _bpe_vs_library(fn):
    text = ("the cat sat on the mat; the rat sat on the cat's hat. " * 3
            + "a tokenizer merges frequent pairs, then the merged tokens merge again.")
    counts = bpe_train.count_chunk_ref(text, (), "gpt2")
    words = {tuple(bytes([b]) for b in w): c for w, c in counts.items()}
    merges = []
    for _ in range(40):
        best, words = fn(words)
        merges.append(best)
    _, want = bpe_train.train_bpe_ref([text], vocab_size=256 + 40)
    if merges != want:
        first = next(i for i, (a, b) in enumerate(zip(merges, want)) if a != b)
        raise AssertionError(f"merge {first} is {merges[first]!r}, expected {want[first]!r}")
    return "40 merges equal"


# ---------------------------------------------------------------------------- token healing
@drill("token_healing", 15, "scratchllm/tokenizer/healing.py", '''
    def token_healing(token_bytes, prompt_ids, vocab_size):
        """Token healing at the prompt boundary.

        token_bytes: {id: bytes} of every ordinary token; prompt_ids: the prompt's ids (at
        least two). A prompt cut mid-token ("https:") ends on a token the model rarely saw
        there. Back up over the last prompt token and allow, as the first sampled token, only
        tokens whose bytes start with the removed token's bytes.
        Return (shorter_ids, allowed): shorter_ids = prompt_ids without its last id; allowed
        = a boolean array (vocab_size,), True for the ids the first token may be.
        """
''', [
    ("'https:' backs up to allow ':', '://', '::'", lambda fn: _healing_url(fn)),
    ("agrees with scratchllm's heal_table on a trained vocab", lambda fn: _healing_vs_library(fn)),
])
def _token_healing(token_bytes, prompt_ids, vocab_size):
    return heal_table(token_bytes, list(prompt_ids), vocab_size)


def _healing_url(fn):
    table = {0: b"https", 1: b":", 2: b"://", 3: b"::", 4: b"/", 5: b" :", 6: b"x:"}
    shorter, allowed = fn(table, [0, 1], 8)
    if list(shorter) != [0]:
        raise AssertionError(f"shorter ids {shorter!r}, expected [0]")
    got = sorted(np.flatnonzero(allowed).tolist())
    if got != [1, 2, 3]:
        raise AssertionError(f"allowed ids {got}, expected [1, 2, 3] (':' '://' '::'; not ' :' "
                             "or 'x:', which do not start with ':')")
    return "ok"


def _healing_vs_library(fn):
    vocab, merges = bpe_train.train_bpe_ref(["see https://a.org and https://b.org now " * 8],
                                            vocab_size=270)
    table = dict(vocab)
    ids = sorted(table, key=lambda i: (-len(table[i]), i))[:3]   # three long tokens
    shorter, allowed = fn(table, ids, 270)
    want = np.array([i in table and table[i].startswith(table[ids[-1]]) for i in range(270)])
    if list(shorter) != ids[:-1] or not np.array_equal(np.asarray(allowed, bool), want):
        raise AssertionError("the allowed ids differ from heal_table's")
    return "ok"
