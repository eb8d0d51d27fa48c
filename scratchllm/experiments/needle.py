"""A needle beyond the window: full attention, sliding-window attention (Mistral) and
local/global attention (Gemma: a sliding layer, then a full one), 2 layers each, trained to
fetch the one needle token planted among filler at a random depth, then asked for it at
every depth (synthetic.py needle_batch).

A sliding window of W lets a query see W - 1 tokens back; L such layers relay at most
L (W - 1) (each layer's output at t holds what its window saw), so a needle deeper than that
is out of reach, however well the model is trained. One full layer in the stack (local/global)
reaches every depth. "Lost in the middle" (Liu et al. 2023, arXiv 2307.03172) is the U shape
of large trained models' retrieval against the needle's position. Real text puts what matters
at the start and at the end more often than in the middle; a model trained on uniform depths
has no reason to form the U, so two more full-attention models train at a lower learning rate
(the dip, if any, lives while the model learns), one on uniform depths, one on end-heavy
depths (Beta(0.2, 0.2) over [1, T - 1]: 79% of the needles in the outer fifths), and both are
probed along training at the ends (depths 1, 2, T - 2, T - 1) and in the middle (3T/8 to 5T/8).
Metrics: accuracy[model][depth] (depth: the needle's distance from the end, the query token),
reach[model] (the deepest depth the masks can relay: L (W - 1), or T - 1),
accuracy_end_heavy[depth] (the end-heavy model at the end), lost_in_middle[training][step]
= {"ends": accuracy, "middle": accuracy} with training "uniform" or "end_heavy".
"""
import numpy as np

from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.experiments.synthetic import accuracy, needle_batch, train_task
from scratchllm.lm import LM
from scratchllm.specs import preset

_NAME = "needle"
_CLAIM = ("a sliding window loses a needle planted beyond the reach of its layers, while full "
         "and local/global attention retrieve it at every depth; trained LLMs lose needles in "
         "the middle of the context")
N_FILL, N_NEEDLES, N_LAYERS = 32, 16, 2
END_HEAVY = 0.2  # the Beta(a, a) of the end-heavy training depths
NEEDLE_MODELS = {
    "full": lambda w: dict(),
    "swa": lambda w: dict(window=w),
    "local_global": lambda w: dict(window=w, layer_types=["sliding_attention",
                                                          "full_attention"]),
}


def _sizes(mode):
    """The settings of a mode: seq_len, window, d_model, steps, batch, eval batch, lr, and the
    lr of the two lost-in-the-middle models (slower: the dip lives while the model learns)."""
    return dict(seq_len=pick(mode, 16, 64, 128), window=pick(mode, 4, 8, 16),
                d_model=pick(mode, 16, 64, 64), steps=pick(mode, 6, 300, 800),
                batch=pick(mode, 4, 32, 32), eval_batch=pick(mode, 4, 64, 128), lr=3e-3,
                middle_lr=1e-3)


