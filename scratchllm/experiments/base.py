"""What every experiment shares: its result (Outcome), the modes (smoke, quick, full), the
byte-level corpus the trained experiments read, JSON-ready metrics and the results writer.

An experiment is an Experiment(name, claim, run, figure), one module each: claim the chapter's
claim in one sentence, run(mode, seed) -> Outcome, figure(fig, outcome) draws on a matplotlib
Figure. Modes: "smoke" (a few
seconds: the fast tests run it), "quick" (under 2 minutes on 2 cores), "full" (the README's
numbers, under 20 minutes).
"""
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from scratchllm.core.atomic import atomic_write
from scratchllm.train import corpus

MODES = ("smoke", "quick", "full")


class Experiment(NamedTuple):
    name: str
    claim: str      # the chapter's claim, one sentence
    run: object     # run(mode, seed) -> Outcome
    figure: object  # figure(fig, outcome): draws on a matplotlib Figure


class Outcome(NamedTuple):
    metrics: dict   # metric name -> number, list, or nested dict with string keys
    config: dict    # what was run (sizes, steps), JSON-ready
    table: str      # the printed table
    verdict: str    # the measured outcome, one sentence, beside the claim


def pick(mode, smoke, quick, full):
    """The value of a setting in `mode`."""
    if mode not in MODES:
        raise ValueError(f"experiment mode must be one of {MODES}, got {mode!r}")
    return {"smoke": smoke, "quick": quick, "full": full}[mode]


def byte_corpus(max_bytes=None):
    """The bundled corpus as byte ids (V = 256; no tokenizer to train), split into
    (train, validation) ids; max_bytes: read only the first max_bytes bytes."""
    data = Path(corpus.DEFAULT_CORPUS).read_bytes()[:max_bytes]
    ids = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    return corpus.split(ids)


def jsonable(value):
    """Metrics as JSON: numpy numbers to floats/ints, arrays to lists, dict keys to strings."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [jsonable(v) for v in value]
    if isinstance(value, (np.integer, int)) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    return value


def write_results(path, outcome, seed):
    """DIR/results.json: {metric: value, ..., "config": ..., "seed": seed}."""
    if {"config", "seed"} & set(outcome.metrics):
        raise ValueError("a metric may not be named 'config' or 'seed'")
    body = dict(jsonable(outcome.metrics), config=jsonable(outcome.config), seed=int(seed))
    text = json.dumps(body, indent=2, sort_keys=True) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path
