"""A mixture of experts between the dense model of its active size and that of its total size
(Shazeer et al. 2017, arXiv 1701.06538; Fedus et al. 2021, arXiv 2101.03961; Jiang et al.
2024, Mixtral, arXiv 2401.04088), and fine-grained experts at equal FLOPs (Dai et al. 2024,
DeepSeekMoE, arXiv 2401.06066 §3.1), trained on the same byte batches of the bundled corpus:

    dense_active  SwiGLU FFN of width k F         (the MoE's active FFN per token)
    moe           E experts of width F, top-k     (total FFN E F, active k F)
    dense_total   SwiGLU FFN of width E F         (the MoE's total FFN, run for every token)
    fine          m E experts of width F / m, top-(m k): the moe's initial weights cut by
                  moe/finegrained.py split_experts (the same function at step 0; same FLOPs
                  and parameters), trained from there

Why `compare` shows the MoE *worse* than dense at equal active parameters after 100 steps:
each expert receives only k/E of the tokens, so each expert's weights get a quarter of the
gradient signal a dense FFN of the same active width gets per step (E = 8, k = 2), and the
router has to learn which expert a token goes to before the experts can differ; until then
the MoE is a dense model of its active width trained on fewer tokens per weight. The extra
capacity pays only once the dense model of its active size runs out of it. The experiment
reads the validation loss at several steps, so the gap moe - dense_active is measured at the
start (where compare stopped) and at the end. Metrics: val_loss[variant] (the final
validation loss), val_curve[variant] ([step, loss] pairs), params[variant] (total, active).
"""
import numpy as np

from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.experiments.loop import train_curve
from scratchllm.lm import LM
from scratchllm.moe import split_experts
from scratchllm.specs import preset
from scratchllm.teach import sizing
from scratchllm.train import corpus
from scratchllm.train.settings import Settings

_NAME = "moe"
_CLAIM = ("an MoE's loss sits between the dense model of its active size and the dense model "
          "of its total size at equal tokens; fine-grained experts (m E experts, m k active) "
          "do at least as well at equal FLOPs")
MOE_VARIANTS = ("dense_active", "moe", "dense_total", "fine")
E, K, M = 8, 2, 2  # experts, top-k, fine-grained split factor


