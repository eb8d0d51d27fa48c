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
ADAPTER = FIXTURES / "peft" / "llama_lora"


def base():
    return load_pretrained(FIXTURES / "hf" / "llama", dtype=np.float64)


def test_peft_adapter_gives_transformers_logits():
    model, expected = base(), np.load(ADAPTER / "expected.npz")
    lora = load_adapter(model, ADAPTER)
    assert len(lora.sites) == 6 and lora.scale == 2.0  # 3 targets x 2 layers, 8 / 4
    base_err = np.abs(model.forward(expected["ids"])[0] - expected["base_logits"]).max()
    lora.merge()
    logits = model.forward(expected["ids"])[0]
    # the base itself agrees with transformers to ~5e-7 on these ids (its llama3 RoPE);
    # the adapter moves the logits by far more, and adds no error of its own
    assert np.abs(expected["logits"] - expected["base_logits"]).max() > 0.1
    assert np.abs(logits - expected["logits"]).max() < 4 * base_err + 1e-9


def test_saved_adapter_has_peft_names_shapes_values_and_config(tmp_path):
    lora = load_adapter(base(), ADAPTER)
    save_adapter(lora, tmp_path, base_model="tests/fixtures/hf/llama")
    theirs, ours = load_file(str(ADAPTER / "adapter_model.safetensors")), \
        load_file(str(tmp_path / "adapter_model.safetensors"))
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        np.testing.assert_array_equal(ours[k], theirs[k])
    c_theirs = json.loads((ADAPTER / "adapter_config.json").read_text())
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
    assert lora_sites(model)["model.layers.1.self_attn.q_proj"] == "layers.1.mixer.wq"
    lora.merge()
    np.testing.assert_array_equal(model.forward(ids)[0], before)  # B = 0
    w0 = {m: W.data.copy() for m, (W, _, _, _) in lora.sites.items()}
    for _, _, A, B in lora.sites.values():
        B.data[...] = np.random.default_rng(3).standard_normal(B.data.shape)
    lora.merge()
    for m, (W, W0, A, B) in lora.sites.items():
        np.testing.assert_allclose(W.data, w0[m] + (8 / 4) * A.data @ B.data, rtol=0,
                                   atol=1e-12)
    assert np.abs(model.forward(ids)[0] - before).max() > 1e-3
    lora.unmerge()
    for m, (W, _, _, _) in lora.sites.items():
        np.testing.assert_array_equal(W.data, w0[m])
    np.testing.assert_array_equal(model.forward(ids)[0], before)


def test_adapter_gradients_are_the_losss():
    model = _dense()
    lora = LoRA(model, 2, targets=("v_proj",), rng=np.random.default_rng(2))
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
    W = next(iter(lora.sites.values()))[0]
    assert not W.grad.any()  # the base weight does not train


def test_refusals_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="no projection matches"):
        LoRA(_dense(), 2, targets=("c_attn",))
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 2, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        load_adapter(_dense(), tmp_path)


def test_finetune_lora_saves_an_adapter_whose_merge_is_the_merged_model(tmp_path):
    from scratchllm import cli
    hf = FIXTURES / "hf" / "llama"
    assert cli.main(["finetune", "--hf", str(hf), "--data",
                     str(FIXTURES / "python-docs-slice.txt"), "--lora", "2", "--lora-alpha", "4",
                     "--lora-targets", "q_proj,v_proj", "--steps", "3", "--batch-size", "2",
                     "--seq-len", "8", "--lr", "0.01", "--out", str(tmp_path), "--merge",
                     "--no-progress"]) == 0
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
