"""Training checkpoints: one directory, written so that a crash never leaves a half-written one,
each file written by core/atomic.py's atomic_write.

    DIR/config.json      the ModelConfig (scratchllm.specs.to_dict; a flat config of the
                         first format, from older checkpoints, still loads)
    DIR/tokenizer.bpe    the tokenizer
    DIR/state.npz        weights, MoE buffers, optimizer moments, step, loss history, RNG
                         state, and the manifest: the SHA-256 of config.json, tokenizer.bpe and
                         of every array. Written last, to a temp name, then os.replace'd in.

The checkpoint is one unit: every save rewrites all three files (each atomically), and
state.npz, the commit point, names the exact config and tokenizer it was saved with. Loading
verifies the manifest, so a stale file (a config left by another run, an edited config, a
tokenizer from other data) is an error, never a silent mix; a kill during a save leaves the
previous state.npz, whose manifest still matches. Temp files of killed writes are removed by
the next save. Loading also checks every array's name and shape and that it is finite, and
turns a truncated or corrupt file into a CheckpointError that says which file and what to do.
"""
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scratchllm.core.atomic import atomic_write, remove_stale_temps, write_bytes
from scratchllm.lm import LM
from scratchllm.specs import from_dict, to_dict
from scratchllm.tokenizer import TOKENIZER_FILE, Tokenizer

STATE = "state.npz"
CONFIG = "config.json"
META_KEYS = ("step", "rng", "settings", "dtype", "manifest")  # what save_run writes and reads


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, corrupt, or made for another config."""


def write_config(directory, cfg):
    """Write the ModelConfig to DIR/config.json atomically (creating DIR)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_dict(cfg), indent=2, sort_keys=True).encode()
    write_bytes(Path(directory) / CONFIG, text)


def read_config(directory):
    """The ModelConfig of DIR/config.json (either format); CheckpointError naming the file
    if it is missing, corrupt, or of a format this version does not read."""
    path = Path(directory) / CONFIG
    if not path.is_file() and any(Path(directory).glob("*.tmp-*")):
        raise CheckpointError(_no_state(Path(directory)))
    if not path.is_file():
        raise CheckpointError(f"checkpoint: no {CONFIG} in {str(directory)!r}; is it a "
                              f"checkpoint directory written by `python -m scratchllm train`?")
    try:
        return from_dict(json.loads(path.read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint: {path} is corrupt ({e}); delete the directory "
                              f"and train again") from None
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"checkpoint: {path}: {e}") from None


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
        raise CheckpointError(_no_state(Path(directory)))
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays.pop("__meta__").tobytes().decode())
    except (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError) as e:
        raise CheckpointError(f"checkpoint: {path} is corrupt or truncated ({type(e).__name__}: "
                              f"{e}); restore it from a backup or train again") from None
    missing = [k for k in META_KEYS if k not in meta] if isinstance(meta, dict) else META_KEYS
    if missing:
        raise CheckpointError(f"checkpoint: {path} lacks {list(missing)} in its metadata (an "
                              f"older version wrote it, or it was altered); train again")
    for name, a in arrays.items():
        if np.issubdtype(a.dtype, np.floating) and not np.isfinite(a).all():
            raise CheckpointError(f"checkpoint: {path} entry {name} holds NaN or inf "
                                  f"({int((~np.isfinite(a)).sum())} of {a.size} values); the "
                                  f"run it came from diverged or the file was altered")
    return arrays, meta


