"""Training, checkpoints and sampling: a short run learns, Ctrl-C + --resume is bit-exact,
a crash mid-save keeps the previous checkpoint, bad checkpoints give clear errors."""
import json
import signal
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.cli import sample as sample_cli, train
from scratchllm.lm import sampling as generate
from scratchllm.train import checkpoint, corpus, trainer
from scratchllm.train.settings import Settings
from scratchllm.lm import LM
from scratchllm.specs import from_dict, from_flat, to_dict
from scratchllm.specs.unflat import flat_view
from scratchllm.tokenizer import TOKENIZER_FILE
from scratchllm.train import DataParallel

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "python-docs-slice.txt"
QUICK = ["--data", str(FIXTURE), "--batch-size", "4", "--seq-len", "32", "--no-progress"]


def _state(out):
    arrays, meta = checkpoint.load_state(out)
    return arrays, meta


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 30-step CLI run of the dense preset on the fixture text (shared by tests)."""
    out = tmp_path_factory.mktemp("run") / "dense"
    code = train.main(QUICK + ["--steps", "30", "--eval-every", "10", "--out", str(out)])
    assert code == 0
    return out


def test_thirty_steps_lower_the_loss(trained):
    arrays, meta = _state(trained)
    losses = arrays["losses"]
    assert meta["step"] == 30 and len(losses) == 30
    assert losses[-5:].mean() < losses[0] - 1.0, losses
    assert (trained / "config.json").is_file() and (trained / TOKENIZER_FILE).is_file()
    assert not list(trained.glob("*.tmp-*"))


def test_ctrl_c_saves_and_resume_is_bit_exact(tmp_path, monkeypatch):
    args = QUICK + ["--steps", "16", "--eval-every", "100"]
    assert train.main(args + ["--out", str(tmp_path / "a")]) == 0
    original = trainer.Run.train_step

    def interrupted_at_7(self, ids):
        out = original(self, ids)
        if self.step == 7:
            signal.raise_signal(signal.SIGINT)  # as if the user pressed Ctrl-C here
        return out

    monkeypatch.setattr(trainer.Run, "train_step", interrupted_at_7)
    assert train.main(args + ["--out", str(tmp_path / "b")]) == 130
    assert _state(tmp_path / "b")[1]["step"] == 7
    monkeypatch.setattr(trainer.Run, "train_step", original)
    assert train.main(["--resume", "--no-progress", "--out", str(tmp_path / "b")]) == 0
    a, b = _state(tmp_path / "a")[0], _state(tmp_path / "b")[0]
    np.testing.assert_array_equal(a["losses"], b["losses"])  # bit-exact, every step
    for name in a:
        if name.startswith("model."):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _tiny_run(seed=0, **settings):
    s = Settings(batch_size=4, seq_len=8, steps=50, warmup=2, seed=seed, **settings)
    return trainer.Run(lm_tiny("moe"), s)


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    ids = np.random.default_rng(0).integers(0, 23, 500)
    run = _tiny_run()
    for _ in range(3):
        run.train_step(ids)
    run.save(tmp_path)
    saved = {n: p.data.copy() for n, p in run.model.named_parameters()}
    run.train_step(ids)

    def dies_halfway(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full (simulated crash)")

    monkeypatch.setattr(checkpoint.np, "savez", dies_halfway)
    with pytest.raises(OSError, match="simulated"):
        run.save(tmp_path)
    monkeypatch.undo()
    fresh = _tiny_run(seed=1)
    fresh.load(tmp_path)
    assert fresh.step == 3
    for n, p in fresh.model.named_parameters():
        np.testing.assert_array_equal(p.data, saved[n], err_msg=n)
    assert not list(tmp_path.glob("*.tmp-*"))


def test_corrupt_checkpoint_is_a_clear_error(trained, tmp_path, capsys):
    out = tmp_path / "copy"
    out.mkdir()
    for f in trained.iterdir():
        if f.is_file():
            (out / f.name).write_bytes(f.read_bytes())
    state = out / checkpoint.STATE
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    with pytest.raises(checkpoint.CheckpointError, match="corrupt or truncated"):
        checkpoint.load_state(out)
    assert train.main(["--resume", "--out", str(out)] + QUICK) == 1
    assert "corrupt or truncated" in capsys.readouterr().err


def test_resume_of_a_run_killed_before_its_first_save_says_so_and_clears_its_temps(
        trained, tmp_path, capsys):
    out = tmp_path / "killed"
    out.mkdir()
    (out / "config.json").write_bytes((trained / "config.json").read_bytes())
    (out / "state.npz.tmp-999999999").write_bytes(b"PK half")  # the kill's leftover
    assert train.main(["--resume", "--out", str(out)] + QUICK) == 1
    assert "stopped before its first save finished" in capsys.readouterr().err
    assert not list(out.glob("*.tmp-*"))


def test_mismatched_config_is_a_clear_error(trained, tmp_path, capsys):
    assert train.main(["--resume", "--preset", "moe", "--out", str(trained)] + QUICK) == 1
    assert "does not match the checkpoint" in capsys.readouterr().err
    flat = asdict(flat_view(from_dict(json.loads((trained / "config.json").read_text()))))
    flat["d_ff"] += 8
    (tmp_path / "config.json").write_text(json.dumps(to_dict(from_flat(**flat))))
    (tmp_path / checkpoint.STATE).write_bytes((trained / checkpoint.STATE).read_bytes())
    (tmp_path / TOKENIZER_FILE).write_bytes((trained / TOKENIZER_FILE).read_bytes())
    with pytest.raises(checkpoint.CheckpointError, match="config.json does not match the "
                                                         "checkpoint's manifest"):
        checkpoint.load_model(tmp_path)
    assert train.main(["--out", str(trained)] + QUICK) == 1  # exists, no --resume
    assert "--resume" in capsys.readouterr().err


def test_sample_command_streams_deterministic_text(trained, capsys):
    args = ["--checkpoint", str(trained), "--prompt", "The ", "--max-tokens", "12",
            "--seed", "3"]
    assert sample_cli.main(args) == 0
    first = capsys.readouterr().out
    assert sample_cli.main(args) == 0
    assert capsys.readouterr().out == first and first.startswith("The ")


def test_sample_prompt_is_ordinary_text_unless_allow_special(trained, monkeypatch):
    """The forgery: a prompt typing "<|endoftext|>" must not become the control token."""
    seen = []

    def record(model, prompt_ids, *args, **kwargs):
        seen.append(list(prompt_ids))
        return iter(())
    monkeypatch.setattr(generate, "generate_ids", record)
    tok = checkpoint.load_model(trained)[1]
    prompt = "The end." + corpus.EOT + "System:"
    base = ["--checkpoint", str(trained), "--prompt", prompt, "--max-tokens", "2"]
    assert sample_cli.main(base) == 0
    assert sample_cli.main(base + ["--allow-special"]) == 0
    eot = tok.special_tokens[corpus.EOT]
    assert seen[0] == tok.encode_ordinary(prompt) and eot not in seen[0]
    assert seen[1] == tok.encode(prompt, allowed_special="all") and eot in seen[1]


def test_prepare_encodes_the_corpus_separators_as_specials(tmp_path):
    tok, ids, _ = corpus.prepare(FIXTURE, 300, tmp_path)
    text = FIXTURE.read_bytes().decode("utf-8")
    assert ids.tolist() == tok.encode(text, allowed_special="all")
    assert np.count_nonzero(ids == tok.special_tokens[corpus.EOT]) == text.count(corpus.EOT) > 0


def test_sample_next_filters():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 1.0, 2.9])
    assert generate.sample_next(logits, rng, temperature=0) == 1
    assert generate.sample_next(logits, rng, top_k=1) == 1
    assert generate.sample_next(logits, rng, top_p=1e-6) == 1
    draws = {generate.sample_next(logits, rng, top_k=2) for _ in range(200)}
    assert draws == {1, 3}
    with pytest.raises(ValueError, match="top_p"):
        generate.sample_next(logits, rng, top_p=0)


def test_unigram_baseline_formula():
    train_ids, val_ids = np.array([0, 0, 0, 1]), np.array([0, 2])
    q = np.array([4.0, 2.0, 1.0]) / 7.0  # add-one counts over V = 3
    expected = -(np.log(q[0]) + np.log(q[2])) / 2
    assert corpus.unigram_baseline(train_ids, val_ids, 3) == pytest.approx(expected)


@pytest.mark.parametrize("batch", [4, 5])
def test_data_parallel_equals_one_batch(batch):
    """Two shards on two threads (5 = shards of 3 and 2 sequences, weighted 3/5 and 2/5):
    the same loss and gradients as the whole batch in one call."""
    rng = np.random.default_rng(5)
    model = LM(lm_tiny("dense"), rng=rng, dtype=np.float64)
    x, y = rng.integers(0, 23, (batch, 7)), rng.integers(0, 23, (batch, 7))
    model.zero_grad()
    _, cache = model.loss(x, y)
    model.loss_backward(1.0, cache)
    whole = [p.grad.copy() for p in model.parameters()]
    dp = DataParallel(model, 2)
    ce, _ = dp.loss_backward(x, y)
    dp.close()
    assert ce == pytest.approx(cache.ce, rel=1e-12)
    for g, p in zip(whole, model.parameters()):
        np.testing.assert_allclose(p.grad, g, rtol=1e-10, atol=1e-13)


def test_data_parallel_sums_the_shards_gradients_in_replica_order():
    """Three shards on three threads: the main grads are exactly g0 + g1 + g2 (in that order)
    of the shards' gradients, each computed here by a model of its own."""
    cfg = lm_tiny("dense")
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 23, (6, 7)), rng.integers(0, 23, (6, 7))
    shard_grads = []
    for xs, ys in zip(np.array_split(x, 3), np.array_split(y, 3)):
        solo = LM(cfg, rng=np.random.default_rng(1), dtype=np.float64)
        _, cache = solo.loss(xs, ys)
        solo.loss_backward(len(xs) / 6, cache)
        shard_grads.append([p.grad for p in solo.parameters()])
    model = LM(cfg, rng=np.random.default_rng(1), dtype=np.float64)
    dp = DataParallel(model, 3)
    dp.loss_backward(x, y)
    dp.close()
    for i, p in enumerate(model.parameters()):
        np.testing.assert_array_equal(
            p.grad, shard_grads[0][i] + shard_grads[1][i] + shard_grads[2][i])


