"""What a fixed-size state gives up: multi-query associative recall and copying at several
sequence lengths, for attention, sliding-window attention, Mamba, Mamba-2, linear attention,
DeltaNet and a hybrid (Mamba then attention), 2 layers each, no FFN, at matched parameters
(about 4 D^2 a layer: Mamba and Mamba-2 with expand 1).

One model per architecture is trained on both tasks at once (half of each batch recall, half
copying) with a length curriculum (length_at: the first k-th of the steps on the shortest
length, then the two shortest in turn, ..., the last k-th cycling through all k), then
evaluated on fresh sequences at each length. Attention's recall is a sudden transition (the
previous-token and induction heads form together), and it needs steps at a short length: at
lr 1e-2 and T 64 alone it came between steps 500 and 600; with 64, 128 and 256 in turn from
the start it had not come by step 1200 (recall 0.13, 0.09, 0.07: a value from the context,
chance 1/8, 1/16, 1/32); with the curriculum over 1200 steps it came between steps 500 and
600, early in the second stage (seed 0, measured).
Recall (synthetic.py): n = T / 8 key-value pairs, then queries; copying: T / 4 to T / 2
symbols then their copy (the length varies, so only an induction head or a state that holds
the span can do it). Attention's state is its KV cache, which grows with T; a sliding window keeps W
tokens; the recurrent mixers keep a state whose size does not depend on T (their specs'
state_per_sequence). Zoology (Arora et al. 2023, arXiv 2312.04927) finds recall accuracy set
by the state size, and attention exact at every length; Jelassi et al. 2024 (arXiv
2402.01032) find the same for copying.
Metrics: accuracy[model][T] (recall), copy_accuracy[model][T], state_bytes[model] (bf16, one
sequence at the longest T: teach/sizing.kv_cache); config["params"][model].
"""
from dataclasses import replace

import numpy as np
from matplotlib.ticker import NullFormatter

from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.experiments.synthetic import accuracy, copy_batch, recall_batch, train_task
from scratchllm.lm import LM
from scratchllm.specs import RecurrentSpec, preset
from scratchllm.teach import sizing

_NAME = "recall"
_CLAIM = ("a fixed-size state gives up exact recall: attention recalls and copies at every "
         "length, while Mamba, linear attention and the sliding window fall as the sequence "
         "outgrows their state; DeltaNet and the hybrid recover much of it")
RECALL_MODELS = {  # the flat-name overrides of each architecture (2 layers)
    "attention": dict(),
    "swa": dict(window=16),
    "mamba": dict(layer_pattern="MM", expand=1),
    "mamba2": dict(layer_pattern="SS", expand=1),
    "linear": dict(layer_pattern="LL"),
    "deltanet": dict(layer_pattern="DD"),
    "hybrid": dict(layer_pattern="MA", expand=1),
}


def _sizes(mode):
    """The settings of a mode: lengths, d_model, steps, batch, eval batch, keys, lr."""
    return dict(lengths=pick(mode, (16, 32), (32, 64), (64, 128, 256)),
                d_model=pick(mode, 16, 64, 64), steps=pick(mode, 6, 600, 1500),
                batch=pick(mode, 4, 32, 32), eval_batch=pick(mode, 4, 64, 128),
                n_keys=pick(mode, 16, 32, 64), lr=1e-2)


