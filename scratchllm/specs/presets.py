"""The named presets, each a short declaration in flat names (all small enough to train on 2
CPU cores in minutes):
    dense   Llama-style: RMSNorm pre-norm, GQA, RoPE, SwiGLU
    moe     Mixtral-style: dense attention, top-2 of 8 SwiGLU experts, balance + z losses
    mla     DeepSeek-style: MLA + fine-grained MoE with a shared expert, sigmoid scores and the
            aux-loss-free selection bias
    swa     Mistral-style: sliding-window attention with attention sinks
    hybrid  Jamba-style: Mamba and attention layers ("MAMA"), MoE FFN every other layer; as
            Jamba has it (so it saves as a jamba checkpoint as it is): no positions in the
            attention layers, RMSNorms on the Mamba's dt, B and C, top-2 gates not renormalised
    mamba2_hybrid  the chapter's hybrid recipe (NVIDIA's Mamba-2-Hybrid, Waleffe et al. 2024,
            arXiv 2406.07887): every layer one sub-layer, 43% Mamba-2, 7% attention, 50% MLP
            (14 layers: 6 S, 1 A, 7 F, the attention in the middle); no positions (the
            Mamba-2 layers carry the order)
    linear, deltanet, mamba2, rwkv   one recurrent mixer in every layer
"""
from scratchllm.specs.flat import from_flat

_MOE = dict(ffn="moe", n_experts=8, top_k=2, d_ff=192, balance_coef=0.01, z_coef=0.001)

PRESETS = {
    "dense": dict(),
    "moe": dict(_MOE),
    "mla": dict(_MOE, attention="mla", d_ff=96, n_shared=1, score="sigmoid", bias_gamma=1e-3,
                balance_coef=1e-4, z_coef=0.0),
    "swa": dict(window=32, n_sink=4),
    "hybrid": dict(_MOE, layer_pattern="MAMA", moe_every=2, n_experts=4, positions="nope",
                   mamba_inner_norms=True, norm_topk_prob=False),
    "mamba2_hybrid": dict(layer_pattern="SFSFSFAFSFSFSF", n_layers=14, positions="nope"),
    "linear": dict(layer_pattern="LLLL"),
    "deltanet": dict(layer_pattern="DDDD"),
    "mamba2": dict(layer_pattern="SSSS"),
    "rwkv": dict(layer_pattern="WWWW"),
}


def preset(name, **overrides):
    """The named preset as a ModelConfig, with flat-name overrides (e.g. d_model=16)."""
    if name not in PRESETS:
        raise ValueError(f"preset: unknown preset {name!r}; choose from {sorted(PRESETS)}")
    return from_flat(**dict(PRESETS[name], name=name, **overrides))