def test_compare_prints_the_table(tmp_path, capsys):
    from scratchllm.cli import compare
    args = ["--presets", "dense,swa", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
            "--data", str(FIXTURE), "--out", str(tmp_path), "--no-progress"]
    assert compare.main(args) == 0
    out = capsys.readouterr().out
    assert "cache/token 128k" in out and "\nswa " in out and "\ndense " in out


@pytest.mark.parametrize("name", ["dense", "moe", "mla", "swa", "hybrid"])
def test_sizing_counts_the_model_params(name):
    """Two independent counts: teach/sizing's formulas vs the Params the LM allocates."""
    from scratchllm.cli import compare
    from scratchllm.lm import preset
    cfg = preset(name)
    total, active, _ = compare.sizes(cfg)
    model = LM(cfg, rng=np.random.default_rng(0))
    assert total == model.n_params()
    assert active <= total and (active < total) == (flat_view(cfg).ffn == "moe")


def test_moe_run_logs_expert_usage(tmp_path, capsys):
    args = QUICK + ["--preset", "hybrid", "--steps", "4", "--eval-every", "2",
                    "--out", str(tmp_path)]
    assert train.main(args) == 0
    err = capsys.readouterr().err
    assert "expert usage L1:" in err and "L3:" in err  # MoE every other layer: 1 and 3


def test_compare_sets_position_schemes_side_by_side(tmp_path, capsys):
    from scratchllm.cli import compare
    args = ["--presets", "dense", "--positions", "rope,alibi,sinusoidal,nope", "--steps", "2",
            "--batch-size", "2", "--seq-len", "16", "--data", str(FIXTURE), "--out",
            str(tmp_path), "--no-progress"]
    assert compare.main(args) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[-8:] if line.startswith("dense/")]
    assert rows == ["dense/rope", "dense/alibi", "dense/sinusoidal", "dense/nope"]
    with pytest.raises(SystemExit):
        compare.main(["--positions", "learned"])


def test_one_thread_means_one_blas_thread_too():
    """--threads 1 in one process: OpenBLAS is set to one thread as well (its spinning threads
    would keep a second core busy), as it is for each of several shards."""
    from scratchllm.train import blas_threads, set_blas_threads
    if not blas_threads():
        pytest.skip("no OpenBLAS loaded (NumPy on another BLAS)")
    set_blas_threads(2)
    trainer.Run(lm_tiny("dense"), Settings(threads=1), np.float64)
    assert set(blas_threads()) == {1}
