"""Each fast kernel and its readable twin agree, forward and backward, on random valid shapes and
dtypes (hypothesis): the fused Numba twins (rmsnorm, SwiGLU, GeGLU-tanh, cross-entropy), the one-pass RoPE
head split, the GLA score kernel, the RWKV-4 and selective scans, the associative scan and flash
attention against sdpa. Tolerances: 1e-9 relative in float64, 2e-4 in float32."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scratchllm.attention.flash import flash_sdpa_backward, flash_sdpa_forward
from scratchllm.attention.rope import make_rope
from scratchllm.attention.rope_heads import (rope_heads_backward, rope_heads_backward_ref,
                                             rope_heads_forward, rope_heads_forward_ref)
from scratchllm.attention.sdpa import sdpa_backward, sdpa_forward
from scratchllm.core import fused, fused_geglu, ops
from scratchllm.linear_attention.gla_scores import (gla_scores_backward, gla_scores_backward_ref,
                                                    gla_scores_forward, gla_scores_forward_ref)
from scratchllm.linear_attention.rwkv_scan import (rwkv4_wkv_scan_backward,
                                                   rwkv4_wkv_scan_backward_ref,
                                                   rwkv4_wkv_scan_forward,
                                                   rwkv4_wkv_scan_forward_ref)
from scratchllm.specs import Mask, RopeSpec
from scratchllm.ssm.assoc_scan import (associative_scan_backward, associative_scan_forward,
                                       associative_scan_forward_ref)
from scratchllm.ssm.scan import (selective_scan_backward, selective_scan_backward_ref,
                                 selective_scan_forward, selective_scan_forward_ref)

FEW = settings(max_examples=10, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.slow  # the exhaustive tier: `python -m pytest -q -m slow`
small = st.integers(1, 5)


def rmsnorm(d, r, dt):
    x = r.standard_normal((d(small), d(small), d(st.integers(1, 40)))).astype(dt)
    return (x, (1 + 0.1 * r.standard_normal(x.shape[-1])).astype(dt)), {}


def swiglu(d, r, dt):
    D, F = d(st.integers(1, 24)), d(st.integers(1, 24))
    w = [(r.standard_normal(s) / np.sqrt(s[0])).astype(dt) for s in ((D, F), (D, F), (F, D))]
    return (r.standard_normal((d(st.integers(1, 9)), D)).astype(dt), *w), {}


def cross_entropy(d, r, dt):
    N, V = d(st.integers(1, 9)), d(st.integers(2, 50))
    targets = r.integers(0, V, N)
    targets[r.uniform(size=N) < 0.2] = -100  # some ignored rows
    targets[0] = 0
    return (3 * r.standard_normal((N, V)).astype(dt), targets), {}


def rope_heads(d, r, dt):
    B, T, H, half = d(small), d(st.integers(1, 9)), d(small), d(st.integers(1, 4))
    rope = make_rope(RopeSpec(), 2 * half, np.arange(T))
    return (r.standard_normal((B, T, H * 2 * half)).astype(dt), rope, H), {}


def gla_scores(d, r, dt):
    C, Dk = d(st.integers(1, 12)), d(st.integers(1, 6))
    lead = (d(small), d(small))
    b = np.cumsum(-r.uniform(0, 0.5, lead + (C, Dk)), axis=-2).astype(dt)  # log decays
    q, k = r.standard_normal((2,) + lead + (C, Dk)).astype(dt)
    return (q, k, b), {}


def rwkv4_scan(d, r, dt):
    B, T, D = d(small), d(st.integers(1, 12)), d(st.integers(1, 8))
    w, u = np.exp(r.uniform(-2, 1, D)).astype(dt), r.standard_normal(D).astype(dt)
    k, v = r.standard_normal((2, B, T, D)).astype(dt)
    return (w, u, k, v), {}


def selective_scan(d, r, dt):
    B, T, dd, N = d(small), d(st.integers(1, 12)), d(st.integers(1, 40)), d(small)
    arrays = (r.standard_normal((B, T, dd)), r.uniform(0.05, 1, (B, T, dd)),
              -r.uniform(0.2, 2, (dd, N)), r.standard_normal((B, T, N)),
              r.standard_normal((B, T, N)), r.standard_normal(dd))
    return tuple(a.astype(dt) for a in arrays), {}


def assoc_scan(d, r, dt):
    shape = (d(small), d(st.integers(1, 33)), d(small))
    return (r.uniform(0.1, 1, shape).astype(dt), r.standard_normal(shape).astype(dt)), {}


def attention(d, r, dt):
    B, Hkv, G, T, Dh = d(small), d(st.integers(1, 3)), d(st.integers(1, 3)), d(
        st.integers(1, 20)), d(st.integers(1, 8))
    q = r.standard_normal((B, Hkv * G, T, Dh)).astype(dt)
    k, v = r.standard_normal((2, B, Hkv, T, Dh)).astype(dt)
    return (q, k, v), {"mask": Mask(causal=d(st.booleans()))}


def _flash(q, k, v, mask):
    return flash_sdpa_forward(q, k, v, mask=mask, block=4)


TWINS = {  # name: (fast (forward, backward), readable (forward, backward), inputs)
    "rmsnorm": ((fused.fused_rmsnorm_forward, fused.fused_rmsnorm_backward),
                (ops.rmsnorm_forward, ops.rmsnorm_backward), rmsnorm),
    "swiglu": ((fused.fused_swiglu_forward, fused.fused_swiglu_backward),
               (ops.swiglu_forward, ops.swiglu_backward), swiglu),
    "geglu_tanh": ((fused_geglu.fused_geglu_forward, fused_geglu.fused_geglu_backward),
                   (fused_geglu.geglu_tanh_forward, fused_geglu.gelu.geglu_backward), swiglu),
    "cross_entropy": ((fused.fused_cross_entropy_forward, fused.fused_cross_entropy_backward),
                      (ops.cross_entropy_forward, ops.cross_entropy_backward), cross_entropy),
    "rope_heads": ((rope_heads_forward, rope_heads_backward),
                   (rope_heads_forward_ref, rope_heads_backward_ref), rope_heads),
    "gla_scores": ((gla_scores_forward, gla_scores_backward),
                   (gla_scores_forward_ref, gla_scores_backward_ref), gla_scores),
    "rwkv4_wkv_scan": ((rwkv4_wkv_scan_forward, rwkv4_wkv_scan_backward),
                       (rwkv4_wkv_scan_forward_ref, rwkv4_wkv_scan_backward_ref), rwkv4_scan),
    "selective_scan": ((selective_scan_forward, selective_scan_backward),
                       (selective_scan_forward_ref, selective_scan_backward_ref),
                       selective_scan),
    "associative_scan": ((associative_scan_forward, associative_scan_backward),
                         (associative_scan_forward_ref, associative_scan_backward), assoc_scan),
    "flash_sdpa": ((_flash, flash_sdpa_backward), (sdpa_forward, sdpa_backward), attention),
}


def close(a, b, dtype):
    tol = 1e-9 if dtype == np.float64 else 2e-4
    return np.allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.abs(b).max(initial=0))))


@pytest.mark.parametrize("name", sorted(TWINS))
@FEW
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 999))
def test_the_fast_twin_equals_the_readable_one_forward_and_backward(name, data, dtype, seed):
    (fast, fast_back), (readable, readable_back), inputs = TWINS[name]
    r = np.random.default_rng(seed)
    args, kwargs = inputs(data.draw, r, dtype)
    y, cache = fast(*args, **kwargs)
    y_ref, cache_ref = readable(*args, **kwargs)
    assert y.dtype == y_ref.dtype == dtype and close(y, y_ref, dtype)
    dy = r.standard_normal(np.shape(y)).astype(dtype)
    g, g_ref = fast_back(dy, cache), readable_back(dy, cache_ref)
    assert sorted(g) == sorted(g_ref)
    for key in g_ref:
        assert close(g[key], g_ref[key], dtype), key
