"""LoRA adapters in peft's format: an adapter peft made (tests/fixtures/peft, written by
tools/make_peft_fixture.py) loads onto its base and gives transformers' logits; saving it again
gives peft's tensor names, shapes and values and the config fields peft reads; B = 0 changes
nothing; merged weights are W0 + (alpha / r) A B; unmerge restores W0 bit for bit; the
adapters' gradients are the loss's."""
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from scratchllm.hub import load_pretrained
from scratchllm.hub.peft import LoRA, lora_sites, load_adapter, save_adapter
from scratchllm.lm import LM, preset

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def base(name="llama"):
    return load_pretrained(FIXTURES / "hf" / name, dtype=np.float64)


def weight(site):
    """The site's library weights side by side (Din, Dout)."""
    return np.concatenate([w.data for w in site.weights], axis=-1)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_peft_adapter_gives_transformers_logits(name):
    # llama: nn.Linear q_proj, v_proj, down_proj; gpt2: Conv1D (in, out), c_attn fused q|k|v,
    # and c_proj in attention and MLP: 3 sites x 2 layers either way, scale 8 / 4
    adapter = FIXTURES / "peft" / f"{name}_lora"
    model, expected = base(name), np.load(adapter / "expected.npz")
    lora = load_adapter(model, adapter)
    assert len(lora.sites) == 6 and lora.scale == 2.0 and lora.conv1d == (name == "gpt2")
    base_err = np.abs(model.forward(expected["ids"])[0] - expected["base_logits"]).max()
    lora.merge()
    logits = model.forward(expected["ids"])[0]
    # the base itself agrees with transformers to ~5e-7 on these ids (its llama3 RoPE);
    # the adapter moves the logits by far more, and adds no error of its own
    assert np.abs(expected["logits"] - expected["base_logits"]).max() > 0.1
    assert np.abs(logits - expected["logits"]).max() < 4 * base_err + 1e-9


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_saved_adapter_has_peft_names_shapes_values_and_config(tmp_path, name):
    adapter = FIXTURES / "peft" / f"{name}_lora"
    lora = load_adapter(base(name), adapter)
    save_adapter(lora, tmp_path, base_model=f"tests/fixtures/hf/{name}")
    theirs, ours = load_file(str(adapter / "adapter_model.safetensors")), \
        load_file(str(tmp_path / "adapter_model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_array_equal(ours[k], theirs[k])
    c_theirs = json.loads((adapter / "adapter_config.json").read_text())
    c_ours = json.loads((tmp_path / "adapter_config.json").read_text())
    for key in ("peft_type", "task_type", "r", "lora_alpha", "bias", "fan_in_fan_out",
                "use_rslora", "use_dora", "lora_dropout", "base_model_name_or_path"):
        assert c_ours[key] == c_theirs[key], key
    assert sorted(c_ours["target_modules"]) == sorted(c_theirs["target_modules"])


def _dense():
    cfg = preset("dense", vocab_size=32, d_model=16, n_layers=2)
    return LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)


def test_fresh_adapter_changes_nothing_and_merge_is_w0_plus_scaled_ab():
    model = _dense()
    ids = np.random.default_rng(1).integers(0, 32, (2, 5))
    before = model.forward(ids)[0]
    lora = LoRA(model, 4, alpha=8, targets=("q_proj", "o_proj"), rng=np.random.default_rng(2))
    assert lora_sites(model)["model.layers.1.self_attn.q_proj"] == (("layers.1.mixer.wq",),
                                                                     False)
    _merge_unmerge(model, lora, ids, before)


def _merge_unmerge(model, lora, ids, before):
    lora.merge()
    np.testing.assert_array_equal(model.forward(ids)[0], before)  # B = 0
    w0 = {m: weight(site) for m, site in lora.sites.items()}
    for _, _, A, B in lora.sites.values():
        B.data[...] = np.random.default_rng(3).standard_normal(B.data.shape)
    lora.merge()
    for m, site in lora.sites.items():
        np.testing.assert_allclose(weight(site), w0[m] + lora.scale * site.A.data @ site.B.data,
                                   rtol=0, atol=1e-12)
    assert np.abs(model.forward(ids)[0] - before).max() > 1e-3
    lora.unmerge()
    for m, site in lora.sites.items():
        np.testing.assert_array_equal(weight(site), w0[m])
    np.testing.assert_array_equal(model.forward(ids)[0], before)


def test_fused_conv1d_adapter_merges_into_the_split_weights_and_unmerges():
    model = base("gpt2")
    ids = np.random.default_rng(1).integers(0, 300, (2, 5))
    before = model.forward(ids)[0]
    lora = LoRA(model, 3, alpha=6, targets=("c_attn",), rng=np.random.default_rng(2))
    site = lora.sites["transformer.h.0.attn.c_attn"]
    assert [w.data.shape for w in site.weights] == [(16, 16)] * 3 and site.B.data.shape == (3, 48)
    _merge_unmerge(model, lora, ids, before)


@pytest.mark.parametrize("name, target", [("dense", "v_proj"), ("gpt2", "c_attn")])
def test_adapter_gradients_are_the_losss(name, target):
    model = _dense() if name == "dense" else base("gpt2")  # gpt2: fused q|k|v, Conv1D
    lora = LoRA(model, 2, targets=(target,), rng=np.random.default_rng(2))
    _, _, A, B = next(iter(lora.sites.values()))
    B.data[...] = np.random.default_rng(3).standard_normal(B.data.shape)
    ids = np.random.default_rng(1).integers(0, 32, (2, 6))

    def loss():
        lora.merge()
        return float(model.loss(ids[:, :-1], ids[:, 1:])[0])

    lora.merge()
    model.zero_grad()
    value, cache = model.loss(ids[:, :-1], ids[:, 1:])
    model.loss_backward(1.0, cache)
    lora.backward()
    d, eps = np.random.default_rng(4).standard_normal(A.data.shape), 1e-6
    A.data += eps * d
    up = loss()
    A.data -= 2 * eps * d
    down = loss()
    A.data += eps * d
    np.testing.assert_allclose((A.grad * d).sum(), (up - down) / (2 * eps), rtol=1e-6)
    W = next(iter(lora.sites.values())).weights[0]
    assert not W.grad.any()  # the base weight does not train


def test_refusals_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="no projection matches"):
        LoRA(_dense(), 2, targets=("c_attn",))
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(_dense(), tmp_path)
    save_adapter(LoRA(_dense(), 2), tmp_path / "linear")  # nn.Linear targets ...
    config = json.loads((tmp_path / "linear" / "adapter_config.json").read_text())
    (tmp_path / "linear" / "adapter_config.json").write_text(json.dumps(
        dict(config, fan_in_fan_out=True)))  # ... said to be Conv1D
    with pytest.raises(ValueError, match="fan_in_fan_out"):
        load_adapter(_dense(), tmp_path / "linear")


