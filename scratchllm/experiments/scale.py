"""Why attention scales scores by Dh^-1/2, why attention without positions is permutation
equivariant, and what RMSNorm saves over LayerNorm.

    q, k with unit-variance entries: q.k = sum_d q_d k_d has variance Dh (std sqrt(Dh))
    (Vaswani et al. 2017, arXiv 1706.03762, footnote 4); unscaled, the softmax over T keys
    saturates as Dh grows (the largest probability -> 1); times Dh^-1/2 it stays put.
    No positions: attn(P x) = P attn(x) for a permutation P of the tokens (no causal mask).
    RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) skips the mean: one reduction fewer.
"""
import timeit

import numpy as np

from scratchllm.attention import Attention
from scratchllm.core.norms import layernorm_forward
from scratchllm.core.ops import rmsnorm_forward, softmax_forward
from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.specs import AttentionSpec, Mask

_NAME = "scale"
_CLAIM = ("q.k of unit-variance entries has std sqrt(Dh), so unscaled softmax saturates as Dh "
         "grows and Dh^-1/2 keeps it stable; attention without positions is permutation "
         "equivariant; RMSNorm is cheaper than LayerNorm")
DHS = (16, 64, 256, 1024)


def _median_seconds(fn, repeats):
    fn()  # warm up
    return float(np.median(timeit.repeat(fn, number=1, repeat=repeats)))


def _run(mode, seed):
    rng = np.random.default_rng(seed)
    n, T = pick(mode, 64, 512, 2048), 128
    qk_std, max_prob = {}, {}
    for dh in DHS:
        q = rng.standard_normal((n, dh))
        k = rng.standard_normal((n, T, dh))
        s = np.einsum("nd,ntd->nt", q, k)  # (n, T) unscaled scores
        qk_std[dh] = float(s.std())
        max_prob[dh] = {"unscaled": float(softmax_forward(s)[0].max(-1).mean()),
                        "scaled": float(softmax_forward(s * dh ** -0.5)[0].max(-1).mean())}
    D = 32
    spec = AttentionSpec(n_heads=4, n_kv_heads=4, rope=None, mask=Mask(causal=False))
    attn = Attention(D, spec, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 16, D))
    perm = rng.permutation(16)
    equivariance_err = float(np.abs(attn.forward(x[:, perm])[0] - attn.forward(x)[0][:, perm])
                             .max())
    rows, dm = pick(mode, 256, 4096, 16384), 512
    xn = rng.standard_normal((rows, dm)).astype(np.float32)
    g, b = np.ones(dm, np.float32), np.zeros(dm, np.float32)
    repeats = pick(mode, 3, 20, 50)  # the readable NumPy pairs, both (no Numba twin)
    rmsnorm_s = _median_seconds(lambda: rmsnorm_forward(xn, g), repeats)
    layernorm_s = _median_seconds(lambda: layernorm_forward(xn, g, b), repeats)
    lines = [f"{'Dh':>6}{'std q.k':>10}{'sqrt(Dh)':>10}{'max p unscaled':>16}{'max p scaled':>14}"]
    lines += [f"{dh:>6}{qk_std[dh]:>10.2f}{dh ** 0.5:>10.2f}{max_prob[dh]['unscaled']:>16.3f}"
              f"{max_prob[dh]['scaled']:>14.3f}" for dh in DHS]
    lines.append(f"equivariance error (no positions, no mask): {equivariance_err:.2e}")
    lines.append(f"RMSNorm {rmsnorm_s * 1e3:.3f} ms, LayerNorm {layernorm_s * 1e3:.3f} ms "
                 f"({rows} x {dm} float32, NumPy forwards, median of {repeats})")
    ratio = max(qk_std[dh] / dh ** 0.5 for dh in DHS)
    verdict = (f"std(q.k)/sqrt(Dh) is {ratio:.2f} at most; unscaled max prob goes "
               f"{max_prob[DHS[0]]['unscaled']:.2f} -> {max_prob[DHS[-1]]['unscaled']:.2f} from "
               f"Dh={DHS[0]} to {DHS[-1]}, scaled {max_prob[DHS[0]]['scaled']:.2f} -> "
               f"{max_prob[DHS[-1]]['scaled']:.2f}; equivariance error {equivariance_err:.1e}; "
               f"LayerNorm/RMSNorm time {layernorm_s / rmsnorm_s:.2f}x")
    metrics = dict(qk_std=qk_std, max_prob=max_prob, equivariance_err=equivariance_err,
                   rmsnorm_s=rmsnorm_s, layernorm_s=layernorm_s)
    config = dict(head_dims=list(DHS), keys=T, samples=n, norm_rows=rows, norm_width=dm,
                  repeats=repeats)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax1, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    ax1.loglog(DHS, [m["qk_std"][d] for d in DHS], "o-", label="std(q.k)")
    ax1.loglog(DHS, [d ** 0.5 for d in DHS], "--", c="gray", label="sqrt(Dh)")
    ax1.set(xlabel="Dh", title="score spread")
    ax1.legend()
    for key in ("unscaled", "scaled"):
        ax2.semilogx(DHS, [m["max_prob"][d][key] for d in DHS], "o-", label=key)
    ax2.set(xlabel="Dh", ylabel="mean max softmax prob", title="saturation (T=128)")
    ax2.legend()


SCALE = Experiment(_NAME, _CLAIM, _run, _figure)
