"""The registry of Hugging Face families: every record round-trips its config (config.json ->
flat names -> config.json) and its tensor names (every library array is one HF tensor or
one slice of one, and back); a config chooses its family once, the same way for a loaded
checkpoint and a preset; and no module outside the registry compares a string with a
family's model_type (an AST check, shown to fail on a small synthetic module)."""
import ast
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from scratchllm.hub import (FAMILIES, Family, config_from_flat, family_for, family_named,
                            flat_of, save_pretrained)
from scratchllm.hub.layout import from_hf, to_hf
from scratchllm.lm import LM, preset

ROOT = Path(__file__).resolve().parents[2]
HF = ROOT / "tests" / "fixtures" / "hf"
CHECKPOINTS = sorted(d.name for d in HF.iterdir() if (d / "model.safetensors").is_file())
LM_CHECKPOINTS = [n for n in CHECKPOINTS if isinstance(family_named(json.loads(
    (HF / n / "config.json").read_text())["model_type"]), Family)]  # the others: test_vision
REGISTRY = ("scratchllm/hub/registry.py", "scratchllm/hub/families/")  # where names may appear


def loaded(name):
    """(record, config) of the fixture checkpoint `name`'s config.json."""
    hf = json.loads((HF / name / "config.json").read_text())
    family = family_named(hf["model_type"])
    return family, config_from_flat(family.from_hf(hf)), hf


def test_every_family_has_a_fixture_checkpoint():
    assert {family_named(json.loads((HF / name / "config.json").read_text())["model_type"])
            for name in CHECKPOINTS} == set(FAMILIES)
    assert len({f.model_type for f in FAMILIES}) == len(FAMILIES)


@pytest.mark.parametrize("name", LM_CHECKPOINTS)
def test_config_round_trips(name):
    """from_hf(to_hf(f)) gives the config back, with and without the loaded config.json as
    the base, and writing it again gives the same config.json."""
    family, cfg, hf = loaded(name)
    f = flat_of(cfg)
    for base in (None, hf):
        written = family.to_hf(f, "float32", base)
        assert written["model_type"] == family.model_type
        assert written["architectures"] == [family.architecture]
        again = config_from_flat(family.from_hf(written))
        assert again == cfg
        assert family.to_hf(flat_of(again), "float32", base) == written


@pytest.mark.parametrize("name", LM_CHECKPOINTS)
def test_a_config_chooses_its_family_by_name_or_by_shape(name):
    """A loaded config saves as its model_type; renamed (as a preset's config is), exactly
    its own family claims it, so it saves as the same family."""
    family, cfg, _ = loaded(name)
    assert family_for(flat_of(cfg)) is family
    custom = dataclasses.replace(flat_of(cfg), name="custom")
    assert [r for r in FAMILIES if r.claims(custom)] == [family]
    assert family_for(custom) is family


@pytest.mark.parametrize("name", LM_CHECKPOINTS)
def test_tensor_names_round_trip(name):
    """Every element of every Param (and of the buffers a family saves: DeepSeek-V3's
    selection bias) is in exactly one HF tensor: the HF names are unique, each (array, expert
    slice) is named once, and writing the HF tensors back into zeroed arrays restores them."""
    family, cfg, _ = loaded(name)
    model = family.model_class(cfg, rng=np.random.default_rng(0))
    table = family.names(model, flat_of(cfg))
    assert len({e.hf for e in table}) == len(table)
    pieces = [(lib, e.expert) for e in table if not e.copy for lib in e.lib]
    assert len(set(pieces)) == len(pieces)  # copies (Entry.copy) name arrays a second time
    params = {n: p.data for n, p in model.named_parameters()}
    saved = {lib for e in table if e.buffer for lib in e.lib}
    arrays = {**params, **{n: b for n, b in model.named_buffers() if n in saved}}
    assert {lib for lib, _ in pieces} == set(arrays)
    tensors = {e.hf: to_hf(e, arrays) for e in table}
    restored = {n: np.zeros_like(a) for n, a in arrays.items()}
    for e in table:
        from_hf(e, tensors[e.hf], restored)
    for n, a in arrays.items():
        assert np.array_equal(restored[n], a), n


@pytest.mark.parametrize("name, overrides, family", [
    ("dense", {}, "llama"), ("dense", dict(window=8), "mistral"),
    ("dense", dict(qkv_bias=True), "qwen2"), ("dense", dict(qk_norm=True), "qwen3"),
    ("moe", {}, "mixtral"), ("mla", {}, "deepseek_v3"),
    ("hybrid", {}, "jamba"),
    ("hybrid", dict(layer_pattern="MMMM", ffn="none", mamba_inner_norms=False), "mamba")])
def test_presets_save_as_the_family_of_their_shape(name, overrides, family):
    cfg = preset(name, vocab_size=11, d_model=8, n_layers=4, n_heads=2, n_kv_heads=1, d_ff=8,
                 n_experts=4, **overrides)
    assert family_for(flat_of(cfg)).model_type == family


def test_a_config_no_family_claims_is_refused_by_name(tmp_path):
    """Two options no family has together: the error says how to see what a family lacks."""
    model = LM(preset("dense", vocab_size=11, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1,
                      d_ff=8, qkv_bias=True, qk_norm=True), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="config 'dense' .* none of the families"):
        save_pretrained(model, tmp_path)
    with pytest.raises(ValueError, match="qwen2 checkpoint only with qk_norm=False"):
        family_for(dataclasses.replace(flat_of(model.cfg), name="qwen2"))
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- the rule
def family_name_comparisons(root, model_types, allowed=REGISTRY):
    """[(file, line, name)] of every comparison (==, !=, in, not in, ...) of a string constant
    that is a model_type, or of a tuple, list or set literal holding one, in the .py files
    under root/scratchllm but the `allowed` ones (paths relative to root; a folder ends in
    /)."""
    found = []
    for path in sorted((root / "scratchllm").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if any(rel == a or (a.endswith("/") and rel.startswith(a)) for a in allowed):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    items = operand.elts if isinstance(operand, (ast.Tuple, ast.List,
                                                                 ast.Set)) else [operand]
                    found += [(rel, node.lineno, c.value) for c in items
                              if isinstance(c, ast.Constant) and c.value in model_types]
    return found


def test_no_family_name_comparison_outside_the_registry():
    assert family_name_comparisons(ROOT, {f.model_type for f in FAMILIES}) == []


def test_the_rule_finds_comparisons_in_a_synthetic_module(tmp_path):
    lm = tmp_path / "scratchllm" / "lm"
    lm.mkdir(parents=True)
    (lm / "model.py").write_text(
        'def f(cfg, family, pattern):\n'
        '    if cfg.name == "gpt2":\n'
        '        return 1\n'
        '    if family in ("llama", "mistral"):\n'
        '        return 2\n'
        '    return pattern != "llama3" and {"qwen3": 1}.get(family)\n')
    registry = tmp_path / "scratchllm" / "hub" / "families"
    registry.mkdir(parents=True)
    (registry / "dense.py").write_text('def claims(f):\n    return f.name == "llama"\n')
    assert family_name_comparisons(tmp_path, {"gpt2", "llama", "mistral", "qwen3"}) == [
        ("scratchllm/lm/model.py", 2, "gpt2"), ("scratchllm/lm/model.py", 4, "llama"),
        ("scratchllm/lm/model.py", 4, "mistral")]
