"""A checkpoint is one unit: every save rewrites config, tokenizer and state, state.npz's
manifest names them by hash, and loading verifies it. Each scenario of a directory that
disagreed with its own weights is now an error or consistent; killed writes' temp files are
removed by the next save."""
import json
import os

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.core.atomic import remove_stale_temps
from scratchllm.tokenizer import TOKENIZER_FILE, Tokenizer
from scratchllm.train import checkpoint, trainer

IDS = np.random.default_rng(0).integers(0, 23, 300)


def _run(name="dense", **overrides):
    s = trainer.Settings(batch_size=2, seq_len=8, steps=4, warmup=1, threads=1)
    run = trainer.Run(lm_tiny(name, **overrides), s)
    run.train_step(IDS)
    return run


def _tokenizer(extra=b""):
    merges = [(b"a", b"b")] + ([(b"ab", extra)] if extra else [])
    vocab = {b: bytes([b]) for b in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return Tokenizer(vocab, merges)


def test_a_kill_during_the_first_save_then_another_preset_is_consistent(tmp_path, monkeypatch):
    def killed(f, **arrays):
        f.write(b"PK\x03\x04 half")
        raise KeyboardInterrupt  # as a kill: config and tokenizer are on disk, state is not

    monkeypatch.setattr(checkpoint.np, "savez", killed)
    with pytest.raises(KeyboardInterrupt):
        _run("swa").save(tmp_path, _tokenizer())
    monkeypatch.undo()
    assert json.loads((tmp_path / "config.json").read_text())["window"] is not None
    with pytest.raises(checkpoint.CheckpointError, match="no state.npz"):
        checkpoint.load_model(tmp_path)
    dead = tmp_path / "state.npz.tmp-999999999"  # a killed writer's 12 MB leftover
    dead.write_bytes(b"x" * 100)
    _run("dense").save(tmp_path, _tokenizer())
    model, _, _ = checkpoint.load_model(tmp_path)
    assert model.cfg.window is None and model.cfg.name == "dense"
    assert not dead.exists() and not list(tmp_path.glob("*.tmp-*"))


def test_a_deleted_state_then_a_new_run_rewrites_config_and_tokenizer(tmp_path):
    _run("swa").save(tmp_path, _tokenizer(b"c"))
    (tmp_path / checkpoint.STATE).unlink()
    _run("dense").save(tmp_path, _tokenizer())
    model, tok, _ = checkpoint.load_model(tmp_path)
    assert model.cfg.window is None and len(tok.merges) == 1


@pytest.mark.parametrize("field, value", [("rope_base", 500000.0), ("window", 4),
                                          ("norm_eps", 1e-6)])
def test_an_edited_config_whose_shapes_still_match_is_an_error(tmp_path, field, value):
    _run().save(tmp_path, _tokenizer())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg[field] = value
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"config.json does not match the checkpoint's manifest"):
        checkpoint.load_model(tmp_path)
    with pytest.raises(checkpoint.CheckpointError, match=r"config.json does not match"):
        _run().load(tmp_path)


def test_a_foreign_or_missing_tokenizer_is_an_error(tmp_path):
    _run().save(tmp_path, _tokenizer())
    _tokenizer(b"c").save(str(tmp_path / TOKENIZER_FILE))
    with pytest.raises(checkpoint.CheckpointError, match=r"tokenizer.bpe does not match"):
        checkpoint.load_model(tmp_path)
    os.remove(tmp_path / TOKENIZER_FILE)
    with pytest.raises(checkpoint.CheckpointError, match=r"tokenizer.bpe is missing"):
        checkpoint.load_model(tmp_path)


def test_resume_with_the_tokenizer_of_other_data_is_an_error(tmp_path):
    _run().save(tmp_path, _tokenizer())
    meta = checkpoint.load_state(tmp_path)[1]
    checkpoint.check_tokenizer(tmp_path, _tokenizer(), meta)  # the same: fine
    with pytest.raises(checkpoint.CheckpointError, match=r"the tokenizer of this data differs"):
        checkpoint.check_tokenizer(tmp_path, _tokenizer(b"c"), meta)


def test_an_altered_array_is_an_error(tmp_path):
    _run().save(tmp_path)
    arrays, meta = checkpoint.load_state(tmp_path)
    arrays["model.norm.g"] = arrays["model.norm.g"] * 2
    checkpoint.save_state(tmp_path, arrays, meta)
    with pytest.raises(checkpoint.CheckpointError, match=r"\['model.norm.g'\] do not match"):
        _run().load(tmp_path)


def test_remove_stale_temps_keeps_live_writers_files(tmp_path):
    mine = tmp_path / f"x.tmp-{os.getpid()}"
    dead = tmp_path / "y.tmp-999999999"
    for f in (mine, dead):
        f.write_bytes(b"1")
    assert remove_stale_temps(tmp_path) == 1
    assert mine.exists() and not dead.exists()
