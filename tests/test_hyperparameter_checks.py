"""A hyperparameter outside its domain (NaN, inf, a negative epsilon, a string, an axis the
input does not have) is refused up front with an error naming the function and the argument;
before, these gave NaN outputs, numpy's own messages, or Numba typing errors."""
import numpy as np
import pytest

from scratchllm.attention.flash import flash_sdpa_forward
from scratchllm.attention.rope import Rope, rope_forward, rope_frequencies
from scratchllm.attention.rope_heads import rope_heads_forward
from scratchllm.attention.sdpa import sdpa_forward
from scratchllm.attention.sparse import topk_sparse_attention_forward
from scratchllm.core.fused import fused_rmsnorm_forward
from scratchllm.core.norms import layernorm_forward
from scratchllm.core.ops import log_softmax_forward, rmsnorm_forward, softmax_forward

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4))
Q = RNG.standard_normal((1, 2, 3, 4))
INV = rope_frequencies(4)[0]


@pytest.mark.parametrize("eps", [-1.0, 0.0, np.nan, np.inf, "1e-5", None])
@pytest.mark.parametrize("fn, call", [
    ("rmsnorm", lambda eps: rmsnorm_forward(X, np.ones(4), eps)),
    ("rmsnorm", lambda eps: fused_rmsnorm_forward(X, np.ones(4), eps)),
    ("layernorm", lambda eps: layernorm_forward(X, np.ones(4), None, eps))])
def test_norm_eps_must_be_a_finite_positive_number(fn, call, eps):
    with pytest.raises((ValueError, TypeError), match=rf"^{fn}: eps must be a (finite|real)"):
        call(eps)


@pytest.mark.parametrize("axis", [3, -4, 1.5, "0", None])
@pytest.mark.parametrize("fn, pair", [("softmax", softmax_forward),
                                      ("log_softmax", log_softmax_forward)])
def test_softmax_axis_must_be_an_axis_of_x(fn, pair, axis):
    with pytest.raises((ValueError, TypeError), match=rf"^{fn}: axis must be"):
        pair(X, axis)
    np.testing.assert_allclose(softmax_forward(X, -3)[0].sum(axis=0), 1.0, rtol=1e-15)


@pytest.mark.parametrize("scale", [np.nan, np.inf, -np.inf, "a", np.array([1.0, 2.0])])
@pytest.mark.parametrize("fn, call", [
    ("sdpa", lambda s: sdpa_forward(Q, Q, Q, None, s)),
    ("flash_sdpa", lambda s: flash_sdpa_forward(Q, Q, Q, scale=s)),
    ("topk_sparse_attention", lambda s: topk_sparse_attention_forward(
        Q, Q, Q, np.zeros((1, 3, 1), np.int64), scale=s))])
def test_attention_scale_must_be_finite(fn, call, scale):
    with pytest.raises((ValueError, TypeError), match=rf"^{fn}: scale must be a (finite|real)"):
        call(scale)


@pytest.mark.parametrize("af", [np.nan, np.inf, 0.0, -1.0, "a"])
def test_rope_attention_factor_must_be_finite_and_positive(af):
    with pytest.raises((ValueError, TypeError), match=r"^rope: attention_factor must be"):
        rope_forward(Q, Rope(INV, "half", af, np.arange(3)))
    with pytest.raises((ValueError, TypeError), match=r"^rope: attention_factor must be"):
        rope_heads_forward(X[:, :, :4], Rope(INV, "half", af, np.arange(3)), 1)
