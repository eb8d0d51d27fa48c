"""Multi-head, grouped-query and multi-query attention at equal compute: the same model with
8 query heads and 8, 4, 2 or 1 KV heads (MHA, GQA-4, GQA-2, MQA; Shazeer 2019, arXiv
1911.02150; Ainslie et al. 2023, arXiv 2305.13245), trained on the same byte-level batches of
the bundled corpus. KV bytes per token (bf16, all layers) = 2 Hkv Dh L * 2: the cache shrinks
with Hkv while the query side (and so the attention FLOPs) stays the same.
"""

from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.specs import preset
from scratchllm.teach import sizing
from scratchllm.train import corpus
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import train_preset

_NAME = "heads"
_CLAIM = ("GQA costs almost nothing in loss against MHA and MQA a little, for a KV cache "
         "smaller by H/Hkv")
VARIANTS = {"mha": 8, "gqa4": 4, "gqa2": 2, "mqa": 1}


def _run(mode, seed):
    steps = pick(mode, 3, 120, 600)
    d_model, n_layers = pick(mode, 32, 64, 128), pick(mode, 1, 2, 4)
    batch, seq = pick(mode, 4, 8, 16), pick(mode, 32, 64, 128)
    train_ids, val_ids = byte_corpus(pick(mode, 100_000, None, None))
    settings = Settings(steps=steps, batch_size=batch, seq_len=seq, lr=4e-3,
                        warmup=min(30, steps), eval_every=steps + 1, seed=seed, threads=1)
    eval_set = corpus.eval_batches(val_ids, batch, seq, pick(mode, 512, 16384, 65536))
    val_loss, kv_bytes, params = {}, {}, {}
    for name, hkv in VARIANTS.items():
        cfg = preset("dense", vocab_size=256, d_model=d_model, n_layers=n_layers, n_heads=8,
                     n_kv_heads=hkv, d_ff=pick(mode, 64, 192, 384))
        _, _, val, n = train_preset(cfg, train_ids, eval_set, settings, mode == "full")
        val_loss[name] = float(val)
        kv_bytes[name] = sizing.kv_cache(cfg, context=1, dtype="bf16").bytes
        params[name] = int(n)
    lines = [f"{'variant':<8}{'KV heads':>9}{'params':>9}{'KV B/token':>12}{'val loss':>10}"]
    lines += [f"{v:<8}{h:>9}{params[v]:>9,}{kv_bytes[v]:>12,}{val_loss[v]:>10.3f}"
              for v, h in VARIANTS.items()]
    gap = {v: val_loss[v] - val_loss["mha"] for v in VARIANTS}
    verdict = (f"against MHA the loss changes by {gap['gqa4']:+.3f} (GQA-4), "
               f"{gap['gqa2']:+.3f} (GQA-2), {gap['mqa']:+.3f} (MQA) nats/byte for "
               f"{kv_bytes['mha'] // kv_bytes['mqa']}x less cache at MQA")
    config = dict(steps=steps, d_model=d_model, n_layers=n_layers, n_heads=8, batch_size=batch,
                  seq_len=seq, tokens="bytes of the bundled corpus", params=params)
    return Outcome(dict(val_loss=val_loss, kv_bytes=kv_bytes), config, "\n".join(lines),
                   verdict)


def _figure(fig, outcome):
    ax = fig.subplots()
    m = outcome.metrics
    names = list(VARIANTS)
    ax.plot([m["kv_bytes"][v] for v in names], [m["val_loss"][v] for v in names], "o-")
    for v in names:
        ax.annotate(v, (m["kv_bytes"][v], m["val_loss"][v]))
    ax.set(xlabel="KV cache bytes per token (bf16)", ylabel="validation loss (nats/byte)",
           xscale="log", title="MHA, GQA, MQA")


HEADS = Experiment(_NAME, _CLAIM, _run, _figure)
