"""Training checkpoints: one directory, written so that a crash never leaves a half-written one.

    DIR/config.json      the ModelConfig (written once per run)
    DIR/tokenizer.*      the tokenizer files (written once per run)
    DIR/state.npz        weights, optimizer moments, step, loss history, RNG state: everything
                         that changes, in ONE file written to a temp name and os.replace'd in,
                         so a reader sees either the previous state or the new one, never a mix.

Loading checks the config against the model's and every array's name and shape, and turns a
truncated or corrupt file into a CheckpointError that says which file and what to do.
"""
import json
import os
import zipfile
from pathlib import Path

import numpy as np

STATE = "state.npz"
CONFIG = "config.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, or made for another config."""


def _atomic_write(path, write):
    """write(f) into path.tmp-PID, flush to disk, then os.replace it over `path`."""
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_config(directory, config_dict):
    """Write DIR/config.json atomically (creating DIR)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    text = json.dumps(config_dict, indent=2, sort_keys=True).encode()
    _atomic_write(Path(directory) / CONFIG, lambda f: f.write(text))


def read_config(directory):
    path = Path(directory) / CONFIG
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no {CONFIG} in {str(directory)!r}; is it a "
                              f"checkpoint directory written by `python -m scratchllm train`?")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint: {path} is corrupt ({e}); delete the directory "
                              f"and train again") from None


def save_state(directory, arrays, meta):
    """Write DIR/state.npz atomically: `arrays` (name -> ndarray) plus `meta` (a JSON-able
    dict: step, RNG state, losses ...) stored as the JSON string entry `__meta__`."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    payload = dict(arrays)
    payload["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    _atomic_write(Path(directory) / STATE, lambda f: np.savez(f, **payload))


def load_state(directory):
    """Read DIR/state.npz -> (arrays dict, meta dict); CheckpointError if missing or corrupt."""
    path = Path(directory) / STATE
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no {STATE} in {str(directory)!r}")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError) as e:
        raise CheckpointError(f"checkpoint: {path} is corrupt or truncated ({type(e).__name__}: "
                              f"{e}); restore it from a backup or train again") from None
    return arrays, meta


def assign(params, arrays, prefix, where):
    """Copy arrays[prefix + name] into each (name, Param.data) in place, checking the names
    and shapes; CheckpointError names the first mismatch."""
    params = list(params)
    wanted = {prefix + name for name, _ in params}
    have = {k for k in arrays if k.startswith(prefix)}
    if wanted != have:
        missing, extra = sorted(wanted - have), sorted(have - wanted)
        raise CheckpointError(f"checkpoint: {where} does not match this model: missing "
                              f"{missing[:3]}, unexpected {extra[:3]}")
    for name, target in params:
        src = arrays[prefix + name]
        if src.shape != target.shape:
            raise CheckpointError(f"checkpoint: {where} entry {prefix + name} has shape "
                                  f"{src.shape}, the model expects {target.shape}")
        target[...] = src