def test_finetune_lora_saves_an_adapter_whose_merge_is_the_merged_model(tmp_path):
    from scratchllm import cli
    hf = FIXTURES / "hf" / "llama"
    argv = ["finetune", "--hf", str(hf), "--data", str(FIXTURES / "python-docs-slice.txt"),
            "--lora", "2", "--lora-alpha", "4", "--lora-targets", "q_proj,v_proj", "--steps",
            "3", "--batch-size", "2", "--seq-len", "8", "--lr", "0.01", "--out", str(tmp_path),
            "--no-progress"]
    assert cli.main(argv + ["--merge", "--keep-state"]) == 0
    assert (tmp_path / "lora_state" / "state.npz").is_file()  # kept for --resume
    assert cli.main(argv) == 1  # a state is there: --resume, or another --out
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (2, 4.0, "LORA")
    model = load_pretrained(hf, dtype=np.float64)
    lora = load_adapter(model, tmp_path)
    assert any(B.data.any() for _, _, _, B in lora.sites.values())  # it trained
    lora.merge()
    merged = load_pretrained(tmp_path / "merged", dtype=np.float64)
    for (name, p), (_, q) in zip(model.named_parameters(), merged.named_parameters()):
        np.testing.assert_allclose(p.data, q.data, rtol=0, atol=1e-6, err_msg=name)
    with pytest.raises(SystemExit):
        cli.main(["finetune", "--data", "x", "--out", "y"])  # --hf or --preset


