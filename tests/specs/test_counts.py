"""A config's parameter count, computed from its specs without allocating an array, equals the
LM's on small models (every preset, and the options that add parameters) and what `size`
prints on every model it knows (with the published totals where they are known)."""
import re

import numpy as np
import pytest

from scratchllm.cli import size as size_cli
from scratchllm.lm import LM
from scratchllm.lm.config import ModelConfig as FlatConfig
from scratchllm.specs import PRESETS, from_flat
from scratchllm.teach.arch import MODELS

SMALL = dict(d_model=32, vocab_size=97, d_ff=24)
OPTIONS = [  # (preset, flat overrides): each option that changes what the LM allocates
    ("dense", dict(qkv_bias=True)),
    ("dense", dict(o_bias=True, head_dim=16)),
    ("dense", dict(qk_norm=True)),
    ("dense", dict(attn_sinks=True)),
    ("dense", dict(tie_embeddings=True)),
    ("dense", dict(positions="learned", max_positions=40)),
    ("dense", dict(norm="layernorm")),
    ("dense", dict(block="sandwich")),
    ("dense", dict(block="post")),
    ("dense", dict(ffn="gelu_mlp")),
    ("dense", dict(ffn="geglu")),
    ("dense", dict(ffn="gelu_mlp", norm="layernorm", positions="learned", qkv_bias=True,
                   o_bias=True, tie_embeddings=True)),  # the GPT-2 layout
    ("moe", dict(n_shared=2)),
    ("moe", dict(router_bias=True)),
    ("moe", dict(experts="clamped")),
    ("moe", dict(first_k_dense=1, dense_d_ff=40)),
    ("mla", dict(q_lora_rank=16)),
    ("hybrid", dict(mamba_inner_norms=True, dt_rank=3)),
    ("hybrid", dict(ffn="none", layer_pattern="MMMM")),
]
PUBLISHED = {  # total parameters (active per token): the numbers tests/teach/test_sizing.py checks
    "llama-3-8b": (8_030_261_248, 8_030_261_248),
    "llama-3-70b": (70_553_706_496, 70_553_706_496),
    "mixtral-8x7b": (46_702_792_704, 12_879_925_248),
    "deepseek-v3": (671_026_419_200, 37_552_297_472),
    "gpt-3-175b": (174_604_259_328, 174_604_259_328),
    "mamba-130m": (129_135_360, 129_135_360),
}


def _lm(flat):
    """The LM of a config given in flat names (the names presets and overrides use)."""
    return LM(FlatConfig(**flat).validate(), rng=np.random.default_rng(0))


def _lm_count(flat):
    return sum(p.data.size for _, p in _lm(flat).named_parameters())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_counts_the_lms_parameters(name):
    flat = dict(PRESETS[name], name=name, **SMALL)
    assert from_flat(**flat).n_params() == _lm_count(flat)


@pytest.mark.parametrize("name, options", OPTIONS,
                         ids=[f"{n}-{'-'.join(o)}" for n, o in OPTIONS])
def test_every_option_counts_the_lms_parameters(name, options):
    flat = dict(PRESETS[name], name=name, **dict(SMALL, **options))
    assert from_flat(**flat).n_params() == _lm_count(flat)


@pytest.mark.parametrize("name", ["dense", "moe", "mla", "swa", "hybrid"])
def test_tiny_presets_count_the_lms_parameters(name):
    """The sizes of the sizing chapter's tiny models (MLA with its own small head dims)."""
    flat = dict(PRESETS[name], name=name, d_model=16, n_heads=2, n_kv_heads=1, d_ff=24,
                vocab_size=40, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
                v_head_dim=4)
    assert from_flat(**flat).n_params() == _lm_count(flat)


def _printed(report, label):
    """The integer on the first `label` row of a `size` report."""
    return int(re.search(rf"^  {label} +([\d,]+)", report, re.M).group(1).replace(",", ""))


@pytest.mark.parametrize("name", list(MODELS))
def test_size_prints_the_configs_count(name):
    cfg = MODELS[name]
    report = size_cli.report(cfg, context=4096, batch=1)
    assert _printed(report, "total") == cfg.n_params()
    assert _printed(report, "active per token") == cfg.n_params(active=True)
    if name in PUBLISHED:
        assert (cfg.n_params(), cfg.n_params(active=True)) == PUBLISHED[name]
