"""Which tokens each expert gets: experts specialise by syntax (token type) more than by topic
(Jiang et al. 2024, Mixtral, arXiv 2401.04088 §5: "the router does exhibit some structured
syntactic behavior" — indentation, `self`, consecutive tokens — rather than a domain; Zoph et
al. 2022, ST-MoE, arXiv 2202.08906 §7: encoder experts specialise in punctuation, proper
nouns, numbers).

An MoE (8 experts, top-2) trains on the bytes of the bundled corpus (Python's docs: prose,
reST markup and code), then routes the validation split. Each byte gets a class:
    ident   a byte of a name run [A-Za-z_][A-Za-z0-9_]* that looks like code: it holds "_", a
            digit or an inner capital, follows "." or precedes "("
    word    a byte of any other name run (English words)
    digit   a digit outside a name
    punct   a punctuation byte outside a name
(whitespace and other bytes are left out) and a topic: which quarter of the validation split
it lies in (contiguous quarters, different documents: as many topics as classes).
Metrics, per MoE layer l and over the routed slots (k per byte):
    share[expert][class]       the expert's slots by class (each expert's shares sum to 1),
                               the first MoE layer; share_by_layer[l][expert][class] all
    lift[expert][class]        share / the class's share of all slots (1 = no preference)
    entropy                    the mean routing entropy -sum_e p_e ln p_e over bytes and
                               layers (nats; ln E for a uniform router)
    mi_class, mi_topic         the mutual information (nats) between the chosen expert and
                               the class, and the topic, over all layers' slots
    mi_class_init, ..._init    the same for the untrained model: a router reading the byte's
                               embedding separates classes a little from the start
"""
import re
import string

import numpy as np

from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.experiments.loop import train_curve
from scratchllm.lm import LM
from scratchllm.specs import preset
from scratchllm.train import corpus
from scratchllm.train.settings import Settings

_NAME = "experts"
_CLAIM = ("experts specialise by syntax (punctuation, digits, identifiers, words) more than by "
          "topic")
CLASSES = ("punct", "digit", "ident", "word")
E, K = 8, 2
_NAME_RUN = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")
_CODE_LIKE = re.compile(rb"_|[0-9]|.[A-Z]")


def token_classes(data):
    """The class of every byte of `data` (bytes): an int array, the index into CLASSES, or -1
    (whitespace, other bytes). Rules: the module docstring."""
    cls = np.full(len(data), -1, np.int64)
    arr = np.frombuffer(data, np.uint8)
    cls[np.isin(arr, list(string.punctuation.encode()))] = CLASSES.index("punct")
    cls[(arr >= ord("0")) & (arr <= ord("9"))] = CLASSES.index("digit")
    for m in _NAME_RUN.finditer(data):
        a, b = m.span()
        code = (_CODE_LIKE.search(m.group()) is not None or data[a - 1:a] == b"." or
                data[b:b + 1] == b"(")
        cls[a:b] = CLASSES.index("ident" if code else "word")
    return cls


def mutual_information(a, b):
    """I(a; b) in nats of two int label arrays (the empirical joint distribution)."""
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1.0)
    joint /= joint.sum()
    pa, pb = joint.sum(1, keepdims=True), joint.sum(0, keepdims=True)
    nz = joint > 0
    return float((joint[nz] * np.log(joint[nz] / (pa @ pb)[nz])).sum())


