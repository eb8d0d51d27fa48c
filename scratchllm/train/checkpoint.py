"""Training checkpoints: one directory, written so that a crash never leaves a half-written one,
and `atomic_write`, the one writer every file of the project that must not be torn goes through.

    DIR/config.json      the ModelConfig (written once per run)
    DIR/tokenizer.bpe    the tokenizer (written once per run)
    DIR/state.npz        weights, MoE buffers, optimizer moments, step, loss history, RNG
                         state: everything that changes, in ONE file written to a temp name
                         and os.replace'd in, so a reader sees the previous state or the new
                         one, never a mix.

Loading checks the config against the model's and every array's name and shape, and turns a
truncated or corrupt file into a CheckpointError that says which file and what to do.
"""
import json
import os
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scratchllm.lm import LM, ModelConfig
from scratchllm.tokenizer import TOKENIZER_FILE, Tokenizer

STATE = "state.npz"
CONFIG = "config.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, or made for another config."""


def atomic_write(path, write):
    """Write `path` so that readers see the old file or the new one, never a torn one:
    write(tmp) fills the temporary path `path`.tmp-PID, which is flushed to disk and then
    os.replace'd over `path`. A failure leaves no temporary file behind."""
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes(path, data):
    """atomic_write of a bytes payload."""
    atomic_write(path, lambda tmp: Path(tmp).write_bytes(data))


def write_config(directory, config_dict):
    """Write DIR/config.json atomically (creating DIR)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    text = json.dumps(config_dict, indent=2, sort_keys=True).encode()
    write_bytes(Path(directory) / CONFIG, text)


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
    atomic_write(Path(directory) / STATE, lambda tmp: _savez(tmp, payload))


def _savez(path, payload):
    with open(path, "wb") as f:  # a file object: np.savez would append .npz to a name
        np.savez(f, **payload)


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


# ---------------------------------------------------------------------------- runs
def save_run(run, directory, tokenizer=None):
    """Atomically write a training run's checkpoint: config and tokenizer once, then
    state.npz with everything that changes (run: a train.trainer.Run)."""
    directory = Path(directory)
    if not (directory / CONFIG).is_file():
        write_config(directory, run.cfg.to_dict())
    if tokenizer is not None and not (directory / TOKENIZER_FILE).exists():
        atomic_write(directory / TOKENIZER_FILE, lambda tmp: tokenizer.save(str(tmp)))
    arrays = {f"model.{n}": p.data for n, p in run.model.named_parameters()}
    arrays.update({f"buffer.{n}": b for n, b in run.model.named_buffers()})
    arrays.update({f"opt.{k}": v for k, v in run.opt.state_dict().items()})
    arrays["losses"] = np.asarray(run.losses, dtype=np.float64)
    arrays["evals"] = np.asarray(run.evals, dtype=np.float64).reshape(-1, 2)
    meta = {"step": run.step, "rng": run.rng.bit_generator.state,
            "settings": asdict(run.s), "dtype": str(run.model.dtype), "data": run.data}
    save_state(directory, arrays, meta)


def load_run(run, directory):
    """Restore everything save_run wrote into `run`; CheckpointError on any mismatch."""
    arrays, meta = load_state(directory)
    where = str(Path(directory) / STATE)
    if meta.get("dtype") != str(run.model.dtype):
        raise CheckpointError(f"checkpoint: {where} holds {meta.get('dtype')} weights, this "
                              f"run uses {run.model.dtype}")
    _assign_model(run.model, arrays, where)
    opt_state = {k[4:]: v for k, v in arrays.items() if k.startswith("opt.")}
    try:
        run.opt.load_state_dict(opt_state)
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"checkpoint: {where} optimizer state does not match this model "
                              f"({e})") from None
    run.rng.bit_generator.state = meta["rng"]
    run.step = int(meta["step"])
    run.losses = [float(v) for v in arrays["losses"]]
    run.evals = [(int(a), float(b)) for a, b in arrays["evals"]]


def load_model(directory, dtype=None):
    """(model, tokenizer, meta) from a checkpoint directory, for sampling."""
    cfg = ModelConfig.from_dict(read_config(directory))
    arrays, meta = load_state(directory)
    dtype = np.dtype(meta.get("dtype", "float32") if dtype is None else dtype)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=dtype)
    _assign_model(model, arrays, str(Path(directory) / STATE))
    return model, Tokenizer.load(str(Path(directory) / TOKENIZER_FILE)), meta


def _assign_model(model, arrays, where):
    assign([(n, p.data) for n, p in model.named_parameters()], arrays, "model.", where)
    assign(list(model.named_buffers()), arrays, "buffer.", where)