def test_lora_training_resumes_bit_for_bit(tmp_path, monkeypatch):
    from scratchllm.train import Settings, corpus
    from scratchllm.train import lora as lora_training
    ids = np.random.default_rng(5).integers(0, 32, 400)
    s = Settings(steps=6, batch_size=2, seq_len=8, lr=0.01, warmup=2, eval_every=3)
    eval_set = corpus.eval_batches(ids[300:], 2, 8, 32)

    def fresh():
        model = _dense()
        return model, LoRA(model, 2, targets=("q_proj", "v_proj"), rng=np.random.default_rng(2))
    model, whole = fresh()
    straight, _ = lora_training.fit_lora(model, whole, ids[:300], eval_set, s, False)
    model, cut = fresh()
    calls, sample = [], corpus.sample_batch

    def interrupting(*a):  # Ctrl-C while drawing the 5th batch: the save at step 3 remains
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return sample(*a)
    monkeypatch.setattr(lora_training.corpus, "sample_batch", interrupting)
    with pytest.raises(KeyboardInterrupt):
        lora_training.fit_lora(model, cut, ids[:300], eval_set, s, False, state=tmp_path)
    monkeypatch.setattr(lora_training.corpus, "sample_batch", sample)
    model, resumed = fresh()
    losses, _ = lora_training.fit_lora(model, resumed, ids[:300], eval_set, s, False,
                                       state=tmp_path, resume=True)
    assert losses == straight  # (also fails if the adapters' gradients carried over steps)
    for m, site in whole.sites.items():
        np.testing.assert_array_equal(resumed.sites[m].A.data, site.A.data)
        np.testing.assert_array_equal(resumed.sites[m].B.data, site.B.data)
    _, other = fresh()[0], LoRA(_dense(), 3, rng=np.random.default_rng(2))
    with pytest.raises(ValueError, match="holds adapters"):
        lora_training.fit_lora(other.model, other, ids[:300], eval_set, s, False,
                               state=tmp_path, resume=True)


def test_frozen_weights_skip_their_gradient_and_change_no_other():
    from scratchllm.core.frozen import frozen_weights
    from scratchllm.core.ops import linear_backward, linear_forward
    rng = np.random.default_rng(0)
    x, W, dy = rng.standard_normal((3, 4, 5)), rng.standard_normal((5, 6)), \
        rng.standard_normal((3, 4, 6))
    _, cache = linear_forward(x, W)
    with frozen_weights([W]):
        g = linear_backward(dy, cache)
    assert not g["W"].any() and g["W"].shape == W.shape
    np.testing.assert_array_equal(g["x"], linear_backward(dy, cache)["x"])
    assert linear_backward(dy, cache)["W"].any()  # outside the block: computed again
    model = _dense()
    lora = LoRA(model, 2, targets=("q_proj", "v_proj"), rng=np.random.default_rng(2))
    for site in lora.sites.values():
        site.B.data[...] = rng.standard_normal(site.B.data.shape)
    ids = rng.integers(0, 32, (2, 7))
    targets = {id(w) for site in lora.sites.values() for w in site.weights}
    grads = []
    for freeze in (False, True):
        lora.merge()
        model.zero_grad()
        _, cache = model.loss(ids[:, :-1], ids[:, 1:])
        frozen = [p.data for p in model.parameters() if id(p) not in targets] if freeze else []
        with frozen_weights(frozen):
            model.loss_backward(1.0, cache)
        grads.append({n: p.grad.copy() for n, p in model.named_parameters()})
    for name, p in model.named_parameters():
        if id(p) in targets or p.data.ndim != 2 or name.endswith(".E"):
            np.testing.assert_array_equal(grads[1][name], grads[0][name], err_msg=name)
        else:  # a frozen projection: skipped
            assert grads[0][name].any() and not grads[1][name].any(), name
