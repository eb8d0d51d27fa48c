"""Long pre-tokens (a tokenizer denial of service): a pre-token longer than fast_bpe.LONG
bytes merges through a heap (O(m log m)) and gives exactly the ids of the rescanning merge."""
import os

import numpy as np
import pytest

from scratchllm.tokenizer import Tokenizer, fast_bpe

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")


@pytest.fixture(scope="module")
def gpt2():
    return Tokenizer.from_gpt2_files(os.path.join(FIX, "gpt2", "vocab.json"),
                                     os.path.join(FIX, "gpt2", "merges.txt"))


@pytest.mark.parametrize("seed", [0, 1])
def test_a_long_pretoken_gives_the_ids_of_the_rescanning_merge(gpt2, seed):
    rng = np.random.default_rng(seed)
    word = "".join(rng.choice(list("etaoinshrdlu"), size=3 * fast_bpe.LONG))  # one \p{L}+ run
    want = list(gpt2._bpe_ref(word.encode()))
    assert gpt2.encode(word) == want
    heap = fast_bpe.bpe_long(word.encode(), gpt2._byte_ids, *gpt2._table).tolist()
    assert heap == want == list(gpt2._bpe(word.encode()))
    assert gpt2.decode(want) == word


def test_long_pretokens_keep_their_place_among_the_others(gpt2):
    # the encoder leaves pre-tokens over LONG bytes to the heap merge and splices their ids
    # back in: they land where the regex path (pre-token by pre-token) puts them
    from scratchllm.tokenizer.pretokenize import special_regex
    rng = np.random.default_rng(2)
    word = "".join(rng.choice(list("etaoinshrdlu"), size=fast_bpe.LONG + 1))
    text = f"a {word}, b<|endoftext|>{word}{word.upper()}\n\n{'=' * 300} c. {word}"
    special = special_regex(["<|endoftext|>"])
    want = gpt2._encode_slow(gpt2._pieces(text, special))
    assert gpt2.encode(text, allowed_special="all") == want
    assert gpt2.decode(want) == text and want.count(50256) == 1


def test_a_400k_character_pretoken_encodes_and_round_trips():
    """The reported case: 64k characters took 2.8 s, 4x per doubling; 400k would take minutes."""
    vocab = {b: bytes([b]) for b in range(256)}
    merges = [(b"a", b"b"), (b"ab", b"ab")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    tok = Tokenizer(vocab, merges)
    text = "ab" * 200_000
    ids = tok.encode(text)
    assert ids == [257] * 100_000 and tok.decode(ids) == text
    slow = Tokenizer(vocab, merges, pattern=r"\p{L}+|[^\p{L}]")  # the non-Numba path
    assert slow.encode(text) == ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_on_one_long_pretoken_equals_the_naive_trainer(seed):
    # one 3,000-letter pre-token of runs (aaab...): the merge loop rewrites only the sites of
    # each pair, left to right in the word, and must give the full-recount trainer's merges
    from scratchllm.tokenizer import train_bpe, train_bpe_ref
    rng = np.random.default_rng(seed)
    text = "".join(rng.choice(list("aab"), 3000))
    assert train_bpe([text], 300, workers=1) == train_bpe_ref([text], 300)