def routing(model, ids, seq):
    """Route ids (N,) in windows of seq: per MoE layer (topk_idx (n, K), probs (n, E)) and
    the positions (n,) of the routed bytes in ids."""
    n = (len(ids) // seq) * seq
    x = ids[:n].reshape(-1, seq)  # (W, seq)
    layers = {}
    for i in range(0, len(x), 16):
        _, cache = model.forward(x[i:i + 16])
        for layer, c in enumerate(cache.blocks):
            r = c.ffn.inner.router  # the MoE's RouterCache
            idx, probs = layers.setdefault(layer, ([], []))
            idx.append(r.topk_idx)
            probs.append(r.score_cache.y)
    return ({l: (np.concatenate(i), np.concatenate(p)) for l, (i, p) in layers.items()},
            np.arange(n))


def _shares(idx, cls):
    """{expert: {class: share}} and (E, C) lift from topk_idx (n, K) and byte classes (n,)."""
    keep = cls >= 0
    counts = np.zeros((E, len(CLASSES)))
    np.add.at(counts, (idx[keep].ravel(), np.repeat(cls[keep], idx.shape[1])), 1.0)
    share = counts / np.maximum(counts.sum(1, keepdims=True), 1)  # (E, C)
    lift = share / (counts.sum(0) / counts.sum())  # (E, C)
    as_dict = lambda a: {str(e): {c: float(a[e, j]) for j, c in enumerate(CLASSES)}  # noqa
                         for e in range(E)}
    return as_dict(share), as_dict(lift)


def statistics(model, ids, seq):
    """Route ids (N,) (windows of seq) through model: (share_by_layer, lift_by_layer, mean
    routing entropy, I(expert; class), I(expert; topic)) as the module docstring defines
    them."""
    layers, pos = routing(model, ids, seq)
    cls = token_classes(bytes(ids.astype(np.uint8)))[pos]  # (n,)
    topic = (pos * 4 // len(pos)).astype(np.int64)  # (n,) the quarter
    by_layer, lifts, ent, experts_, classes_, topics_ = {}, {}, [], [], [], []
    for layer, (idx, probs) in layers.items():
        by_layer[str(layer)], lifts[str(layer)] = _shares(idx, cls)
        ent.append(float(-(probs * np.log(np.maximum(probs, 1e-30))).sum(-1).mean()))
        keep = np.repeat(cls >= 0, K)
        experts_.append(idx.ravel()[keep])
        classes_.append(np.repeat(cls, K)[keep])
        topics_.append(np.repeat(topic, K)[keep])
    ex = np.concatenate(experts_)
    return (by_layer, lifts, float(np.mean(ent)),
            mutual_information(ex, np.concatenate(classes_)),
            mutual_information(ex, np.concatenate(topics_)))


def _run(mode, seed):
    steps = pick(mode, 4, 200, 800)
    d_model, n_layers, F = pick(mode, 16, 64, 64), pick(mode, 1, 2, 2), pick(mode, 8, 64, 64)
    batch, seq = pick(mode, 2, 8, 8), pick(mode, 64, 32, 64)
    train_ids, val_ids = byte_corpus(pick(mode, 50_000, None, None))
    cfg = preset("moe", vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=4,
                 n_kv_heads=4, n_experts=E, top_k=K, d_ff=F)
    s = Settings(steps=steps, batch_size=batch, seq_len=seq, lr=4e-3, warmup=min(30, steps),
                 eval_every=steps + 1, seed=seed, threads=1)
    eval_set = corpus.eval_batches(val_ids, 16, seq, pick(mode, 1024, 4096, 16384))
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32)
    curve, _ = train_curve(model, s, train_ids, eval_set, 2, desc="moe")
    routed = val_ids[:pick(mode, 2048, 32768, 65536)]
    init = statistics(LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32), routed, seq)
    by_layer, lifts, entropy, mi_class, mi_topic = statistics(model, routed, seq)
    share, lift = by_layer["0"], lifts["0"]
    lines = ["layer 0: share of each expert's slots by class (lift over the class's share)",
             f"{'expert':<8}" + "".join(f"{c:>15}" for c in CLASSES)]
    lines += [f"{e:<8}" + "".join(f"{share[e][c]:>8.3f} ({lift[e][c]:>4.2f})" for c in CLASSES)
              for e in share]
    lines.extend([f"routing entropy {entropy:.3f} nats (uniform: ln {E} = {np.log(E):.3f}); "
                 f"I(expert; class) {mi_class:.4f} nats, I(expert; topic) {mi_topic:.4f} "
                 f"nats; validation loss {curve[-1][1]:.3f}",
                 f"untrained router: I(expert; class) {init[3]:.4f}, I(expert; topic) "
                 f"{init[4]:.4f} nats (the byte's identity alone routes by class)"])
    best = max(((e, c) for e in lift for c in CLASSES), key=lambda ec: lift[ec[0]][ec[1]])
    verdict = (f"the expert carries {mi_class / max(mi_topic, 1e-12):.1f}x more information "
               f"about the token's class than about its topic (I = {mi_class:.4f} vs "
               f"{mi_topic:.4f} nats): syntax "
               f"{'more' if mi_class > mi_topic else 'not more'} than topic; the most "
               f"specialised expert in layer 0 is {best[0]} on {best[1]} "
               f"(lift {lift[best[0]][best[1]]:.2f}); routing entropy {entropy:.2f} of "
               f"{np.log(E):.2f} nats; untrained, I(expert; class) was {init[3]:.4f}")
    config = dict(steps=steps, d_model=d_model, n_layers=n_layers, n_experts=E, top_k=K,
                  expert_d_ff=F, batch_size=batch, seq_len=seq, routed_bytes=int(len(routed)),
                  val_loss=curve[-1][1])
    metrics = dict(share=share, entropy=entropy, lift=lift, share_by_layer=by_layer,
                   lift_by_layer=lifts, entropy_max=float(np.log(E)), mi_class=mi_class,
                   mi_topic=mi_topic, mi_class_init=init[3], mi_topic_init=init[4])
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    m = outcome.metrics
    axes = np.atleast_1d(fig.subplots(1, len(m["lift_by_layer"])))
    for ax, (layer, lift) in zip(axes, m["lift_by_layer"].items()):
        grid = np.array([[lift[e][c] for c in CLASSES] for e in lift])
        im = ax.imshow(np.log2(np.maximum(grid, 1e-3)), cmap="RdBu_r", vmin=-2, vmax=2)
        ax.set_xticks(range(len(CLASSES)), CLASSES)
        ax.set(ylabel="expert", title=f"layer {layer}: log2 lift")
        fig.colorbar(im, ax=ax)


EXPERTS_BY_TOKEN = Experiment(_NAME, _CLAIM, _run, _figure)
