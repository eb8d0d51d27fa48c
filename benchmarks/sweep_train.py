"""Sweep of the default train run's steps, batch and peak lr: the validation loss against the
unigram baseline, and the training time, per setting (the path of `python -m scratchllm
train`: Run + fit on the bundled corpus, tokenizer cached in CACHE_DIR).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/sweep_train.py CACHE_DIR \
        600,16,8e-3 900,16,1.2e-2 ...        (steps,batch,lr per setting)
"""
import sys
import time
from pathlib import Path

import numpy as np

from scratchllm.lm import preset
from scratchllm.train import corpus
from scratchllm.train.trainer import Run, Settings, evaluate, fit
t0 = time.perf_counter()
cfg = preset("dense")
tok, ids, _ = corpus.prepare(str(corpus.DEFAULT_CORPUS), cfg.vocab_size,
                             Path(sys.argv[1]))
train_ids, val_ids = corpus.split(ids)
base = corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
print(f"prepare {time.perf_counter() - t0:.0f} s, baseline {base:.4f}, "
      f"train tokens {len(train_ids):,}", flush=True)
for spec in sys.argv[2:]:
    steps, batch, lr = spec.split(",")
    s = Settings(steps=int(steps), batch_size=int(batch), lr=float(lr))
    run = Run(cfg, s)
    t = time.perf_counter()
    fit(run, train_ids, val_ids, progress=False)
    tt = time.perf_counter() - t
    val = evaluate(run.model, corpus.eval_batches(val_ids, s.batch_size, s.seq_len,
                                                  s.eval_tokens), run.dp)
    run.dp.close()
    print(f"steps {steps} batch {batch} lr {lr}: val {val:.4f} = {val / base:.4f} x "
          f"unigram; train {tt:.0f} s; median step {np.median(run.step_seconds) * 1e3:.0f} ms",
          flush=True)
