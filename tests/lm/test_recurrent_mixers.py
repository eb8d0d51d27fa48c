"""The recurrent mixers in the LM: every letter of the layer pattern builds its Module, whole
models train-check (grads case lm_recurrent), cached decoding == full recompute, the sizing
arithmetic counts exactly the model's Params and a state that does not grow with context."""
import numpy as np
import pytest

from grads.cases import CASES, LM_TINY, lm_tiny
from scratchllm.lm import LM, preset
from scratchllm.specs import from_flat
from scratchllm.teach import sizing

PATTERNS = ["LRGD", "SAWA"]
V = LM_TINY["vocab_size"]


def test_whole_model_gradients_of_every_param():
    reports = CASES["lm_recurrent"](np.random.default_rng(7))
    for report in reports:
        assert report.ok, f"\n{report}"
    assert len(reports) == 3  # LRGD; SAWA and its Mamba-2 A_log path
    for pattern, group in (("LRGD", reports[:1]), ("SAWA", reports[1:])):
        model = LM(lm_tiny("dense", layer_pattern=pattern, n_layers=4),
                   rng=np.random.default_rng(0))
        checked = {row.input for r in group for row in r.rows}
        assert checked == {n for n, _ in model.named_parameters()}, pattern


@pytest.mark.parametrize("pattern", PATTERNS)
def test_cached_decoding_equals_full_recompute(pattern):
    rng = np.random.default_rng(3)
    model = LM(lm_tiny("dense", layer_pattern=pattern, n_layers=4), rng=rng, dtype=np.float64)
    T = 9
    ids = rng.integers(0, V, (2, T))
    full, _ = model.forward(ids)  # (2, T, V)
    state = model.init_state(batch=2, max_len=T)
    for t in range(T):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], rtol=0,
                                   atol=1e-9, err_msg=f"{pattern}: position {t}")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_prefill_then_decode_equals_full_recompute(pattern):
    """The recurrent mixers have no prefill of their own: the block decodes the prompt."""
    rng = np.random.default_rng(4)
    model = LM(lm_tiny("dense", layer_pattern=pattern, n_layers=4), rng=rng, dtype=np.float64)
    ids = rng.integers(0, V, (2, 8))
    full, _ = model.forward(ids)  # (2, 8, V)
    state = model.init_state(batch=2, max_len=8)
    np.testing.assert_allclose(model.prefill(ids[:, :5], state), full[:, :5], rtol=0,
                               atol=1e-9)
    for t in range(5, 8):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], rtol=0,
                                   atol=1e-9, err_msg=f"{pattern}: position {t}")


@pytest.mark.parametrize("name", ["linear", "deltanet", "mamba2", "rwkv"])
def test_sizing_counts_the_params_and_a_fixed_state(name):
    cfg = preset(name, d_model=16, n_heads=4, d_ff=12, vocab_size=23, d_state=4)
    model = LM(cfg, rng=np.random.default_rng(0))
    a = from_flat(**cfg.to_dict())
    assert sizing.parameters(a).total == model.n_params()
    state = model.init_state(batch=1, max_len=10)
    numbers = sum(np.size(a) for s in state for a in (s if isinstance(s, tuple) else [s]))
    per = sizing.kv_cache(a, context=4096, dtype="fp32")
    assert per.bytes_per_token == 0 and per.state_bytes == 4 * numbers
    assert sizing.kv_cache(a, context=131072, dtype="fp32").bytes == per.bytes


@pytest.mark.parametrize("name", ["linear", "deltanet", "mamba2", "rwkv"])
def test_compare_sizes_count_the_full_presets(name):
    from scratchllm.cli import compare
    cfg = preset(name)
    total, active, per_token = compare.sizes(from_flat(**cfg.to_dict()))
    assert total == active == LM(cfg, rng=np.random.default_rng(0)).n_params()
    assert per_token[1] < per_token[0]  # a fixed state costs less per token at 128k than at 4k
