"""A checkpoint is one unit: every save rewrites config, tokenizer and state, state.npz's
manifest names them by hash, and loading verifies it. Each scenario of a directory that
disagreed with its own weights is now an error or consistent; killed writes' temp files are
removed by the next save."""
import json
import os
from dataclasses import asdict

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.core.atomic import remove_stale_temps
from scratchllm.specs import from_dict, from_flat, to_dict
from scratchllm.specs.unflat import flat_view
from scratchllm.tokenizer import TOKENIZER_FILE, Tokenizer
from scratchllm.train import checkpoint, trainer
from scratchllm.train.settings import Settings

IDS = np.random.default_rng(0).integers(0, 23, 300)


def _run(name="dense", **overrides):
    s = Settings(batch_size=2, seq_len=8, steps=4, warmup=1, threads=1)
    run = trainer.Run(lm_tiny(name, **overrides), s)
    run.train_step(IDS)
    return run


def _config(directory):
    """The flat view of the config.json in directory."""
    return flat_view(from_dict(json.loads((directory / "config.json").read_text())))


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
    assert _config(tmp_path).window is not None
    with pytest.raises(checkpoint.CheckpointError, match="no state.npz"):
        checkpoint.load_model(tmp_path)
    dead = tmp_path / "state.npz.tmp-999999999"  # a killed writer's 12 MB leftover
    dead.write_bytes(b"x" * 100)
    _run("dense").save(tmp_path, _tokenizer())
    model, _, _ = checkpoint.load_model(tmp_path)
    assert flat_view(model.cfg).window is None and model.cfg.name == "dense"
    assert not dead.exists() and not list(tmp_path.glob("*.tmp-*"))


def test_a_deleted_state_then_a_new_run_rewrites_config_and_tokenizer(tmp_path):
    _run("swa").save(tmp_path, _tokenizer(b"c"))
    (tmp_path / checkpoint.STATE).unlink()
    _run("dense").save(tmp_path, _tokenizer())
    model, tok, _ = checkpoint.load_model(tmp_path)
    assert flat_view(model.cfg).window is None and len(tok.merges) == 1


@pytest.mark.parametrize("field, value", [("rope_base", 500000.0), ("window", 4),
                                          ("norm_eps", 1e-6)])
def test_an_edited_config_whose_shapes_still_match_is_an_error(tmp_path, field, value):
    _run().save(tmp_path, _tokenizer())
    flat = asdict(_config(tmp_path))
    flat[field] = value
    (tmp_path / "config.json").write_text(json.dumps(to_dict(from_flat(**flat))))
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


# config.json of a checkpoint written before specs: the flat dict of the first format (every
# field of the old ModelConfig), here lm_tiny("swa")'s
FLAT_SWA = {
    "attention": "gqa", "attn_impl": "sdpa", "attn_scale": None, "attn_sinks": False,
    "balance_coef": 0.01, "bias_gamma": 0.0, "block": "pre", "capacity_factor": None,
    "d_conv": 4, "d_ff": 12, "d_model": 16, "d_state": 4, "dense_d_ff": None, "dt_rank": None,
    "embed_scale": False, "expand": 2, "experts": "swiglu", "ffn": "swiglu",
    "first_k_dense": 0, "gelu_approx": "tanh", "head_dim": None, "kv_lora_rank": 6,
    "layer_pattern": None, "layer_types": None, "mamba_inner_norms": False,
    "max_positions": 1024, "moe_every": 1, "moe_offset": None, "n_experts": 4, "n_group": 1,
    "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "n_shared": 0, "n_sink": 1, "name": "swa",
    "norm": "rmsnorm", "norm_eps": 1e-05, "norm_offset": 0.0, "norm_topk_prob": True,
    "o_bias": False, "positions": "rope", "q_lora_rank": 0, "qk_nope_head_dim": 4,
    "qk_norm": False, "qk_rope_head_dim": 4, "qkv_bias": False, "rope_base": 10000.0,
    "rope_local_base": None, "rope_scaling": None, "rope_style": "half",
    "routed_scaling_factor": 1.0, "router_bias": False, "score": "softmax",
    "swiglu_alpha": 1.702, "swiglu_limit": 7.0, "tie_embeddings": False, "top_k": 2,
    "topk_group": 1, "v_head_dim": 6, "vocab_size": 23, "window": 3, "z_coef": 0.001}


def _replace_config(directory, config):
    """config.json := config, and state.npz's manifest re-signed to match (as a checkpoint
    that was written with that config.json)."""
    (directory / "config.json").write_text(json.dumps(config))
    arrays, meta = checkpoint.load_state(directory)
    meta["manifest"] = checkpoint.manifest(directory, arrays)
    checkpoint.save_state(directory, arrays, meta)


