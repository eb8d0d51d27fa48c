"""Writes notebooks/14_inside_a_model.ipynb (stored without outputs, as the course's
notebooks are): its cells are the lists below, in order. Edit a cell here, then run

    python notebooks/make_14_inside_a_model.py

and commit both files; re-running it on an unchanged script rewrites the notebook byte for
byte (the cell ids are fixed), which tests/test_notebooks.py checks. The cells' ids are the
ones the notebook was first written with.
"""
import sys
from pathlib import Path

import nbformat

OUT = Path(__file__).resolve().parent / "14_inside_a_model.ipynb"

# (kind, id, source) of every cell, in order
CELLS = [
    ('markdown', 'b567b069', """# 14 · Inside a model

The chapters make claims a student can check: induction heads form, the residual stream is a
sum the logit lens can read, a fixed-size state gives up exact recall, a sliding window loses
the needle, sinks hold the softmax. `python -m scratchllm experiment list` names the
experiments that measure them, `experiment run NAME [--quick|--smoke]` runs one (a table, the
chapter's claim beside the measured outcome, `results.json` and a figure); README's experiment
table has the full runs' numbers.

This notebook first trains a 2-layer attention-only model until an induction head forms and
opens it with the tools of `scratchllm.experiments` (they work on any `LM`, a loaded Hugging
Face model too): the logit lens, direct logit attribution, attention patterns and head
scores, a steering vector. Then it runs the memory experiments at their smoke size."""),
    ('code', '3f7475b5', """import numpy as np
import matplotlib.pyplot as plt

import grads
from scratchllm.core import cross_entropy_backward, cross_entropy_forward
from scratchllm.experiments import (EXPERIMENTS, attention_patterns, direct_logit_attribution,
                                    head_scores, logit_lens, run_experiment, steered_logits,
                                    steering_vector)
from scratchllm.experiments.induction import half_losses, repeated
from scratchllm.experiments.synthetic import IGNORE, recall_batch, train_task
from scratchllm.lm import LM
from scratchllm.specs import AttentionSpec, LayerSpec, ModelConfig

for name, experiment in EXPERIMENTS.items():
    print(f"{name:<10} {experiment.claim}")"""),
    ('markdown', '5eb5856e', r"""## A loss only where the task asks

The synthetic tasks ask something at a few positions only (the value after a recalled key, the
needle at the query); elsewhere the target is `IGNORE` = −100. With $A$ the asked positions and
$p_{n} = \mathrm{softmax}(z_n)$,
$$L = -\frac{1}{|A|} \sum_{n \in A} \log p_{n}[y_n], \qquad
\frac{\partial L}{\partial z_n} = \begin{cases} (p_n - e_{y_n}) / |A| & n \in A \\ 0 & n \notin A
\end{cases}$$
(the log-softmax backward $\bar z = \bar\ell - p \sum_j \bar\ell_j$ with $\bar\ell = -e_{y}/|A|$).
An ignored row gets no gradient at all, and the mean divides by the asked rows only:"""),
    ('code', '232fcb88', r"""rng = np.random.default_rng(0)
ids, targets = recall_batch(rng, 2, 12, 3, 4)  # 3 key-value pairs (keys 0-3, values 4-7), queries
print(ids, targets, sep="\n")
logits = rng.standard_normal((2, 12, 9))
print(grads.check(cross_entropy_forward, cross_entropy_backward, rng=rng, logits=logits,
                  targets=targets))
dz = cross_entropy_backward(np.asarray(1.0), cross_entropy_forward(logits, targets)[1])["logits"]
print("gradient on ignored rows:", np.abs(dz[targets == IGNORE]).max())"""),
    ('markdown', 'a419ddd7', r"""## An induction head, trained in seconds

Sequences $r\,r$ of $m$ random tokens seen twice ($m$ varies, so no fixed offset does the
job): the first half is unpredictable, the second half is predictable by copying. Two
attention layers suffice (Olsson et al. 2022): a previous-token head in layer 0 writes "my
predecessor was $a$" into each position, an induction head in layer 1 finds the position whose
predecessor is the current token and copies the token found there."""),
    ('code', 'bd123a6c', """V, n = 16, 8
cfg = ModelConfig(name="attn-only", vocab_size=V, d_model=32,
                  layers=(LayerSpec(mixer=AttentionSpec(n_heads=4, n_kv_heads=4), ffn=None),) * 2)
model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float32)
rng = np.random.default_rng(1)

def sample(step):
    seqs = repeated(rng, 32, int(rng.integers(n // 2, n + 1)), V)
    return seqs[:, :-1], seqs[:, 1:]

losses = train_task(model, sample, 600, 1e-2, desc="induction")
held_out = repeated(np.random.default_rng(2), 64, n, V)
first, second = half_losses(model, held_out)
print(f"loss: first half {first:.2f}, repeated half {second:.2f} nats (ln V = {np.log(V):.2f})")"""),
    ('markdown', 'ac1e70e4', r"""## The logit lens and direct logit attribution

The residual stream is a sum: $x_L = x_0 + \sum_{l} \mathrm{mixer}_l + \sum_l \mathrm{ffn}_l$,
and an attention layer's output is itself a sum over heads, $\sum_h \mathrm{softmax}(\cdot)\,V_h
W_O^{(h)}$. The logit lens reads any partial sum $x_l$ through the final norm and the head, as
if the model stopped there; its last row is the model's logits. Direct logit attribution
freezes the final RMSNorm's scale $s = 1/\mathrm{rms}(x_L)$ at its value, which makes the
logit linear in the stream:
$$z[y] = s\,(g \odot x_L) \cdot W_U[:, y] = \sum_{c} s\,(g \odot c) \cdot W_U[:, y],$$
one term per component $c$ (the embedding, every head, every FFN). The terms sum to the logit
exactly:"""),
    ('code', '61b2d1e2', """ids = held_out[:4, :-1]
lens = logit_lens(model, ids)  # (L + 1, B, T, V)
logits = model.forward(ids)[0]
print("lens, last row == logits:", np.array_equal(lens[-1], logits))
p_right = [np.take_along_axis(np.exp(l - l.max(-1, keepdims=True))
                              / np.exp(l - l.max(-1, keepdims=True)).sum(-1, keepdims=True),
                              held_out[:4, 1:, None], -1)[..., 0] for l in lens]
for depth, p in zip(["embedding", "after layer 0", "after layer 1"], p_right):
    print(f"{depth:<14} p(next token) on the repeated half: {p[:, n:].mean():.2f}")
target = held_out[0, -1]
parts = direct_logit_attribution(model, ids[:1], target)
gap = abs(sum(parts.values())[0, -1] - logits[0, -1, target])
print(f"sum of parts - logit: {gap:.1e} (float32 rounding; 1e-15 in float64)")
top = sorted(parts, key=lambda k: -abs(parts[k][0, -1]))[:4]
print("largest contributions to the last logit:", {k: round(float(parts[k][0, -1]), 2) for k in top})"""),
    ('markdown', '8c1607a4', """## Attention patterns and head scores

`head_scores` measures three patterns on every head: previous-token (the mean weight of query
$t$ on key $t-1$), induction (on repeated sequences, the weight on the key just after the
earlier copy of the current token) and sink (the weight on the first key)."""),
    ('code', 'ad53fcbf', """patterns = attention_patterns(model, held_out[:, :-1])  # {layer: (B, H, T, T)}
scores = head_scores(model, held_out[:, :-1], patterns=patterns)
for kind in ("previous_token", "induction", "sink"):
    print(f"{kind:<15}", {layer: [round(float(x), 2) for x in s] for layer, s in scores[kind].items()})
best = int(np.argmax(scores["induction"][1]))
prev = int(np.argmax(scores["previous_token"][0]))
fig, axes = plt.subplots(1, 2, figsize=(9, 4))
for ax, (layer, h, title) in zip(axes, [(0, prev, "previous-token head"),
                                        (1, best, "induction head")]):
    ax.imshow(patterns[layer][0, h], cmap="viridis")
    ax.set(title=f"L{layer}.H{h}: {title}", xlabel="key", ylabel="query")
plt.tight_layout()
plt.savefig("14_inside_a_model.png", dpi=110)
plt.show()"""),
    ('markdown', 'b6cbb47f', """## A steering vector

Activation addition (Turner et al. 2023): the mean difference of the residual stream between
two prompts, added to the stream after a layer, pushes every later layer's reading. Here the
"prompts" are sequences over the lower and the upper half of the vocabulary; adding the
difference after layer 0 moves probability towards the upper half."""),
    ('code', '8fdd3095', """rng = np.random.default_rng(3)
upper, lower = rng.integers(V // 2, V, (8, 2 * n)), rng.integers(0, V // 2, (8, 2 * n))
v = steering_vector(model, upper, lower, 0)
probe = held_out[:8, :-1]
for scale in (0.0, 1.0, 2.0):
    z = steered_logits(model, probe, 0, v, scale)
    p = np.exp(z - z.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
    print(f"scale {scale}: probability on the upper half {p[..., V // 2:].sum(-1).mean():.2f}")"""),
    ('markdown', 'e4e1d0a1', r"""## Early exit while decoding

The logit lens gives a prediction after every block; a decoder can stop there when it is
confident (CALM, Schuster et al. 2022): a token runs blocks until the lens's largest
probability reaches a threshold, and the blocks it skipped get its keys and values from the
hidden state where it stopped, $k = \mathrm{norm}_1(h) W_k$. At threshold 1 nothing exits early
and `early_exit_decode` is the model's own greedy decoding, token for token. Here the prompt
is a first half and two tokens of its repeat; the rest of the repeat is the answer."""),
    ('code', 'e4e1d0a2', """from scratchllm.experiments import early_exit_decode

prompt, answer = held_out[:16, :n + 3], held_out[:16, n + 3:]
for threshold in (1.0, 0.6, 0.3, 0.0):  # one sequence at a time: each token exits on its own
    runs = [early_exit_decode(model, p[None], answer.shape[1], threshold) for p in prompt]
    right = np.mean([(r.tokens[0] == a).mean() for r, a in zip(runs, answer)])
    blocks = np.mean([r.blocks_fraction for r in runs])
    print(f"threshold {threshold}: blocks run {blocks:.2f}, repeat right {right:.2f}")"""),
    ('markdown', 'e4e1d0a3', """Layer 0 alone cannot copy (the induction head is in layer 1), so every early exit here is a
guess: a threshold only saves blocks where the early lens is both confident and right, which
the `early_exit` experiment measures on a deeper byte-level model."""),
    ('markdown', 'b16f4e9b', """## The memory experiments

`recall` trains attention, a sliding window, Mamba, Mamba-2, linear attention, DeltaNet and a
hybrid (2 layers, matched parameters) on multi-query associative recall and copying;
`needle` plants a token beyond a sliding window's reach; `sinks` decodes a trained model with
a window, with and without its first 4 tokens. At their smoke size (seconds) they only show the
plumbing: the models are barely trained, so read the numbers from README's table (the full
runs) or run `--quick` yourself. Each run states the claim beside what it measured."""),
    ('code', '98cefa42', """for name in ("recall", "needle", "sinks"):
    print(f"=== {name}")
    outcome = run_experiment(name, "smoke", out=f"runs/{name}", seed=0)"""),
    ('code', '54caa6e5', """import json
body = json.load(open("runs/recall/results.json"))
print(sorted(body))
state = body["state_bytes"]
fig, ax = plt.subplots(figsize=(6, 4))
ax.bar(list(state), list(state.values()))
ax.set(yscale="log", ylabel="state bytes per sequence (bf16)",
       title=f"what each model keeps at T = {max(body['config']['lengths'])}")
plt.xticks(rotation=30)
plt.tight_layout()
plt.savefig("14_inside_a_model_state.png", dpi=110)
plt.show()"""),
]


def build():
    """The notebook as an nbformat NotebookNode."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python",
                                  "name": "python3"},
                   "language_info": {"name": "python"}}
    make = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    nb.cells = [make[kind](source, id=cell_id) for kind, cell_id, source in CELLS]
    return nb


def main(path=OUT):
    nbformat.validate(nb := build())
    nbformat.write(nb, str(path))
    return path


if __name__ == "__main__":
    print(f"wrote {main(*sys.argv[1:])}")
