"""Sweep of the default train run's settings and model size: the validation loss against the
unigram baseline, the training time and the median step, per setting (the path of `python -m
scratchllm train`: Run + fit on the bundled corpus, tokenizer cached in CACHE_DIR).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/sweep_train.py CACHE_DIR \
        steps=600,batch_size=16,lr=8e-3  steps=900,lr=1.2e-2,final_lr=0  d_model=96,...

Each setting is comma-separated name=value pairs: Settings fields (steps, batch_size, seq_len,
lr, warmup, final_lr, weight_decay, eval_every, threads, optimizer, muon_lr, ...) and the dense
preset's flat names (d_model, n_layers, d_ff, n_heads, n_kv_heads, ...). The validation loss is
deterministic; the times swing with the machine's load, so compare them only within one run.

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
from scratchllm.train.trainer import Run, Settings, evaluate, fit

SETTINGS = {f.name for f in fields(Settings)}


def _value(text):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"True": True, "False": False}.get(text, text)


def parse(spec):
    """'steps=900,d_model=96' -> ({Settings overrides}, {flat-name overrides})."""
    pairs = dict(kv.split("=", 1) for kv in spec.split(",") if kv)
    s = {k: _value(v) for k, v in pairs.items() if k in SETTINGS}
    m = {k: _value(v) for k, v in pairs.items() if k not in SETTINGS}
    return s, m


def main(cache, specs):
    t0 = time.perf_counter()
    cfg = preset("dense")
    tok, ids, _ = corpus.prepare(str(corpus.DEFAULT_CORPUS), cfg.vocab_size, Path(cache))
    train_ids, val_ids = corpus.split(ids)
    base = corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
    print(f"prepare {time.perf_counter() - t0:.0f} s, baseline {base:.4f}, "
          f"train tokens {len(train_ids):,}", flush=True)
    for spec in specs:
        over, model = parse(spec)
        s = Settings(**over)
        s.warmup = min(s.warmup, s.steps)
        run = Run(preset("dense", **model), s)
        t = time.perf_counter()
        fit(run, train_ids, val_ids, progress=False, log=lambda *_: None)
        tt = time.perf_counter() - t
        val = evaluate(run.model, corpus.eval_batches(val_ids, s.batch_size, s.seq_len,
                                                      s.eval_tokens), run.dp)
        run.dp.close()
        print(f"{spec}: val {val:.4f} = {val / base:.4f} x unigram; "
              f"{run.model.n_params():,} params; train {tt:.0f} s; median step "
              f"{np.median(run.step_seconds) * 1e3:.0f} ms", flush=True)


def stepcost(cache, specs, rounds=7, steps=10):
    """Median seconds per step of each spec, interleaved round by round; printed per token
    against the first spec's."""
    cfg = preset("dense")
    tok, ids, _ = corpus.prepare(str(corpus.DEFAULT_CORPUS), cfg.vocab_size, Path(cache))
    train_ids, _ = corpus.split(ids)
    runs = []
    for spec in specs:
        over, model = parse(spec)
        s = Settings(**{**over, "steps": 10 ** 6})
        runs.append(Run(preset("dense", **model), s))
    for run in runs:  # compile and warm
        run.train_step(train_ids)
        run.step_seconds.clear()
    for _ in range(rounds):
        for run in runs:
            for _ in range(steps):
                run.train_step(train_ids)
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