def test_config_json_is_format_2_and_the_flat_first_format_loads_to_the_same_model(tmp_path):
    run = _run("swa")
    run.save(tmp_path, _tokenizer())
    assert json.loads((tmp_path / "config.json").read_text())["format"] == 2
    new, _, _ = checkpoint.load_model(tmp_path)
    _replace_config(tmp_path, FLAT_SWA)
    old, _, _ = checkpoint.load_model(tmp_path)
    assert old.cfg == new.cfg == run.cfg
    assert [(n, p.data.tolist()) for n, p in old.named_parameters()] == \
        [(n, p.data.tolist()) for n, p in new.named_parameters()]
    ids = IDS[None, :9]
    assert np.array_equal(old.forward(ids)[0], run.model.forward(ids)[0])


def test_a_config_json_of_a_future_format_is_refused_naming_the_version(tmp_path):
    _run().save(tmp_path, _tokenizer())
    config = json.loads((tmp_path / "config.json").read_text())
    _replace_config(tmp_path, dict(config, format=3))
    with pytest.raises(checkpoint.CheckpointError,
                       match=r"config.json: config: format 3 is not one this version reads "
                             r"\(2, or the flat first format\); upgrade scratchllm"):
        checkpoint.load_model(tmp_path)



def _writes_of_a_save(tmp_path, monkeypatch):
    """The files one save writes, in order, counted on a real save (config, tokenizer, state)."""
    written = []
    real = checkpoint.atomic_write
    monkeypatch.setattr(checkpoint, "atomic_write",
                        lambda path, write: written.append(path.name) or real(path, write))
    monkeypatch.setattr(checkpoint, "write_bytes", lambda path, data: checkpoint.atomic_write(
        path, lambda tmp: tmp.write_bytes(data)))
    _run().save(tmp_path / "count", _tokenizer())
    monkeypatch.undo()
    return written


def _die_at(monkeypatch, k):
    """Make the k-th atomic write of the next save die as a SIGKILL would: its temp file stays
    on disk and nothing after it runs (KeyboardInterrupt stands in for the signal)."""
    calls = []
    real = checkpoint.atomic_write

    def dying(path, write):
        calls.append(path)
        if len(calls) < k:
            return real(path, write)
        write(type(path)(f"{path}.tmp-999999999"))  # a dead PID's leftover
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "atomic_write", dying)
    monkeypatch.setattr(checkpoint, "write_bytes",
                        lambda path, data: dying(path, lambda tmp: tmp.write_bytes(data)))


@pytest.mark.parametrize("saved_before", [False, True])
def test_a_kill_at_every_write_of_a_save_leaves_a_resumable_or_clearly_unsaved_directory(
        tmp_path, monkeypatch, saved_before):
    """Every point a save can die at (each of its atomic writes, counted on a real save):
    afterwards the directory loads as the previous save, whole, or, when there was none, the
    error says the run never saved; the next save removes the dead write's temp file."""
    writes = _writes_of_a_save(tmp_path, monkeypatch)
    assert writes == ["config.json", TOKENIZER_FILE, "state.npz"]
    out = tmp_path / "run"
    first = _run()
    if saved_before:
        first.save(out, _tokenizer())
    for k in range(1, len(writes) + 1):
        later = _run()
        later.train_step(IDS)
        _die_at(monkeypatch, k)
        with pytest.raises(KeyboardInterrupt):
            later.save(out, _tokenizer())
        monkeypatch.undo()
        assert [p.name for p in out.glob("*.tmp-*")] == [f"{writes[k - 1]}.tmp-999999999"]
        if saved_before:
            arrays, meta = checkpoint.load_state(out)
            checkpoint.verify(out, arrays, meta)
            assert meta["step"] == first.step
        else:
            with pytest.raises(checkpoint.CheckpointError,
                               match="stopped before its first save finished"):
                checkpoint.load_model(out)
        (out / f"{writes[k - 1]}.tmp-999999999").unlink()
    (out / "state.npz.tmp-999999999").write_bytes(b"x" * 100)
    _run().save(out, _tokenizer())
    assert not list(out.glob("*.tmp-*"))
    assert checkpoint.load_model(out)[2]["step"] == 1


def test_metadata_without_any_one_of_its_keys_is_an_error_naming_it(tmp_path):
    _run().save(tmp_path, _tokenizer())
    arrays, meta = checkpoint.load_state(tmp_path)
    assert set(checkpoint.META_KEYS) <= set(meta)
    for key in checkpoint.META_KEYS:  # generated from what a save writes
        checkpoint.save_state(tmp_path, arrays, {k: v for k, v in meta.items() if k != key})
        with pytest.raises(checkpoint.CheckpointError, match=rf"lacks \['{key}'\] in its metadata"):
            checkpoint.load_model(tmp_path)
    checkpoint.save_state(tmp_path, arrays, [1, 2])  # not even an object
    with pytest.raises(checkpoint.CheckpointError, match="lacks .* in its metadata"):
        checkpoint.load_state(tmp_path)
