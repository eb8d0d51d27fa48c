"""Real decoder LMs as scratchllm.specs.ModelConfig: the table of published configs (MODELS)
that `python -m scratchllm size` reads. The same config LM builds, so `size` and `LM` count the
same parameters. Pure Python (the arithmetic on them is sizing.py).

Each row sets what sizes the model (widths, heads, layers, FFN, norm, positions, biases, tied
head); what changes no size (RoPE base and scaling, norm eps, router scores) keeps the specs'
defaults. Sources: each config's published config.json or paper, cited beside its row.
"""
from dataclasses import replace

from scratchllm.specs import (AttentionSpec, ExpertsSpec, FFNSpec, LayerSpec, MLASpec, ModelConfig, MoESpec,
                              RouterSpec, from_flat)


def _gqa(name, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff, **flat):
    """GQA layers and a SwiGLU of width d_ff, in the order of the papers' tables (V, D, L, H,
    Hkv, F); the rest in flat names (scratchllm.specs.FLAT_NAMES)."""
    return from_flat(name=name, vocab_size=vocab_size, d_model=d_model, n_layers=n_layers,
                     n_heads=n_heads, n_kv_heads=n_kv_heads, d_ff=d_ff, **flat)


def _deepseek(name, vocab_size, d_model, n_dense, dense_d_ff, n_moe, moe):
    """DeepSeek's layout: MLA in every layer (H 128, Dq 1536, Dc 512, dn 128, dr 64, dv 128),
    n_dense SwiGLU layers of width dense_d_ff, then n_moe layers of the MoESpec `moe`."""
    mla = MLASpec(128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                  qk_rope_head_dim=64, v_head_dim=128)
    layers = ((LayerSpec(mla, FFNSpec("swiglu", dense_d_ff)),) * n_dense
              + (LayerSpec(mla, moe),) * n_moe)
    return ModelConfig(name, vocab_size, d_model, layers)


def _gemma3(name, vocab_size, d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, window):
    """Gemma 3's layout: five sliding-window layers per global one (layer i is global when
    (i + 1) % 6 == 0), QK-norm, GeGLU, sandwich norms, tied head (the hub's gemma3_text)."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
             for i in range(n_layers)]
    return _gqa(name, vocab_size, d_model, n_layers, n_heads, n_kv_heads, d_ff,
                head_dim=head_dim, window=window, layer_types=types, rope_base=1e6,
                rope_local_base=1e4, qk_norm=True, ffn="geglu", gelu_approx="tanh",
                block="sandwich", norm_offset=1.0, embed_scale=True, tie_embeddings=True)


MODELS = {cfg.name: cfg for cfg in [
    # meta-llama/llama-models sku_list.py; F = int(8D/3)·multiplier rounded up (Llama 3 paper, arXiv 2407.21783, Table 3)
    _gqa("llama-3-8b", 128256, 4096, 32, 32, 8, 14336),
    _gqa("llama-3-70b", 128256, 8192, 80, 64, 8, 28672),
    _gqa("llama-3.1-405b", 128256, 16384, 126, 128, 8, 53248),
    # meta-llama/Llama-3.2-1B config.json: tied embeddings (the chapter's "1B model with a 128K
    # vocabulary spends ~260M parameters on embeddings")
    _gqa("llama-3.2-1b", 128256, 2048, 16, 32, 8, 8192, tie_embeddings=True),
    # mistralai params.json (v0.2+: no sliding window)
    _gqa("mistral-7b", 32000, 4096, 32, 32, 8, 14336),
    # mistralai/Mistral-7B-v0.1 config.json: the same weights' shapes, sliding_window 4096
    # (Jiang et al. 2023, arXiv 2310.06825: W = 4096, a 32 x 4096 ~ 131k receptive field)
    _gqa("mistral-7b-v0.1", 32000, 4096, 32, 32, 8, 14336, window=4096),
    # HF configuration_mixtral.py defaults
    _gqa("mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, ffn="moe", n_experts=8, top_k=2),
    # deepseek-ai/deepseek-llm-67b-base config.json (DeepSeek LLM, arXiv 2401.02954 Table 2):
    # the dense model DeepSeek-V2 compares its KV cache with
    _gqa("deepseek-67b", 102400, 8192, 95, 64, 8, 22016),
    # HF deepseek-ai/DeepSeek-V2 config.json (236B): 160 routed + 2 shared, top-6, 1 dense layer
    _deepseek("deepseek-v2", 102400, 5120, 1, 12288, 59,
              MoESpec(RouterSpec(160, 6), ExpertsSpec(d_ff=1536), d_shared=2 * 1536)),
    # DeepSeek-V3 inference/configs/config_671B.json (the MTP module is not counted); the
    # checkpoint stores each router's selection bias (e_score_correction_bias)
    _deepseek("deepseek-v3", 129280, 7168, 3, 18432, 58,
              MoESpec(RouterSpec(256, 8, selection_bias=True), ExpertsSpec(d_ff=2048),
                      d_shared=2048)),
    # Brown et al. 2020, Table 2.1; GPT-2 layout: LayerNorm, biases, tied head, GELU MLP F = 4D
    _gqa("gpt-3-175b", 50257, 12288, 96, 96, 96, 4 * 12288, tie_embeddings=True,
         ffn="gelu_mlp", norm="layernorm", qkv_bias=True, o_bias=True, positions="learned",
         max_positions=2048),
    # google/gemma-3-1b-pt and gemma-3-4b-pt config.json (text): 999,885,952 and
    # 3,880,263,168 parameters, as transformers' Gemma3ForCausalLM counts them
    _gemma3("gemma-3-1b", 262144, 1152, 26, 4, 1, 256, 6912, 512),
    _gemma3("gemma-3-4b", 262208, 2560, 34, 8, 4, 256, 10240, 1024),
    # state-spaces/mamba-130m-hf: 24 Mamba mixers, no MLP, no attention, tied head
    from_flat(name="mamba-130m", vocab_size=50280, d_model=768, n_layers=24,
              layer_pattern="M" * 24, ffn="none", tie_embeddings=True),
]}


def get(name):
    """The named ModelConfig; an unknown name raises ValueError listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"arch.get: unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def without_windows(cfg):
    """cfg with every attention layer global (its window and sinks dropped): the same weights,
    and the cache a model of global layers only (Llama, Gemma 1) keeps."""
    def drop(mixer):
        return replace(mixer, mask=replace(mixer.mask, window=None, n_sink=0))
    attention = (AttentionSpec, MLASpec)
    return replace(cfg, layers=tuple(
        replace(layer, mixer=drop(layer.mixer)) if isinstance(layer.mixer, attention) else layer
        for layer in cfg.layers))


def with_mixer(cfg, mixer):
    """cfg with `mixer` (a mixer spec) in every layer: the same width, depth and FFNs with
    another attention, or Mamba in place of attention."""
    return replace(cfg, layers=tuple(replace(layer, mixer=mixer) for layer in cfg.layers))
