"""The parts of the moe, experts and abf experiments that have an exact answer: the
fine-grained model starts as the same function as the MoE it is cut from, the byte classes
follow their rules, the mutual information of independent and of equal labels, and a RoPE
method changes nothing but the positions."""
import numpy as np

from scratchllm.experiments.abf import method_rope, with_rope
from scratchllm.experiments.experts import CLASSES, mutual_information, token_classes
from scratchllm.experiments.moe import configs, fine_from
from scratchllm.lm import LM


def test_fine_grained_model_starts_as_the_moe_it_is_cut_from():
    cfgs = configs(16, 1, 8)
    moe = LM(cfgs["moe"], rng=np.random.default_rng(0), dtype=np.float64)
    fine = fine_from(moe, cfgs["fine"], 0)
    ids = np.random.default_rng(1).integers(0, 256, (2, 9))
    np.testing.assert_allclose(fine.forward(ids)[0], moe.forward(ids)[0], rtol=0, atol=1e-12)


def test_token_classes_follow_the_rules():
    text = b"x = my_var(3) + the cat, os.path 42!"
    cls = token_classes(text)
    name = {i: CLASSES[c] if c >= 0 else None for i, c in enumerate(cls)}
    at = lambda s: name[text.index(s)]  # noqa: E731
    assert at(b"my_var") == "ident" and at(b"path") == "ident"  # "_", after "."
    assert at(b"the") == "word" and at(b"cat") == "word" and at(b"x") == "word"
    assert at(b"3") == "digit" and at(b"42") == "digit"
    assert at(b"(") == "punct" and at(b"!") == "punct" and at(b",") == "punct"
    assert at(b" ") is None
    assert token_classes(b"camelCase f(")[:9].tolist() == [CLASSES.index("ident")] * 9


def test_mutual_information_of_equal_and_of_independent_labels():
    a = np.repeat(np.arange(4), 4)  # every (a, b) pair once: independent
    assert abs(mutual_information(a, a) - np.log(4)) < 1e-12
    assert abs(mutual_information(a, np.tile(np.arange(4), 4))) < 1e-12


def test_rope_methods_share_the_weights_and_none_is_the_model():
    size = dict(vocab_size=256, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32)
    from scratchllm.specs import preset
    base = LM(preset("dense", **size), rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 256, (1, 12))
    logits = base.forward(ids)[0]
    np.testing.assert_array_equal(with_rope(base, "none", 8, size).forward(ids)[0], logits)
    pi = with_rope(base, "pi", 8, size).forward(ids)[0]
    np.testing.assert_array_equal(pi[:, 0], logits[:, 0])  # position 0: no rotation at all
    assert np.abs(pi - logits).max() > 1e-6
    assert method_rope("abf", 8) == {"rope_base": 500_000.0}
