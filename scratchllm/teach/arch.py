"""The sizes of real decoder LMs: the Arch dataclass, the table of published configs (MODELS),
and Arch from a scratchllm ModelConfig. Pure Python (the arithmetic on them is sizing.py).

Sources: each config's published config.json or paper, cited beside its row.
"""
from dataclasses import dataclass


@dataclass(frozen=True)
class Arch:
    """The sizes of a decoder-only LM, enough to count its weights and its cache."""
    name: str
    vocab: int                 # V
    d_model: int               # D
    n_layers: int              # L
    n_heads: int               # H query heads
    n_kv_heads: int            # Hkv: H for MHA, 1 for MQA, in between for GQA
    d_ff: int                  # F, hidden width of the dense MLP; 0 = no MLP (pure Mamba)
    head_dim: int = 0          # Dh; 0 means D // H
    tied: bool = False         # the output head reuses the embedding matrix
    mlp: str = "swiglu"        # "swiglu" (3 matrices) or "gelu" (2 matrices, GPT-2/3)
    norm: str = "rms"          # "rms" (weight) or "layer" (weight + bias)
    biases: bool = False       # every linear layer has a bias (GPT-2/3)
    n_positions: int = 0       # P learned absolute positions (GPT-3: 2048); 0 = RoPE
    window: int = 0            # sliding window: the cache keeps window + n_sink tokens
    n_sink: int = 0
    # MoE (n_experts = 0: every layer is dense)
    n_experts: int = 0         # E routed experts
    top_k: int = 0             # K routed experts per token
    n_shared: int = 0          # S shared experts, always on
    moe_d_ff: int = 0          # Fe; 0 means F
    n_dense_layers: int = 0    # the first layers keep a dense MLP (DeepSeek first_k_dense_replace)
    moe_every: int = 1         # after those, every k-th layer is MoE (Jamba: 2)
    router_bias: bool = False  # a selection-only bias of E numbers per MoE layer (DeepSeek-V3)
    # MLA (kv_lora_rank = 0: ordinary multi-head attention)
    q_lora_rank: int = 0       # Dq; 0 means a direct query projection
    kv_lora_rank: int = 0      # Dc
    qk_nope: int = 0           # Dn
    qk_rope: int = 0           # Dr
    v_head_dim: int = 0        # Dv
    # hybrids: one letter per layer, A = attention, M = Mamba mixer, tiled to L ("" = all A)
    pattern: str = ""
    d_state: int = 16          # N
    d_conv: int = 4
    expand: int = 2

    @property
    def dh(self):
        return self.head_dim or self.d_model // self.n_heads

    @property
    def mla(self):
        return self.kv_lora_rank > 0

    def layers(self):
        """One (mixer, ffn) per layer: mixer "A", "M" or a recurrent mixer letter (L R G D S W),
        ffn "dense", "moe" or "none"."""
        mixers = (self.pattern or "A") * self.n_layers
        out = []
        for i in range(self.n_layers):
            j = i - self.n_dense_layers
            moe = self.n_experts > 0 and j >= 0 and j % self.moe_every == self.moe_every - 1
            out.append((mixers[i], "moe" if moe else "dense" if self.d_ff else "none"))
        return out


