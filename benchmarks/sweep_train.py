"""Sweep of the default train run's settings and model size: the validation loss against the
unigram baseline, the training time and the median step, per setting (the path of `python -m
scratchllm train`: Run + fit on the bundled corpus, tokenizer cached in CACHE_DIR).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/sweep_train.py CACHE_DIR \
        steps=600,batch_size=16,lr=8e-3  steps=900,lr=1.2e-2,final_lr=0  d_model=96,...

Each setting is comma-separated name=value pairs: Settings fields (steps, batch_size, seq_len,
lr, warmup, final_lr, weight_decay, eval_every, threads, optimizer, muon_lr, ...) and the dense
preset's flat names (d_model, n_layers, d_ff, n_heads, n_kv_heads, vocab_size, ...; a
vocab_size trains its own tokenizer into CACHE_DIR). The base is Settings() (weight decay 0.1),
not settings.first_run(): give every field that differs. The validation loss is deterministic
for a given `threads` (1 and 2 threads sum the gradients in another order); the times swing
with the machine's load, so compare them only within one run. Besides the ratio to the unigram
baseline each row prints nats per byte of the validated text, which compares across
vocabularies.

    python benchmarks/sweep_train.py CACHE_DIR --stepcost [ROUNDS] SPEC SPEC ...

times the settings' steps instead, interleaved in one process (ROUNDS rounds of 10 steps of
each, default 7): the median step of each per token and its ratio to the first SPEC's, the
cost of a setting side by side with the default in the same minutes.
"""
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

from scratchllm.lm import preset
from scratchllm.train import corpus
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import Run, evaluate, fit

SETTINGS = {f.name for f in fields(Settings)}


def _value(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def parse(spec):
    """'steps=900,d_model=96' -> ({Settings overrides}, {flat-name overrides}); param_groups
    as 'pattern:lr_scale:weight_decay' rules joined by ';' (param_groups=embed.E:10:0)."""
    pairs = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    s = {k: _value(v) for k, v in pairs.items() if k in SETTINGS}
    if "param_groups" in s:
        s["param_groups"] = [[pat, float(lr), float(wd)] for pat, lr, wd in
                             (rule.split(":") for rule in pairs["param_groups"].split(";"))]
    m = {k: _value(v) for k, v in pairs.items() if k not in SETTINGS}
    return s, m


def data(cache, vocab_size):
    """(tokenizer, train ids, val ids, unigram baseline) of the bundled corpus at vocab_size."""
    t0 = time.perf_counter()
    tok, ids, _ = corpus.prepare(str(corpus.DEFAULT_CORPUS), vocab_size, Path(cache))
    train_ids, val_ids = corpus.split(ids)
    base = corpus.unigram_baseline(train_ids, val_ids, vocab_size)
    print(f"prepare (vocab {vocab_size}) {time.perf_counter() - t0:.0f} s, baseline "
          f"{base:.4f}, train tokens {len(train_ids):,}", flush=True)
    return tok, train_ids, val_ids, base


def bytes_per_token(tok, batches):
    """Bytes of text per target token of the evaluation batches (to turn nats per token into
    nats per byte)."""
    lengths = np.zeros(max(tok.vocab) + 1)  # (V,)
    for i, piece in tok.vocab.items():
        lengths[i] = len(piece)
    targets = np.concatenate([y.ravel() for _, y in batches])
    return float(lengths[targets].mean())


def main(cache, specs):
    prepared = {}
    for spec in specs:
        over, model = parse(spec)
        s = Settings(**over)
        s.warmup = min(s.warmup, s.steps)
        cfg = preset("dense", **model)
        if cfg.vocab_size not in prepared:
            prepared[cfg.vocab_size] = data(cache, cfg.vocab_size)
        tok, train_ids, val_ids, base = prepared[cfg.vocab_size]
        run = Run(cfg, s)
        t = time.perf_counter()
        fit(run, train_ids, val_ids, progress=False, log=lambda *_: None)
        tt = time.perf_counter() - t
        batches = corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens)
        val = evaluate(run.model, batches, run.dp)
        run.dp.close()
        print(f"{spec}: val {val:.6f} = {val / base:.4f} x unigram, "
              f"{val / bytes_per_token(tok, batches):.4f} nats/byte; "
              f"{run.model.n_params():,} params; train {tt:.0f} s; median step "
              f"{np.median(run.step_seconds) * 1e3:.0f} ms", flush=True)


def stepcost(cache, specs, rounds=7, steps=10):
    """Median seconds per step of each spec, interleaved round by round; printed per token
    against the first spec's."""
    runs, ids = [], {}
    for spec in specs:
        over, model = parse(spec)
        s = Settings(**{**over, "steps": 10 ** 6})
        cfg = preset("dense", **model)
        if cfg.vocab_size not in ids:
            ids[cfg.vocab_size] = data(cache, cfg.vocab_size)[1]
        runs.append((Run(cfg, s), ids[cfg.vocab_size]))
    for run, train_ids in runs:  # compile and warm
        run.train_step(train_ids)
        run.step_seconds.clear()
    for _ in range(rounds):
        for run, train_ids in runs:
            for _ in range(steps):
                run.train_step(train_ids)
    runs = [run for run, _ in runs]
    per_token = [np.median(r.step_seconds) / (r.s.batch_size * r.s.seq_len) for r in runs]
    for spec, run, pt in zip(specs, runs, per_token):
        print(f"{spec}: median step {np.median(run.step_seconds) * 1e3:.1f} ms, "
              f"{pt / per_token[0]:.3f}x the first's time per token", flush=True)
        run.dp.close()


if __name__ == "__main__":
    if sys.argv[2] == "--stepcost":
        n = int(sys.argv[3]) if sys.argv[3].isdigit() else 7
        stepcost(sys.argv[1], sys.argv[3 + sys.argv[3].isdigit():], rounds=n)
    else:
        main(sys.argv[1], sys.argv[2:])
