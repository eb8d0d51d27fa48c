"""Cold start of the default run: seconds from this process's start to the beginning and end
of its first training step (the path of `python -m scratchllm train` without its warm-up
processes: corpus.prepare with the tokenizer cache in CACHE_DIR, Run of the first run's model
and settings, train_step), and the second step.

    NUMBA_CACHE_DIR=$(mktemp -d) flock /tmp/scratchllm-bench.lock nice -n -15 \
        python benchmarks/cold_start.py runs/cache      (an empty Numba cache: cold)

The whole first run as a new user meets it (a fresh clone: no __pycache__, so no Numba cache,
and no runs/cache, so the BPE tokenizer trains; the run's last line says where the time and
the CPU seconds went):

    rm -rf /tmp/cold && git clone -q /work/main /tmp/cold && cd /tmp/cold && \
        flock /tmp/scratchllm-bench.lock /usr/bin/time -v python -m scratchllm train
"""
import os
import sys
import time
from pathlib import Path

t_proc = float(open(f"/proc/{os.getpid()}/stat").read().split()[21]) / os.sysconf("SC_CLK_TCK")
boot = time.time() - float(open("/proc/uptime").read().split()[0])
t0 = boot + t_proc  # the process's start, wall clock
from scratchllm.train import corpus  # noqa: E402
from scratchllm.train.settings import first_run, first_run_model  # noqa: E402
from scratchllm.train.trainer import Run  # noqa: E402
cfg = first_run_model()
tok, ids, _ = corpus.prepare(str(corpus.DEFAULT_CORPUS), cfg.vocab_size, Path(sys.argv[1]))
train_ids, val_ids = corpus.split(ids)
corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
run = Run(cfg, first_run())
t1 = time.time()
run.train_step(train_ids)
t2 = time.time()
run.train_step(train_ids)
t3 = time.time()
print(f"first step begins {t1 - t0:.1f} s after the process started, takes {t2 - t1:.1f} s; "
      f"second step {t3 - t2:.2f} s")
