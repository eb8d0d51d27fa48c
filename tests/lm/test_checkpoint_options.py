"""ModelConfig options that released checkpoints need (HF Mamba-1 mixer-only blocks, Jamba's
inner Mamba norms, DeepSeek-V3 / gpt-oss routing): whole-model gradients, decoding, wiring."""
import numpy as np
import pytest

from grads.cases import CASES, LM_CHECKPOINTS, LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.moe import MoE

V = LM_TINY["vocab_size"]


def test_whole_model_gradients():
    reports = CASES["lm_checkpoint_options"](np.random.default_rng(7))
    for report in reports:
        assert report.ok, f"\n{report}"
    checked = {(report.label.split(",")[0], row.input) for report in reports
               for row in report.rows}
    for label, (name, overrides) in LM_CHECKPOINTS.items():
        model = LM(lm_tiny(name, **overrides), rng=np.random.default_rng(0))
        assert {n for lab, n in checked if lab == label} == \
            {n for n, _ in model.named_parameters()}


@pytest.mark.parametrize("label", list(LM_CHECKPOINTS))
def test_cached_decoding_equals_full_recompute(label):
    name, overrides = LM_CHECKPOINTS[label]
    rng = np.random.default_rng(3)
    model = LM(lm_tiny(name, **overrides), rng=rng, dtype=np.float64)
    ids = rng.integers(0, V, (2, 8))
    full, _ = model.forward(ids)  # (2, T, V)
    state = model.init_state(batch=2, max_len=8)
    for t in range(8):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], rtol=0,
                                   atol=1e-9, err_msg=f"{label}: position {t}")


def test_mixer_only_blocks_and_options_reach_the_modules():
    rng = np.random.default_rng(4)
    mamba1 = LM(lm_tiny("hybrid", ffn="none", layer_pattern="MM"), rng=rng)
    names = [n for n, _ in mamba1.named_parameters()]
    assert not any(".norm2." in n or ".ffn." in n for n in names)
    assert all(layer.ffn is None and layer.norm2 is None for layer in mamba1.layers)
    jamba = LM(lm_tiny("hybrid", **LM_CHECKPOINTS["jamba"][1]), rng=rng)
    mamba = jamba.layers[0].mixer
    assert mamba.dt_norm.data.shape == mamba.W_dt.data.shape[:1] == (3,)
    assert mamba.spec.norm_eps == jamba.cfg.layers[0].mixer.norm_eps == jamba.cfg.norm.eps
    moe = LM(lm_tiny("mla", **LM_CHECKPOINTS["routing"][1]), rng=rng).layers[1].ffn
    r = moe.spec.router
    assert moe.b_router is not None and (r.n_group, r.topk_group, r.norm_topk_prob,
                                         r.routed_scaling_factor) == (2, 1, True, 2.5)


def test_bad_options():
    with pytest.raises(ValueError, match="ffn must be 'swiglu', 'moe', 'gelu_mlp', 'geglu', "
                                         "'relu_mlp' or 'none'"):
        lm_tiny("dense", ffn="mlp")
    with pytest.raises(ValueError, match="n_group must be an integer >= 1, got 0"):
        lm_tiny("moe", n_group=0)
    with pytest.raises(ValueError, match="dt_rank must be None or an integer >= 1, got 0"):
        lm_tiny("hybrid", dt_rank=0)
    with pytest.raises(ValueError, match="RouterSpec: n_group=3 must"):
        LM(lm_tiny("moe", n_group=3), rng=np.random.default_rng(0))


def test_first_k_dense_layers_and_their_width():
    """DeepSeek-V3's first_k_dense_replace: layers i < first_k_dense are dense SwiGLUs of
    dense_d_ff (default d_ff), the others MoE (with moe_every)."""
    model = LM(lm_tiny("mla", n_layers=3, first_k_dense=1, dense_d_ff=20),
               rng=np.random.default_rng(0))
    assert [isinstance(layer.ffn, MoE) for layer in model.layers] == [False, True, True]
    assert model.layers[0].ffn.W1.data.shape == (LM_TINY["d_model"], 20)
    every = LM(lm_tiny("moe", n_layers=4, moe_every=2, first_k_dense=2),
               rng=np.random.default_rng(0))
    assert [isinstance(layer.ffn, MoE) for layer in every.layers] == [False, False, False, True]
    assert every.layers[0].ffn.W1.data.shape == (LM_TINY["d_model"], LM_TINY["d_ff"])
    with pytest.raises(ValueError, match="first_k_dense must be"):
        lm_tiny("moe", first_k_dense=-1)
    with pytest.raises(ValueError, match="dense_d_ff must be None or a positive integer"):
        lm_tiny("moe", dense_d_ff=0)
