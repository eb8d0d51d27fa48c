"""The fused Numba twins (core/fused.py, attention/rope_heads.py) against their readable `_ref`
twins: float32 to 1e-6, float64 to 1e-12 (relative to the largest entry), the same gradient
keys, the switch, and bad input."""
import inspect
from pathlib import Path

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import rope_heads as rh
from scratchllm.attention.rope import Rope, rope_frequencies
from scratchllm.core import RMSNorm, SwiGLU, fused, ops
from scratchllm.core.fused_adamw import (AdamWStep, adamw_update, adamw_update_ref, sum_squares,
                                         sum_squares_ref)

TOL = {np.float32: 1e-6, np.float64: 1e-12}
PAIRS = ["rmsnorm", "swiglu", "cross_entropy"]


def close(a, b, dtype):
    """Max |a - b| relative to max |b|, below the dtype's tolerance."""
    assert a.dtype == b.dtype == dtype and a.shape == b.shape
    err = np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30)
    assert err < TOL[dtype], err


def inputs(name, rng, dtype):
    """(forward arguments, dout) at odd sizes, in dtype."""
    D, F, V = 13, 11, 17
    x = rng.standard_normal((2, 5, D)).astype(dtype)
    if name == "rmsnorm":
        args = (x, (1 + 0.2 * rng.standard_normal(D)).astype(dtype), 1e-5)
        return args, rng.standard_normal(x.shape).astype(dtype)
    if name == "swiglu":
        W = [(rng.standard_normal(s) * 0.4).astype(dtype) for s in ((D, F), (D, F), (F, D))]
        return (x, *W), rng.standard_normal(x.shape).astype(dtype)
    logits = (3 * rng.standard_normal((2, 5, V))).astype(dtype)
    targets = rng.integers(0, V, (2, 5))
    targets[1, 2] = -100  # an ignored row
    return (logits, targets), np.asarray(0.7, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", PAIRS)
def test_fused_pair_agrees_with_its_readable_ref(name, dtype):
    args, dout = inputs(name, np.random.default_rng(1), dtype)
    fwd, bwd = getattr(fused, f"fused_{name}_forward"), getattr(fused, f"fused_{name}_backward")
    ref_fwd = getattr(fused, f"fused_{name}_forward_ref")
    ref_bwd = getattr(fused, f"fused_{name}_backward_ref")
    y, cache = fwd(*args)
    y_ref, cache_ref = ref_fwd(*args)
    close(np.asarray(y), np.asarray(y_ref), dtype)
    g, g_ref = bwd(dout, cache), ref_bwd(dout, cache_ref)
    assert sorted(g) == sorted(g_ref)
    for key in g:
        close(g[key], g_ref[key], dtype)


@pytest.mark.parametrize("name", PAIRS)
def test_refs_are_the_readable_pairs_with_the_fast_signature(name):
    for half in ("forward", "backward"):
        fast = getattr(fused, f"fused_{name}_{half}")
        ref = getattr(fused, f"fused_{name}_{half}_ref")
        assert ref is getattr(ops, f"{name}_{half}")
        assert inspect.signature(fast) == inspect.signature(ref)
    assert inspect.signature(adamw_update) == inspect.signature(adamw_update_ref)


@pytest.mark.parametrize("name", ["rmsnorm", "swiglu", "cross_entropy", "rope_heads"])
def test_fused_gradient_checks_pass(name):
    result = CASES[name](np.random.default_rng(4))
    for report in result if isinstance(result, list) else [result]:
        assert report.ok, f"{name} {report.label}\n{report}"
    labels = [r.label for r in (result if isinstance(result, list) else [result])]
    assert any("fused" in label for label in labels)


def test_cross_entropy_fully_masked_logits_and_huge_logits():
    logits = np.array([[1e30, 0.0, -1e30], [5.0, -np.inf, 2.0]], np.float32)
    targets = np.array([0, 2])
    loss, cache = fused.fused_cross_entropy_forward(logits, targets)
    ref, ref_cache = ops.cross_entropy_forward(logits, targets)
    assert np.isfinite(loss) and abs(loss - ref) < 1e-6
    d = fused.fused_cross_entropy_backward(np.float32(1), cache)["logits"]
    np.testing.assert_allclose(d, ops.cross_entropy_backward(np.float32(1), ref_cache)["logits"],
                               atol=1e-7)
    assert d[1, 1] == 0


def test_cross_entropy_rejects_bad_targets_like_the_readable_pair():
    with pytest.raises(ValueError, match=r"cross_entropy: targets must lie in \[0, 3\)"):
        fused.fused_cross_entropy_forward(np.zeros((2, 3), np.float32), np.array([0, 3]))


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_heads_give_the_bits_of_split_heads_then_rope(style):
    rng = np.random.default_rng(2)
    B, T, n, Dh = 2, 7, 3, 10
    t = rng.standard_normal((B, T, n * Dh)).astype(np.float32)
    rope = Rope(rope_frequencies(Dh, 500.0)[0], style, 1.3, np.arange(T) + 3)
    heads, cache = rh.rope_heads_forward(t, rope, n)
    ref, ref_cache = rh.rope_heads_forward_ref(t, rope, n)
    assert heads.flags.c_contiguous and heads.shape == (B, n, T, Dh)
    np.testing.assert_array_equal(heads, ref)
    dout = rng.standard_normal(heads.shape).astype(np.float32)
    np.testing.assert_array_equal(rh.rope_heads_backward(dout, cache)["t"],
                                  rh.rope_heads_backward_ref(dout, ref_cache)["t"])


def test_rope_heads_rejects_an_odd_head_dim():
    with pytest.raises(ValueError, match=r"rope_heads: t.shape\[-1\] must be n_heads \* \(an "
                                         r"even Dh\)"):
        rh.rope_heads_forward(np.zeros((1, 2, 9), np.float32),
                              Rope(np.ones(1), "half", 1.0, np.arange(2)), 3)


def test_adamw_kernel_gives_the_bits_of_its_numpy_ref():
    rng = np.random.default_rng(3)
    p = rng.standard_normal(257).astype(np.float32)
    twins = [[p.copy(), np.zeros_like(p), np.zeros_like(p)] for _ in range(2)]
    for t in range(1, 6):
        g = rng.standard_normal(257).astype(np.float32)
        for update, (pp, m, v) in zip((adamw_update, adamw_update_ref), twins):
            update(pp, g, m, v, AdamWStep(lr=3e-3, betas=(0.9, 0.95), eps=1e-8,
                                          weight_decay=0.1, step=t))
    for a, b in zip(*twins):
        assert a.dtype == np.float32
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(twins[0][0], p)


def test_adamw_kernel_refuses_a_non_contiguous_parameter():
    p = np.zeros((4, 4), np.float32).T[:, :3]
    with pytest.raises(ValueError, match="adamw_update: p must be C-contiguous"):
        adamw_update(p, p.copy(), p.copy(), p.copy(),
                     AdamWStep(lr=1e-3, betas=(0.9, 0.9), eps=1e-8, weight_decay=0.0, step=1))


@pytest.mark.parametrize("module, cache_type", [
    (RMSNorm(13), fused.FusedRMSNormCache),
    (SwiGLU(13, 11, rng=np.random.default_rng(0)), fused.FusedSwiGLUCache)])
def test_switch_selects_the_readable_pair_with_the_same_numbers(module, cache_type, monkeypatch):
    x, dy = np.random.default_rng(5).standard_normal((2, 3, 13)).astype(np.float32)
    monkeypatch.delenv("SCRATCHLLM_READABLE", raising=False)
    y, cache = module.forward(x)
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1")
    y_ref, cache_ref = module.forward(x)
    assert isinstance(cache.cache, cache_type) and not isinstance(cache_ref.cache, cache_type)
    assert cache.backward is not cache_ref.backward  # the choice travels with the cache
    close(y, y_ref, np.float32)
    monkeypatch.delenv("SCRATCHLLM_READABLE")  # the backward follows the cache, not the switch
    dx, dx_ref = module.backward(dy, cache), module.backward(dy, cache_ref)  # each its own kind
    close(dx, dx_ref, np.float32)


def test_adamw_kernel_gives_torchs_bits():
    """tests/fixtures/adamw_torch_float32.npz: five torch.optim.AdamW float32 steps
    (tools/make_adamw_fixture.py), lr changing per step. m and v: torch's bits; p: within an
    ulp of the update per step (torch's vectorised float32 sqrt is not IEEE-rounded; ours is)."""
    f = np.load(Path(__file__).resolve().parents[1] / "fixtures" / "adamw_torch_float32.npz")
    p, m, v = f["p0"].copy(), np.zeros_like(f["p0"]), np.zeros_like(f["p0"])
    for t, (lr, g) in enumerate(zip(f["lrs"], f["grads"]), start=1):
        adamw_update(p, g, m, v, AdamWStep(
            lr=float(lr), betas=tuple(f["betas"]), eps=float(f["eps"]),
            weight_decay=float(f["weight_decay"]), step=t))
    np.testing.assert_array_equal(m, f["m"])
    np.testing.assert_array_equal(v, f["v"])
    err = np.abs(p.astype(np.float64) - f["p"]) / (np.abs(f["p"]) + f["lrs"].max())
    assert err.max() < 1e-6 and np.mean(p == f["p"]) > 0.5


def test_sum_squares_matches_its_float64_ref():
    a = np.random.default_rng(6).standard_normal((37, 11)).astype(np.float32) * 1e3
    assert sum_squares(a) == pytest.approx(sum_squares_ref(a), rel=1e-13)
    assert sum_squares(a.T) == pytest.approx(sum_squares_ref(a), rel=1e-13)


def test_fused_sums_equal_numpys_float64_sums_and_max():
    """core/fused_sums.py: the lane-reordered float64 sums equal NumPy's float64 sums to
    round-off, and max_lanes is the exact max (NaN skipped, `lowest` for an empty row), for
    lengths around the 8 chains (7, 8, 9, 1000)."""
    from scratchllm.core.fused_sums import dot64_exact, max_lanes, sum64
    rng = np.random.default_rng(5)
    for n in (0, 1, 7, 8, 9, 1000):
        a, b = (rng.standard_normal(n).astype(np.float32) for _ in range(2))
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert sum64(a) == pytest.approx(a64.sum(), rel=1e-13, abs=1e-13)
        assert dot64_exact(a, b) == pytest.approx(a64 @ b64, rel=1e-13, abs=1e-13)
        lowest = np.float32(-np.inf)
        assert max_lanes(a, lowest) == (a.max() if n else lowest)
    x = np.array([1.0, np.nan, 3.0, -2.0, np.nan, 2.5, 0.0, 1.0, 2.9], np.float32)
    assert max_lanes(x, np.float32(-np.inf)) == np.float32(3.0)
    from numba import types  # the max stays float32 inside the kernels (no float64 exp)
    assert {c.signature.return_type for c in max_lanes.overloads.values()
            if c.signature.args[1] == types.float32} == {types.float32}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_embedding_scatter_gives_the_bits_of_np_add_at(dtype, monkeypatch):
    """core/scatter.py: the embedding's backward adds the rows of repeated ids in the same
    order as np.add.at (the readable twin), so E.grad has the same bits on either switch,
    accumulated into a table that already holds gradient; ids of int32 too."""
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 7, (3, 11)).astype(np.int32)  # 33 lookups of 7 rows: repeats
    dout = rng.standard_normal((3, 11, 5)).astype(dtype)
    start = rng.standard_normal((7, 5)).astype(dtype)
    _, cache = ops.embedding_forward(ids, start)
    got = {}
    for readable in ("0", "1"):
        monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
        table = start.copy()
        assert ops.embedding_backward(dout, cache, into=table)["E"] is table
        got[readable] = table
    want = start.copy()
    for i, row in zip(ids.reshape(-1), dout.reshape(-1, 5)):  # one row at a time, in order
        want[i] += row
    np.testing.assert_array_equal(got["0"], want)
    np.testing.assert_array_equal(got["1"], want)


def test_scatter_leaves_other_layouts_to_numpy():
    """scatter_add_rows does nothing and says so (False) for a table of another dtype than
    the rows or a non-contiguous one; ops.embedding_backward then takes np.add.at."""
    from scratchllm.core.scatter import scatter_add_rows
    rows, ids = np.ones((2, 3), np.float32), np.array([0, 0])
    table = np.zeros((4, 3))
    assert scatter_add_rows(table, ids, rows) is False and not table.any()
    wide = np.zeros((4, 6), np.float32)
    assert scatter_add_rows(wide[:, ::2], ids, rows) is False and not wide.any()
    assert scatter_add_rows(wide[:, :3].copy(), ids, rows) is True