def length_at(step, steps, lengths):
    """The training length at step (1-based) of steps: a curriculum in len(lengths) equal
    stages, stage s cycling through the s + 1 shortest lengths (lengths sorted ascending)."""
    k = len(lengths)
    stage = min(k - 1, (step - 1) * k // steps)
    return lengths[step % (stage + 1)]


RECURRENT_CHUNK = 16  # the chunked form's chunk: 3x faster than 64 at T 64 on a CPU, same math


def recall_config(name, z):
    """The ModelConfig of architecture `name` at the sizes z (the linear-attention mixers with
    chunks of RECURRENT_CHUNK)."""
    V = 2 * z["n_keys"] + 1  # keys, values (also the copied symbols), COPY
    cfg = preset("dense", vocab_size=V, d_model=z["d_model"], n_layers=2,
                 n_heads=4, n_kv_heads=4, ffn="none", **RECALL_MODELS[name])
    return replace(cfg, layers=tuple(
        replace(layer, mixer=replace(layer.mixer, chunk=RECURRENT_CHUNK))
        if isinstance(layer.mixer, RecurrentSpec) else layer for layer in cfg.layers))


def _tasks(z):
    """sample(rng, T, batch, task) of the two tasks on one vocabulary."""
    nk = z["n_keys"]

    def sample(rng, T, batch, task):
        if task == "recall":
            return recall_batch(rng, batch, T, T // 8, nk)
        return copy_batch(rng, batch, T, 2 * nk, 2 * nk)  # keys and values: all copied
    return sample


def _train_and_eval(name, z, seed):
    """(recall accuracy by T, copy accuracy by T, params, state bytes) of one architecture."""
    cfg = recall_config(name, z)
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32)
    sample, rng = _tasks(z), np.random.default_rng([seed, 1])
    lengths, half = z["lengths"], z["batch"] // 2

    def mixed(step):
        T = length_at(step, z["steps"], lengths)
        (a, ta), (b, tb) = sample(rng, T, half, "recall"), sample(rng, T, half, "copy")
        return np.concatenate([a, b]), np.concatenate([ta, tb])
    train_task(model, mixed, z["steps"], z["lr"], desc=name)
    eval_rng = np.random.default_rng([seed, 2])
    recall = {T: accuracy(model, *sample(eval_rng, T, z["eval_batch"], "recall"))
              for T in lengths}
    copy = {T: accuracy(model, *sample(eval_rng, T, z["eval_batch"], "copy")) for T in lengths}
    state = sizing.kv_cache(cfg, context=max(lengths), dtype="bf16").bytes
    return recall, copy, int(model.n_params()), int(state)


def _run(mode, seed, z=None):
    z = _sizes(mode) if z is None else z
    acc, copy, params, state = {}, {}, {}, {}
    for name in RECALL_MODELS:
        acc[name], copy[name], params[name], state[name] = _train_and_eval(name, z, seed)
    lengths, T = z["lengths"], max(z["lengths"])
    head = "".join(f"{'T=' + str(t):>8}" for t in lengths)
    lines = [f"{'model':<10}{'params':>8}{'state B':>9} | recall{head} | copy{head}"]
    lines += [f"{m:<10}{params[m]:>8,}{state[m]:>9,} |       "
              + "".join(f"{acc[m][t]:>8.2f}" for t in lengths) + " |     "
              + "".join(f"{copy[m][t]:>8.2f}" for t in lengths) for m in RECALL_MODELS]
    lines.append(f"state: bf16 bytes for one sequence of {T} tokens (attention's KV cache "
                 f"grows with T; the rest do not); chance on recall 1/{T // 8}")
    fixed = ("mamba", "linear")
    holds = all(acc["attention"][T] > acc[m][T] for m in fixed)
    verdict = (f"at T={T} recall: attention {acc['attention'][T]:.2f}, swa {acc['swa'][T]:.2f}, "
               f"mamba {acc['mamba'][T]:.2f}, mamba2 {acc['mamba2'][T]:.2f}, linear "
               f"{acc['linear'][T]:.2f}, deltanet {acc['deltanet'][T]:.2f}, hybrid "
               f"{acc['hybrid'][T]:.2f}; copying: attention {copy['attention'][T]:.2f}, mamba "
               f"{copy['mamba'][T]:.2f}: attention above Mamba and linear attention "
               f"{'holds' if holds else 'does not hold here'}")
    config = dict(z, n_layers=2, n_heads=4, ffn="none", models=RECALL_MODELS, params=params,
                  recall_pairs="T / 8", copy_span="T / 4 to T / 2", state_dtype="bf16",
                  recurrent_chunk=RECURRENT_CHUNK,
                  curriculum="stage s of len(lengths) cycles through the s + 1 shortest")
    metrics = dict(accuracy=acc, copy_accuracy=copy, state_bytes=state)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax1, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    for name, by_len in m["accuracy"].items():
        ax1.plot([int(t) for t in by_len], list(by_len.values()), "o-", label=name)
    lengths = [int(t) for t in next(iter(m["accuracy"].values()))]
    ax1.set(xlabel="sequence length", ylabel="recall accuracy", xscale="log", ylim=(0, 1.02),
            title="multi-query associative recall")
    ax1.set_xticks(lengths, [str(t) for t in lengths], minor=False)
    ax1.set_xticks([], minor=True)
    ax1.legend(fontsize=7)
    longest = {name: by_len[max(by_len, key=int)] for name, by_len in m["accuracy"].items()}
    for name, acc in longest.items():
        ax2.scatter(m["state_bytes"][name], acc)
        ax2.annotate(name, (m["state_bytes"][name], acc), fontsize=8)
    ax2.set(xlabel="state bytes per sequence (bf16, longest length)", xscale="log",
            ylabel="recall accuracy at the longest length", ylim=(0, 1.02),
            title="accuracy against state size")
    ax2.xaxis.set_minor_formatter(NullFormatter())


RECALL = Experiment(_NAME, _CLAIM, _run, _figure)
