"""The chunked forms on (batch, head) lanes in threads: lane groups (linear_attention/lanes.py:
the delta rule, and the elementwise steps of linear attention and SSD) and the GLA kernels'
spans of lanes (lanes.run_spans: gla_chunks.py, RWKV-4's scan, SSD's recurrent kernel). The
groups cover every lane once, and each mixer's forward and backward are bit for bit the same
with 1, 2 (cut along the batch) and 3 (cut along the heads) groups or spans."""
import numba
import numpy as np
import pytest

from scratchllm import ssm
from scratchllm.linear_attention import (delta_rule_backward, delta_rule_forward,
                                         gla_attention_backward, gla_attention_forward,
                                         linear_attention_backward, linear_attention_forward,
                                         retnet_attention_backward, retnet_attention_forward,
                                         retnet_gammas)
from scratchllm.linear_attention import (lanes, rwkv4_wkv_scan_backward,
                                         rwkv4_wkv_scan_forward)


@pytest.mark.parametrize("B,H,n,groups", [(4, 4, 2, 2), (1, 4, 2, 2), (2, 3, 3, 3),
                                          (3, 1, 2, 2), (2, 2, 5, 4), (5, 2, 1, 1),
                                          (4, 4, 16, 16), (4, 4, 8, 8), (4, 1, 16, 4)])
def test_lane_groups_cover_every_lane_once(B, H, n, groups):
    seen = np.zeros((B, H), int)
    cut = lanes.lane_groups(B, H, n)
    for idx in cut:
        seen[idx] += 1
        assert np.shares_memory(seen[idx], seen)          # a view, not a copy
    assert (seen == 1).all() and len(cut) == groups


def _mixers(rng, B=2, H=3, T=21, D=5):
    f = np.float32
    q, k, v = (rng.standard_normal((B, H, T, D)).astype(f) for _ in range(3))
    k_unit = k / np.linalg.norm(k, axis=-1, keepdims=True)
    return {
        "linear": (linear_attention_forward, linear_attention_backward, dict(q=q, k=k, v=v)),
        "retnet": (retnet_attention_forward, retnet_attention_backward,
                   dict(q=q, k=k, v=v, gamma=retnet_gammas(H, f))),
        "gla": (gla_attention_forward, gla_attention_backward,
                dict(q=q, k=k, v=v, g=np.log(rng.uniform(0.8, 1, q.shape)).astype(f))),
        "delta": (delta_rule_forward, delta_rule_backward,
                  dict(q=q, k=k_unit, v=v, beta=rng.uniform(0.1, 0.9, (B, H, T)).astype(f),
                       g=np.log(rng.uniform(0.8, 1, (B, H, T))).astype(f))),
        "ssd": (ssm.ssd_forward, ssm.ssd_backward,
                dict(x=np.swapaxes(v, 1, 2).copy(), dt=rng.uniform(0.01, 0.1, (B, T, H)).astype(f),
                     A=-rng.uniform(0.5, 2, H).astype(f),
                     B=rng.standard_normal((B, T, 1, D)).astype(f),
                     C=rng.standard_normal((B, T, 1, D)).astype(f), D=np.ones(H, f))),
    }


@pytest.mark.parametrize("name", ["linear", "retnet", "gla", "delta", "ssd"])
def test_lane_groups_give_the_same_bits(name, monkeypatch):
    fwd, bwd, inputs = _mixers(np.random.default_rng(0))[name]
    calls = {1: 0, 2: 0, 3: 0}                # groups run in threads, per thread count
    real = lanes._one_thread
    dout = None
    runs = []
    for threads in (1, 2, 3):
        numba.set_num_threads(min(threads, 2, numba.config.NUMBA_NUM_THREADS))
        monkeypatch.setattr(lanes, "_threads", lambda n=threads: n)
        monkeypatch.setattr(lanes, "MIN_WORK", 0)
        monkeypatch.setattr(lanes, "_one_thread", lambda fn, idx, n=threads: calls.__setitem__(
            n, calls[n] + 1) or real(fn, idx))
        out, cache = fwd(**inputs, form="chunked", chunk=8)
        if dout is None:
            dout = np.random.default_rng(1).standard_normal(out.shape).astype(out.dtype)
        runs.append((out, bwd(dout, cache)))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    if name in ("linear", "delta", "ssd"):      # lane groups (all: gla_chunks' spans)
        assert calls[1] == 0 and calls[2] >= 2 * 2 and calls[3] >= 2 * 3  # forward, backward
    (out1, g1) = runs[0]
    for out, g in runs[1:]:
        np.testing.assert_array_equal(out, out1)
        assert g.keys() == g1.keys()
        for key in g1:
            np.testing.assert_array_equal(g[key], g1[key], err_msg=key)


def test_span_kernels_give_the_same_bits(monkeypatch):
    """RWKV-4's scan pair and SSD's recurrent kernel on 1, 2 and 3 spans (lanes.run_spans)."""
    rng = np.random.default_rng(5)
    f = np.float32
    w, u = rng.uniform(0.1, 2, 70).astype(f), rng.standard_normal(70).astype(f)
    k, v, dy = (rng.standard_normal((3, 9, 70)).astype(f) for _ in range(3))
    ssd_in = _mixers(rng)["ssd"][2]
    monkeypatch.setattr(lanes, "MIN_WORK", 0)
    real, cut = lanes.spans, []
    monkeypatch.setattr(lanes, "spans", lambda L, n: cut.append(n) or real(L, n))
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(lanes, "_threads", lambda n=threads: n)
        y, cache = rwkv4_wkv_scan_forward(w, u, k, v)
        runs.append([y, *rwkv4_wkv_scan_backward(dy, cache).values(),
                     *ssm.ssd_recurrent(**ssd_in)])
    # rwkv forward, backward (9 tasks: 3 rows x 3 blocks of 32 channels), ssd (6 lanes) per
    # thread count: one span on one thread, else finer than the threads (lanes._tasks)
    assert cut == [1] * 3 + [9, 9, 6] * 2
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b)