def _no_state(directory):
    """Why DIR has no state.npz: never a checkpoint, or a run stopped before its first save
    finished (config.json and the tokenizer are written first, state.npz last, each through
    a temp file)."""
    began = (directory / CONFIG).is_file() or any(directory.glob("*.tmp-*"))
    if not began:
        return f"checkpoint: no {STATE} in {str(directory)!r}"
    return (f"checkpoint: no {STATE} in {str(directory)!r}: the run that wrote there was "
            f"stopped before its first save finished, so there is nothing to resume; train "
            f"again without --resume (the files there are replaced)")


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
def save_run(run, directory, tokenizer=None, opt_state=None, model=None):
    """Atomically write a training run's checkpoint: config and tokenizer once, then
    state.npz with everything that changes (run: a train.trainer.Run). opt_state: the
    optimizer's state_dict when the caller gathered it (ZeRO), else run.opt's; model: the
    whole model when run.model is one rank's slice of it (tensor parallel), else run.model."""
    model = run.model if model is None else model
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(directory)
    write_config(directory, run.cfg)
    if tokenizer is not None:
        atomic_write(directory / TOKENIZER_FILE, lambda tmp: tokenizer.save(str(tmp)))
    else:
        (directory / TOKENIZER_FILE).unlink(missing_ok=True)  # never a stale one
    arrays = {f"model.{n}": p.data for n, p in model.named_parameters()}
    arrays.update({f"buffer.{n}": b for n, b in model.named_buffers()})
    opt_state = run.opt.state_dict() if opt_state is None else opt_state
    arrays.update({f"opt.{k}": v for k, v in opt_state.items()})
    arrays["losses"] = np.asarray(run.losses, dtype=np.float64)
    arrays["evals"] = np.asarray(run.evals, dtype=np.float64).reshape(-1, 2)
    meta = {"step": run.step, "rng": run.rng.bit_generator.state,
            "settings": asdict(run.s), "dtype": str(model.dtype), "data": run.data,
            "manifest": manifest(directory, arrays)}
    save_state(directory, arrays, meta)


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def manifest(directory, arrays):
    """{file or array name: SHA-256} of config.json, tokenizer.bpe (None if absent) and every
    array: what state.npz commits to."""
    files = {name: _sha256((Path(directory) / name).read_bytes())
             if (Path(directory) / name).is_file() else None
             for name in (CONFIG, TOKENIZER_FILE)}
    return {"files": files, "arrays": {k: _sha256(np.ascontiguousarray(v).tobytes())
                                       for k, v in arrays.items()}}


def check_tokenizer(directory, tokenizer, meta):
    """CheckpointError unless `tokenizer` serialises to the checkpoint's tokenizer.bpe (the
    ids the weights were trained on): e.g. --resume with --data of another text."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(os.path.join(tmp, TOKENIZER_FILE))
        digest = _sha256(Path(tmp, TOKENIZER_FILE).read_bytes())
    if digest != meta.get("manifest", {}).get("files", {}).get(TOKENIZER_FILE):
        raise CheckpointError(f"checkpoint: the tokenizer of this data differs from the one in "
                              f"{Path(directory) / TOKENIZER_FILE} that the weights were trained "
                              f"with (was {meta.get('data')!r}); resume with that --data, or "
                              f"train into another --out")


def verify(directory, arrays, meta):
    """CheckpointError unless config.json, tokenizer.bpe and the arrays are exactly what
    state.npz's manifest names (a stale, edited or foreign file, or a torn save)."""
    where = Path(directory) / STATE
    want = meta.get("manifest")
    if want is None:
        raise CheckpointError(f"checkpoint: {where} has no manifest (written by an older "
                              f"version); train again")
    have = manifest(directory, arrays)
    for name, digest in want["files"].items():
        if have["files"][name] != digest:
            state = "is missing" if have["files"][name] is None else (
                "is there but the checkpoint has none" if digest is None else
                "does not match the checkpoint's manifest")
            raise CheckpointError(f"checkpoint: {Path(directory) / name} {state} (edited, left "
                                  f"by another run, or a save was interrupted); restore it or "
                                  f"train again into an empty --out")
    if have["arrays"] != want["arrays"]:
        bad = sorted(set(have["arrays"]) ^ set(want["arrays"]) | {
            k for k in have["arrays"] if want["arrays"].get(k) != have["arrays"][k]})
        raise CheckpointError(f"checkpoint: {where} entries {bad[:3]} do not match its "
                              f"manifest; the file was altered")


def load_run(run, directory):
    """Restore everything save_run wrote into `run`; CheckpointError on any mismatch."""
    arrays, meta = load_state(directory)
    verify(directory, arrays, meta)
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
    arrays, meta = load_state(directory)
    verify(directory, arrays, meta)
    cfg = read_config(directory)
    dtype = np.dtype(meta.get("dtype", "float32") if dtype is None else dtype)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=dtype)
    _assign_model(model, arrays, str(Path(directory) / STATE))
    return model, Tokenizer.load(str(Path(directory) / TOKENIZER_FILE)), meta


def _assign_model(model, arrays, where):
    assign([(n, p.data) for n, p in model.named_parameters()], arrays, "model.", where)
    assign(list(model.named_buffers()), arrays, "buffer.", where)