def configs(d_model, n_layers, F):
    """The four ModelConfigs (byte vocabulary, 4 MHA heads) of one size: expert width F."""
    base = dict(vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=4, n_kv_heads=4)
    moe = dict(ffn="moe", balance_coef=0.01, z_coef=0.001)
    return {"dense_active": preset("dense", **base, d_ff=K * F),
            "moe": preset("moe", **base, **moe, n_experts=E, top_k=K, d_ff=F),
            "dense_total": preset("dense", **base, d_ff=E * F),
            "fine": preset("moe", **base, **moe, n_experts=M * E, top_k=M * K, d_ff=F // M)}


def fine_from(moe_model, fine_cfg, seed):
    """An LM of fine_cfg holding moe_model's weights, each MoE layer cut by split_experts
    (m = M): the same function as moe_model."""
    fine = LM(fine_cfg, rng=np.random.default_rng(seed), dtype=moe_model.dtype)
    for src, dst in zip(moe_model.layers, fine.layers):
        w, _ = split_experts(src.ffn.weights(), src.ffn.spec, M)
        for name, p in dst.ffn.named_parameters():
            p.data[...] = getattr(w, name)
    coarse = {n: p for n, p in moe_model.named_parameters() if ".ffn." not in n}
    for name, p in fine.named_parameters():
        if name in coarse:
            p.data[...] = coarse[name].data
    return fine


def _run(mode, seed):
    steps = pick(mode, 4, 120, 600)
    d_model, n_layers, F = pick(mode, 16, 64, 64), pick(mode, 1, 2, 2), pick(mode, 8, 64, 64)
    batch, seq = pick(mode, 2, 8, 8), pick(mode, 16, 32, 64)
    train_ids, val_ids = byte_corpus(pick(mode, 50_000, None, None))
    s = Settings(steps=steps, batch_size=batch, seq_len=seq, lr=4e-3, warmup=min(30, steps),
                 eval_every=steps + 1, seed=seed, threads=1)
    eval_set = corpus.eval_batches(val_ids, 16, seq, pick(mode, 256, 4096, 32768))
    cfgs = configs(d_model, n_layers, F)
    val_curve, params = {}, {}
    for name in MOE_VARIANTS:
        model = LM(cfgs[name], rng=np.random.default_rng(seed), dtype=np.float32)
        if name == "fine":  # the moe's initial weights, cut
            model = fine_from(LM(cfgs["moe"], rng=np.random.default_rng(seed)), cfgs[name],
                              seed)
        val_curve[name], _ = train_curve(model, s, train_ids, eval_set, pick(mode, 2, 4, 10),
                                         desc=name)
        p = sizing.parameters(cfgs[name])
        params[name] = {"total": int(p.total), "active": int(p.active)}
    val_loss = {v: val_curve[v][-1][1] for v in MOE_VARIANTS}
    lines = [f"{'variant':<13}{'params':>10}{'active':>10}{'val loss':>10}   curve (step: loss)"]
    lines += [f"{v:<13}{params[v]['total']:>10,}{params[v]['active']:>10,}{val_loss[v]:>10.3f}"
              f"   " + " ".join(f"{st}:{lo:.3f}" for st, lo in val_curve[v]) for v in MOE_VARIANTS]
    verdict = _verdict(val_loss, val_curve)
    config = dict(steps=steps, d_model=d_model, n_layers=n_layers, n_experts=E, top_k=K,
                  expert_d_ff=F, split=M, batch_size=batch, seq_len=seq, lr=s.lr,
                  tokens="bytes of the bundled corpus")
    metrics = dict(val_loss=val_loss, val_curve={v: [list(c) for c in val_curve[v]]
                                                 for v in MOE_VARIANTS}, params=params)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _verdict(val_loss, val_curve):
    """The measured outcome, and what it says about compare's early MoE deficit."""
    da, mo, dt = (val_loss[v] for v in ("dense_active", "moe", "dense_total"))
    gaps = [(st, lo - ref) for (st, lo), (_, ref) in zip(val_curve["moe"],
                                                          val_curve["dense_active"])]
    behind = [i for i, (_, g) in enumerate(gaps) if g >= 0]
    ahead = [] if behind and behind[-1] == len(gaps) - 1 else \
        [gaps[behind[-1] + 1 if behind else 0][0]]  # the step from which it stays ahead
    worst = max(gaps, key=lambda sg: sg[1])
    between = dt <= mo <= da
    text = (f"val loss dense_active {da:.3f}, moe {mo:.3f}, dense_total {dt:.3f}, fine "
            f"{val_loss['fine']:.3f}: the MoE {'sits' if between else 'does not sit'} between "
            f"the two dense models. moe - dense_active is {gaps[0][1]:+.3f} at step "
            f"{gaps[0][0]} and {gaps[-1][1]:+.3f} at step {gaps[-1][0]}"
            + (f" (ahead for good from step {ahead[0]})" if ahead else " (behind at the end)")
            + f"; at worst {worst[1]:+.3f} at step {worst[0]}. ")
    gain = da - dt  # what the total size buys a dense model at this budget
    if gain < 0.01:
        text += (f"The dense model of the total size gains only {gain:+.3f} over the active "
                 f"size here: at this budget the model is not capacity-bound, so the extra "
                 f"experts have nothing to buy, while each expert sees {K}/{E} of the tokens "
                 f"and the router must learn first; that early cost is compare's deficit")
    else:
        text += (f"The total size buys a dense model {gain:.3f}; the MoE recovers "
                 f"{100 * (da - mo) / gain:.0f}% of it. Early on each expert sees {K}/{E} of "
                 f"the tokens and the router must learn first: compare's 100 steps stop there")
    return text + f"; fine - moe = {val_loss['fine'] - mo:+.3f}"


def _figure(fig, outcome):
    ax1, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    for v in MOE_VARIANTS:
        steps, losses = zip(*m["val_curve"][v])
        ax1.plot(steps, losses, "o-", label=v)
    ax1.set(xlabel="step", ylabel="validation loss (nats/byte)", title="equal tokens")
    ax1.legend()
    ax2.bar(range(len(MOE_VARIANTS)), [m["val_loss"][v] for v in MOE_VARIANTS])
    ax2.set_xticks(range(len(MOE_VARIANTS)), MOE_VARIANTS)
    lo = min(m["val_loss"].values())
    ax2.set(ylim=(lo - 0.1, max(m["val_loss"].values()) + 0.05), title="final validation loss")


MOE = Experiment(_NAME, _CLAIM, _run, _figure)