def depths_of(T, W):
    """The depths asked: within the window, within the stack's reach, beyond it, the middle,
    and the very start (depth T - 1)."""
    return sorted({W // 2, W + W // 2, N_LAYERS * W + W // 2, T // 2, 3 * T // 4, T - 1})


def needle_config(name, z):
    return preset("dense", vocab_size=N_FILL + N_NEEDLES + 1, d_model=z["d_model"],
                  n_layers=N_LAYERS, n_heads=4, n_kv_heads=4, ffn="none",
                  **NEEDLE_MODELS[name](z["window"]))


def reach(name, z):
    """The deepest needle the masks can carry to the query."""
    T, W = z["seq_len"], z["window"]
    return T - 1 if name != "swa" else min(T - 1, N_LAYERS * (W - 1))


def end_heavy_depths(rng, n, T, a=END_HEAVY):
    """n needle depths in [1, T - 1] drawn U-shaped, Beta(a, a) scaled: mostly near the
    start or the end of the context."""
    u = rng.beta(a, a, n)
    return np.clip(1 + np.floor(u * (T - 1)).astype(int), 1, T - 1)


def _probe(model, z, seed):
    """{"ends": accuracy at depths 1, 2, T - 2, T - 1; "middle": at 3T/8, T/2, 5T/8}, on the
    same eval sequences at every call."""
    T, B, rng = z["seq_len"], z["eval_batch"], np.random.default_rng([seed, 3])
    groups = {"ends": (1, 2, T - 2, T - 1), "middle": (3 * T // 8, T // 2, 5 * T // 8)}
    return {g: float(np.mean([accuracy(model, *needle_batch(rng, B, T, np.full(B, d), N_FILL,
                                                            N_NEEDLES)) for d in ds]))
            for g, ds in groups.items()}


def _train(name, z, seed, draw, curve=None):
    """Accuracy by depth of model `name` trained on needles at depths draw(rng, n, T);
    curve: a dict to fill with the ends/middle probe every twentieth of training (then at
    z["middle_lr"], else at z["lr"])."""
    T, every = z["seq_len"], max(1, z["steps"] // 20)
    model = LM(needle_config(name, z), rng=np.random.default_rng(seed), dtype=np.float32)
    rng = np.random.default_rng([seed, 1])

    def sample(step):
        return needle_batch(rng, z["batch"], T, draw(rng, z["batch"], T), N_FILL, N_NEEDLES)

    def probe(step):
        if curve is not None and (step % every == 0 or step == z["steps"]):
            curve[step] = _probe(model, z, seed)
    lr = z["lr"] if curve is None else z["middle_lr"]
    train_task(model, sample, z["steps"], lr, desc=name, on_step=probe)
    eval_rng, B = np.random.default_rng([seed, 2]), z["eval_batch"]
    return {d: accuracy(model, *needle_batch(eval_rng, B, T, np.full(B, d), N_FILL, N_NEEDLES))
            for d in depths_of(T, z["window"])}


def _uniform(rng, n, T):
    return rng.integers(1, T, n)


def _run(mode, seed, z=None):
    z = _sizes(mode) if z is None else z
    T, W = z["seq_len"], z["window"]
    depths = depths_of(T, W)
    curves = {"uniform": {}, "end_heavy": {}}
    acc = {name: _train(name, z, seed, _uniform) for name in NEEDLE_MODELS}
    _train("full", z, seed, _uniform, curves["uniform"])
    end_heavy = _train("full", z, seed, end_heavy_depths, curves["end_heavy"])
    reaches = {name: reach(name, z) for name in NEEDLE_MODELS}
    lines = [f"{'model':<14}{'reach':>6} | " + "".join(f"{'d=' + str(d):>7}" for d in depths)]
    lines += [f"{m:<14}{reaches[m]:>6} | " + "".join(f"{acc[m][d]:>7.2f}" for d in depths)
              for m in NEEDLE_MODELS]
    lines.append(f"{'full, ends':<14}{T - 1:>6} | "
                 + "".join(f"{end_heavy[d]:>7.2f}" for d in depths) + "  (end-heavy depths)")
    lines.append(f"T={T}, window {W}, {N_LAYERS} layers; depth d: the needle d tokens before "
                 f"the query; chance 1/{N_NEEDLES}")
    beyond = [d for d in depths if d > reaches["swa"]]
    mid = [d for d in depths if T // 4 <= d <= 3 * T // 4]
    swa_beyond = float(np.mean([acc["swa"][d] for d in beyond]))
    full_mid = float(np.mean([acc["full"][d] for d in mid]))
    full_ends = float(np.mean([acc["full"][min(depths)], acc["full"][max(depths)]]))
    holds = swa_beyond < 0.5 * min(np.mean([acc[m][d] for d in beyond])
                                   for m in ("full", "local_global"))
    dip = ("a dip: lost in the middle" if full_mid < full_ends - 0.05 else "no dip: trained "
           "on uniform depths, this model is not lost in the middle")
    lines.append("ends - middle along training (depths 1, 2, T-2, T-1 vs 3T/8..5T/8):")
    lines += [f"  {kind:<10}" + " ".join(f"{st}:{c['ends'] - c['middle']:+.2f}"
                                         for st, c in curve.items())
              for kind, curve in curves.items()]
    worst = {k: max(c, key=lambda st: c[st]["ends"] - c[st]["middle"]) for k, c in curves.items()}
    gaps = {k: curves[k][st]["ends"] - curves[k][st]["middle"] for k, st in worst.items()}
    final = {k: c[max(c)]["ends"] - c[max(c)]["middle"] for k, c in curves.items()}
    verdict = (f"beyond the window's reach (d > {reaches['swa']}) swa {swa_beyond:.2f}, full "
               f"{np.mean([acc['full'][d] for d in beyond]):.2f}, local/global "
               f"{np.mean([acc['local_global'][d] for d in beyond]):.2f}: "
               f"{'the window loses the needle, as claimed' if holds else 'not shown here'}; full "
               f"attention in the middle {full_mid:.2f} against {full_ends:.2f} at the ends "
               f"({dip}); trained on end-heavy depths the ends lead the middle by at most "
               f"{gaps['end_heavy']:+.2f} (step {worst['end_heavy']}; uniform depths "
               f"{gaps['uniform']:+.2f}) and by {final['end_heavy']:+.2f} at the end "
               f"(uniform {final['uniform']:+.2f}): "
               + ("lost in the middle while it learns, "
                  + ("still at the end" if final["end_heavy"] > 0.05 else "gone once learnt")
                  if gaps["end_heavy"] > max(0.05, gaps["uniform"] + 0.05)
                  else "no lost middle at this size"))
    config = dict(z, n_layers=N_LAYERS, n_heads=4, ffn="none", fillers=N_FILL,
                  needles=N_NEEDLES, depths=depths, reach=reaches,
                  end_heavy=f"Beta({END_HEAVY}, {END_HEAVY}) depths")
    metrics = dict(accuracy=acc, reach=reaches, accuracy_end_heavy=end_heavy,
                   lost_in_middle=curves)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    for name, by_depth in m["accuracy"].items():
        ax.plot([int(d) for d in by_depth], list(by_depth.values()), "o-", label=name)
    ax.axvline(m["reach"]["swa"], ls="--", c="gray", label="sliding window's reach")
    ax.set(xlabel="needle depth (tokens before the query)", ylabel="retrieval accuracy",
           ylim=(0, 1.02), title="a needle beyond the window")
    ax.legend(fontsize=7)
    for (kind, curve), color in zip(m["lost_in_middle"].items(), ("C0", "C3")):
        steps = [int(st) for st in curve]
        for group, style in (("ends", "-"), ("middle", "--")):
            ax2.plot(steps, [c[group] for c in curve.values()], style, c=color,
                     label=f"{kind} training: {group}")
    ax2.set(xlabel="training step", ylabel="full attention's accuracy", ylim=(0, 1.02),
            title="lost in the middle while learning?")
    ax2.legend(fontsize=7)


NEEDLE = Experiment(_NAME, _CLAIM, _run, _figure)
