"""The drills of scratchllm.moe: the balance loss backward, the top-k router (with the
chapter's worked routing table), the MoE layer's forward, DeepSeek-V3's per-sequence balance
loss backward."""
import numpy as np

from scratchllm import moe
from scratchllm.core import ops
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
from scratchllm.teach.drills.bank._common import assert_close, drill, gradient_check, seeded_rng


# ---------------------------------------------------------------------------- balance loss
def _routing(N=12, E=5, K=2):
    r = seeded_rng(9)
    logits = r.standard_normal((N, E))
    topk_idx = np.argsort(-logits, axis=1)[:, :K]
    return logits, topk_idx


def _balance_of_logits(logits, topk_idx):
    probs, sm = ops.softmax_forward(logits)
    loss, bl = moe.balance_loss_forward(probs, topk_idx)
    return loss, (sm, bl)


@drill("balance_loss_backward", 15, "scratchllm/moe/losses.py", '''
    def balance_loss_backward(dloss, logits, topk_idx):
        """Backward of the Switch balance loss L = E * sum_i f_i P_i through the router softmax.

        logits (N, E); topk_idx (N, K) ints: the experts each token was sent to.
        p = softmax(logits);  P_i = mean_n p_ni;  f_i = (slots of expert i) / (N K), a constant.
        Return dlogits (N, E) = dloss * dL/ds.
        Reach: dL/ds_nj = (E / N) p_nj (f_j - sum_i f_i p_ni)
        """
''', [
    ("gradient check", lambda fn: gradient_check(
        _balance_of_logits, lambda d, kw: fn(d, **kw), ["logits"],
        logits=_routing()[0], topk_idx=_routing()[1])),
    ("each row sums to zero (softmax shift invariance)", lambda fn: _balance_rows(fn)),
])
def _balance_loss_backward(dloss, logits, topk_idx):
    _, (sm, bl) = _balance_of_logits(logits, topk_idx)
    dprobs = moe.balance_loss_backward(dloss, bl)["probs"]
    return ops.softmax_backward(dprobs, sm)["x"]


def _balance_rows(fn):
    logits, topk_idx = _routing()
    d = fn(np.array(1.3), logits, topk_idx)
    worst = np.abs(d.sum(axis=1)).max() / max(np.abs(d).max(), 1e-300)
    if not worst < 1e-12:
        raise AssertionError(f"a row of dlogits sums to {worst:.1e} x its largest entry, not 0")
    return f"max |row sum| / max |d| = {worst:.0e}"


# ---------------------------------------------------------------------------- router
@drill("topk_router_forward", 10, "scratchllm/moe/router.py", '''
    def topk_router_forward(x, w_router, k):
        """Mixtral's top-k router: logits s = x @ w_router (N, E); p = softmax(s); choose the
        k largest p per token (descending); gates = the chosen p renormalised to sum to 1.

        x (N, D); w_router (D, E).  Return (gates (N, k) float, topk_idx (N, k) int).
        Reach: gates = softmax over the chosen logits only.
        """
''', [
    ("equals scratchllm.moe.router_forward", lambda fn: _router_vs_library(fn, 2)),
    ("k = E: the gates are the full softmax", lambda fn: _router_vs_library(fn, 5)),
    ("the chapter's worked table (4 tokens, 4 experts, top-2)", lambda fn: _worked_table(fn)),
])
def _topk_router_forward(x, w_router, k):
    spec = RouterSpec(n_experts=w_router.shape[1], top_k=k)
    (gates, topk_idx, _, _), _ = moe.router_forward(x, w_router, spec=spec)
    return gates, topk_idx


def _router_vs_library(fn, k):
    r = seeded_rng(10)
    x, w = r.standard_normal((9, 6)), r.standard_normal((6, 5))
    gates, idx = fn(x, w, k)
    want_g, want_i = _topk_router_forward(x, w, k)
    if not np.array_equal(np.asarray(idx), want_i):
        raise AssertionError(f"topk_idx differs: got {np.asarray(idx)[0]}, want {want_i[0]} "
                             "(row 0; descending order of probability)")
    return assert_close(gates, want_g, what="gates")


WORKED_PROBS = np.array([[0.55, 0.05, 0.32, 0.08], [0.10, 0.60, 0.10, 0.20],
                         [0.50, 0.10, 0.30, 0.10], [0.45, 0.05, 0.40, 0.10]])  # (4 tokens, 4 E)


def _worked_table(fn):
    """Logits log p through an identity router give back p; the table's choices, gates, loads."""
    gates, idx = fn(np.log(WORKED_PROBS), np.eye(4), 2)
    gates, idx = np.asarray(gates), np.asarray(idx)
    if idx.tolist() != [[0, 2], [1, 3], [0, 2], [0, 2]]:
        raise AssertionError(f"topk_idx {idx.tolist()}, the table has E0 E2, E1 E3, E0 E2, E0 E2")
    want = [[0.55 / 0.87, 0.32 / 0.87], [0.75, 0.25], [0.5 / 0.8, 0.3 / 0.8],
            [0.45 / 0.85, 0.4 / 0.85]]
    assert_close(gates, np.array(want), what="gates")
    loads = np.bincount(idx.ravel(), minlength=4)
    half_up = np.floor(gates * 100 + 0.5) / 100  # 0.625 -> 0.63, as the chapter prints it
    rows = "; ".join(f"t{t} -> E{i[0]} E{i[1]} gates {g[0]:.2f} {g[1]:.2f}"
                     for t, (i, g) in enumerate(zip(idx, half_up)))
    return f"{rows}; loads {' '.join(map(str, loads))}"