MODELS = {a.name: a for a in [
    # meta-llama/llama-models sku_list.py; F = int(8D/3)·multiplier rounded up (Llama 3 paper, arXiv 2407.21783, Table 3)
    Arch("llama-3-8b", 128256, 4096, 32, 32, 8, 14336),
    Arch("llama-3-70b", 128256, 8192, 80, 64, 8, 28672),
    Arch("llama-3.1-405b", 128256, 16384, 126, 128, 8, 53248),
    # mistralai params.json (v0.2+: no sliding window)
    Arch("mistral-7b", 32000, 4096, 32, 32, 8, 14336),
    # mistralai/Mistral-7B-v0.1 config.json: the same weights' shapes, sliding_window 4096
    # (Jiang et al. 2023, arXiv 2310.06825: W = 4096, a 32 x 4096 ~ 131k receptive field)
    Arch("mistral-7b-v0.1", 32000, 4096, 32, 32, 8, 14336, window=4096),
    # HF configuration_mixtral.py defaults
    Arch("mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, n_experts=8, top_k=2),
    # HF deepseek-ai/DeepSeek-V2 config.json (236B): 160 routed + 2 shared, top-6, 1 dense layer
    Arch("deepseek-v2", 102400, 5120, 60, 128, 128, 12288, n_experts=160, top_k=6, n_shared=2,
         moe_d_ff=1536, n_dense_layers=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope=128,
         qk_rope=64, v_head_dim=128),
    # DeepSeek-V3 inference/configs/config_671B.json (the MTP module is not counted)
    Arch("deepseek-v3", 129280, 7168, 61, 128, 128, 18432, n_experts=256, top_k=8, n_shared=1,
         moe_d_ff=2048, n_dense_layers=3, router_bias=True, q_lora_rank=1536,
         kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=128),
    # Brown et al. 2020, Table 2.1; GPT-2 layout: LayerNorm, biases, tied head, GELU MLP F = 4D
    Arch("gpt-3-175b", 50257, 12288, 96, 96, 96, 4 * 12288, tied=True, mlp="gelu",
         norm="layer", biases=True, n_positions=2048),
    # state-spaces/mamba-130m-hf: 24 Mamba mixers, no MLP, no attention, tied head
    Arch("mamba-130m", 50280, 768, 24, 1, 1, 0, tied=True, pattern="M"),
]}


def get(name):
    """The named Arch; an unknown name raises ValueError listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"accounting: unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def from_model_config(cfg, name="model"):
    """The Arch of a `scratchllm.config.ModelConfig` (or any object with its attribute names).

    Reads vocab_size, d_model, n_layers, n_heads, d_ff (required) and the optional n_kv_heads,
    head_dim, tie_embeddings, attention ("gqa" | "mla") with the MLA dims, ffn ("swiglu" | "moe")
    with the MoE sizes, window, n_sink and a hybrid layer pattern, all with getattr, so this
    module never imports the model. The LM keeps the MoE selection bias as a buffer, not a
    Param, so router_bias stays False: totals equal the LM's named_parameters() sizes."""
    missing = [n for n in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff")
               if getattr(cfg, n, None) is None]
    if missing:
        raise TypeError(f"from_model_config: cfg ({type(cfg).__name__}) has no "
                        f"{', '.join(missing)}; expected a scratchllm.config.ModelConfig")
    moe = _attr(cfg, "ffn", default="swiglu") == "moe"
    mla = _attr(cfg, "attention", default="gqa") == "mla"
    moe_sizes = dict(
        n_experts=_attr(cfg, "n_experts", "num_experts", "E"),
        top_k=_attr(cfg, "top_k", "k"), n_shared=_attr(cfg, "n_shared"),
        moe_d_ff=_attr(cfg, "moe_d_ff", "expert_d_ff", "d_ff_expert"),
        n_dense_layers=_attr(cfg, "n_dense_layers"), moe_every=_attr(cfg, "moe_every", default=1))
    mla_sizes = dict(
        q_lora_rank=_attr(cfg, "q_lora_rank"), kv_lora_rank=_attr(cfg, "kv_lora_rank"),
        qk_nope=_attr(cfg, "qk_nope_head_dim", "qk_nope"),
        qk_rope=_attr(cfg, "qk_rope_head_dim", "qk_rope"), v_head_dim=_attr(cfg, "v_head_dim"))
    return Arch(
        name, cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads,
        _attr(cfg, "n_kv_heads") or cfg.n_heads, cfg.d_ff, head_dim=_attr(cfg, "head_dim"),
        tied=bool(_attr(cfg, "tie_embeddings", "tied")), window=_attr(cfg, "window"),
        n_sink=_attr(cfg, "n_sink"), pattern=_attr(cfg, "layer_pattern", "pattern", default=""),
        d_state=_attr(cfg, "d_state", default=16), d_conv=_attr(cfg, "d_conv", default=4),
        expand=_attr(cfg, "expand", default=2),
        **(moe_sizes if moe else {}), **(mla_sizes if mla else {}))


def _attr(cfg, *names, default=0):
    """The first of `names` that cfg has and is not None, else `default`."""
    for n in names:
        if getattr(cfg, n, None) is not None:
            return getattr(cfg, n)
    return default
