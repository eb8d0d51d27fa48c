"""Expert-choice routing (Zhou et al. 2022, arXiv 2202.09368): experts pick tokens.

Math:
    S = softmax(x @ W_r)                    (BT, E) token-to-expert affinities
    I_e = top-C tokens of column S[:, e]    C = min(BT, ceil(c BT / E)), c the capacity factor
    G_e = S[I_e, e]                         gates, not renormalised
    y_n = sum over (e, j) with I_ej = n of G_ej SwiGLU_e(x_n)
Every expert processes exactly C tokens, so the load is balanced by construction (no balance
loss needed); a token may get zero experts or several.

NOT CAUSAL: whether token n is picked depends on the other tokens' scores in the batch,
including later positions, so the output at position t depends on the future. It suits
encoders and training of non-autoregressive models; autoregressive decoding as-is would leak
the future (and see a different batch at inference).

Glossary: BT tokens, D model width, E experts, F expert hidden width, C tokens per expert.
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.fp8 import full_precision
from scratchllm.core.validate import common_float, expect_dout, expect_positive
from scratchllm.moe.experts import ExpertsCache, check_layer, experts_backward, experts_forward


class ExpertChoiceCache(NamedTuple):
    x_shape: tuple
    linear: ops.LinearCache
    softmax: ops.SoftmaxCache
    token_idx: np.ndarray  # (E, C) tokens chosen by each expert, ascending
    gates: np.ndarray  # (E, C)
    experts: ExpertsCache
    ys: np.ndarray  # (E C, D)

    @property
    def experts_per_token(self):
        return np.bincount(self.token_idx.ravel(), minlength=int(np.prod(self.x_shape[:-1])))


def expert_choice_forward(x, w_router, w1, w3, w2, *, capacity_factor=2.0):
    """Each expert takes its top-C tokens by router probability.

    Inputs:  x (..., D), w_router (D, E), w1/w3 (E, D, F), w2 (E, F, D), capacity_factor c > 0.
    Returns: y (..., D).  Cache: ExpertChoiceCache (.token_idx, .experts_per_token).
    """
    x, w_router, w1, w3, w2 = common_float(x, w_router, w1, w3, w2)
    xf, E = check_layer("expert_choice", x, w_router, w1, w3, w2)  # (BT, D)
    BT = xf.shape[0]
    expect_positive("expert_choice", "capacity_factor", capacity_factor)
    C = min(BT, math.ceil(capacity_factor * BT / E))
    with full_precision():  # the gating stays out of FP8 training (DeepSeek-V3 sec. 3.3.1)
        logits, lin = ops.linear_forward(xf, w_router)  # (BT, E)
    S, sm = ops.softmax_forward(logits)  # (BT, E)
    token_idx = np.sort(np.argpartition(-S.T, C - 1, axis=1)[:, :C], axis=1)  # (E, C)
    gates = np.take_along_axis(S.T, token_idx, axis=1)  # (E, C)
    rows = token_idx.ravel()  # (E C,) expert e owns the contiguous block [e C, (e+1) C)
    ys, e_cache = experts_forward(xf[rows], np.arange(E + 1) * C, w1, w3, w2)  # (E C, D)
    y = np.zeros_like(xf)  # (BT, D)
    np.add.at(y, rows, gates.reshape(-1, 1) * ys)  # a token chosen twice accumulates
    cache = ExpertChoiceCache(x.shape, lin, sm, token_idx, gates, e_cache, ys)
    return y.reshape(x.shape), cache


def expert_choice_backward(dy, cache):
    """Math: y_n = sum G_ej ys_ej  ->  dys_ej = G_ej dy_n, dG_ej = <dy_n, ys_ej> with n = I_ej;
    dS[I_ej, e] = dG_ej (zero for unchosen pairs), then softmax and linear backward.
    Reference: Zhou et al. 2022 (arXiv 2202.09368) §3.1."""
    x_shape, lin, sm, token_idx, gates, e_cache, ys = cache
    expect_dout("expert_choice_backward", dy, x_shape, ys.dtype, name="dy")
    E, C = token_idx.shape
    D = x_shape[-1]
    rows = token_idx.ravel()  # (E C,)
    dslot = dy.reshape(-1, D)[rows]  # (E C, D)  fwd: y[rows] += G * ys
    dgates = np.einsum("md,md->m", dslot, ys).reshape(E, C)  # (E, C)
    g_e = experts_backward(gates.reshape(-1, 1) * dslot, e_cache)
    dx = np.zeros((int(np.prod(x_shape[:-1])), D), ys.dtype)  # (BT, D)  fwd: xs = x[rows]
    np.add.at(dx, rows, g_e["xs"])
    dS_T = np.zeros((E, dx.shape[0]), ys.dtype)  # (E, BT)  fwd: G = S^T[e, I_e]
    np.put_along_axis(dS_T, token_idx, dgates, axis=1)
    dlogits = ops.softmax_backward(dS_T.T, sm)["x"]  # (BT, E)  fwd: S = softmax(logits)
    g = ops.linear_backward(dlogits, lin)  # fwd: logits = x @ W_r
    return {"x": (dx + g["x"]).reshape(x_shape), "w_router": g["W"],
            "w1": g_e["w1"], "w3": g_e["w3"], "w2": g_e["w2"]}