# ---------------------------------------------------------------------------- moe layer
def _moe_inputs(E=4, D=6, F=5):
    r = seeded_rng(17)
    return dict(x=r.standard_normal((9, D)), w_router=r.standard_normal((D, E)),
                w1=r.standard_normal((E, D, F)), w3=r.standard_normal((E, D, F)),
                w2=r.standard_normal((E, F, D)))


@drill("moe_forward", 20, "scratchllm/moe/layer.py (the chapter's MoELayer.forward)", '''
    def moe_forward(x, w_router, w1, w3, w2, k):
        """A top-k Mixture-of-Experts layer of SwiGLU experts (Mixtral), no capacity limit.

        x (N, D); w_router (D, E); w1, w3 (E, D, F); w2 (E, F, D).  Return y (N, D).
        Reach: p = softmax(x w_router); per token the k largest p, gates g renormalised
               over them;  expert_i(x) = (silu(x w1[i]) * (x w3[i])) w2[i];
               y_n = sum over the chosen i of g_ni expert_i(x_n)
        """
''', [
    ("equals scratchllm.moe.moe_forward (E=4, k=2)", lambda fn: _moe_vs_library(fn)),
    ("k = E: the softmax-weighted mixture of every expert", lambda fn: _moe_dense(fn)),
    ("k = 1: the argmax expert, gate 1", lambda fn: _moe_top1(fn)),
])
def _moe_forward(x, w_router, w1, w3, w2, k):
    spec = MoESpec(RouterSpec(n_experts=w1.shape[0], top_k=k), ExpertsSpec(d_ff=w1.shape[2]))
    return moe.moe_forward(x, moe.MoEWeights(w_router, None, w1, w3, w2), spec=spec)[0].y


def _expert_outputs(x, w1, w3, w2):
    """(E, N, D): every expert on every token, by the library's swiglu pair."""
    return np.stack([ops.swiglu_forward(x, w1[i], w3[i], w2[i])[0] for i in range(len(w1))])


def _moe_vs_library(fn):
    inp = _moe_inputs()
    return assert_close(fn(k=2, **inp), _moe_forward(k=2, **inp), what="y")


def _moe_dense(fn):
    inp = _moe_inputs()
    p = ops.softmax_forward(inp["x"] @ inp["w_router"])[0]  # (N, E)
    ys = _expert_outputs(inp["x"], inp["w1"], inp["w3"], inp["w2"])  # (E, N, D)
    return assert_close(fn(k=4, **inp), np.einsum("ne,end->nd", p, ys), what="y (k = E)")


def _moe_top1(fn):
    inp = _moe_inputs()
    best = np.argmax(inp["x"] @ inp["w_router"], axis=1)  # (N,)
    ys = _expert_outputs(inp["x"], inp["w1"], inp["w3"], inp["w2"])  # (E, N, D)
    return assert_close(fn(k=1, **inp), ys[best, np.arange(len(best))], what="y (k = 1)")


# ---------------------------------------------------------------------------- sequence loss
def _seq_inputs(B=3, T=6, E=5, K=2):
    r = seeded_rng(18)
    scores = r.uniform(0.05, 0.95, (B, T, E))  # sigmoid affinities, not normalised
    return dict(scores=scores, topk_idx=np.argsort(-scores, axis=-1)[..., :K])


@drill("sequence_balance_loss_backward", 15, "scratchllm/moe/losses.py", '''
    def sequence_balance_loss_backward(dloss, scores, topk_idx):
        """DeepSeek-V3's balance loss per sequence: for each sequence b of T tokens,
        s'_ti = s_ti / sum_j s_tj;  f_i = E / (K T) #{t : i in topk_idx[b, t]} (a constant);
        P_i = mean_t s'_ti;  L_b = sum_i f_i P_i;  L = mean_b L_b.

        scores (B, T, E) > 0; topk_idx (B, T, K) ints.  Return dscores (B, T, E) = dloss dL/ds.
        Reach: g = dloss f_b / (B T) on every token of sequence b (dL/ds');
               ds_tj = (g_j - sum_i g_i s'_ti) / sum_i s_ti
        """
''', [
    ("gradient check", lambda fn: gradient_check(
        moe.sequence_balance_loss_forward, lambda d, kw: fn(d, **kw), ["scores"],
        **_seq_inputs())),
    ("L is scale invariant per token: each row of dscores is orthogonal to s",
     lambda fn: _seq_rows(fn)),
])
def _sequence_balance_loss_backward(dloss, scores, topk_idx):
    _, cache = moe.sequence_balance_loss_forward(scores, topk_idx)
    return moe.sequence_balance_loss_backward(np.asarray(dloss, scores.dtype), cache)["scores"]


def _seq_rows(fn):
    inp = _seq_inputs()
    ds = np.asarray(fn(1.0, **inp))
    dots = np.abs(np.sum(ds * inp["scores"], axis=-1)).max()  # s -> c s leaves L unchanged
    if not dots < 1e-12 * max(np.abs(ds).max(), 1e-300):
        raise AssertionError(f"sum_j ds_tj s_tj should be 0 (scale invariance), got {dots:.2e}")
    return f"max |<ds_t, s_t>| {dots:.1e}"
