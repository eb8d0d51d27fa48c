"""ModelConfig: every knob of the decoder LM in one commented dataclass, and the named presets.

Presets (all small enough to train on 2 CPU cores in minutes):
    dense   Llama-style: RMSNorm pre-norm, GQA, RoPE, SwiGLU
    moe     Mixtral-style: dense attention, top-2 of 8 SwiGLU experts, balance + z losses
    mla     DeepSeek-style: MLA + fine-grained MoE with a shared expert, sigmoid scores and the
            aux-loss-free selection bias
    swa     Mistral-style: sliding-window attention with attention sinks
    hybrid  Jamba-style: Mamba and attention layers ("MAMA"), MoE FFN every other layer
    linear, deltanet, mamba2, rwkv   one recurrent mixer in every layer (lm/mixers.py)
"""
import dataclasses
from dataclasses import dataclass

from scratchllm.attention.rope import rope_frequencies
from scratchllm.core.validate import expect_finite, expect_integer

LAYER_KINDS = "AMLRGDSW"  # attention, Mamba, then the recurrent mixers of lm/mixers.py


@dataclass
class ModelConfig:
    name: str = "custom"                # a label for logs and plots
    # --- trunk
    vocab_size: int = 1024              # V: BPE vocabulary, special tokens included
    d_model: int = 128                  # D: residual stream width
    n_layers: int = 4                   # L: blocks of (mixer, FFN)
    norm_eps: float = 1e-5              # RMSNorm epsilon
    tie_embeddings: bool = False        # output head = embedding^T (Embedding.attend)
    # --- attention (layers marked "A")
    attention: str = "gqa"              # "gqa" (MHA when n_kv_heads = n_heads, MQA at 1) | "mla"
    n_heads: int = 4                    # H query heads
    n_kv_heads: int = 2                 # Hkv KV heads (GQA); query head h reads h // (H/Hkv)
    rope_base: float = 10000.0          # theta_i = base^(-2i/Dh)
    rope_scaling: dict = None           # HF-style {"rope_type": "yarn", "factor": 4, ...} or None
    rope_style: str = "half"            # "half" (rotate_half, HF) | "interleaved" (Meta)
    window: int = None                  # sliding window W (None = full causal attention)
    n_sink: int = 0                     # attention-sink tokens kept beside the window
    positions: str = "rope"             # "rope" | "alibi" (per-head linear bias) | "sinusoidal"
                                        #   (added to the embedding) | "nope" (none) |
                                        #   "learned" (a table added to the embedding: GPT-2)
    attn_impl: str = "sdpa"             # "sdpa" (dense scores) | "flash" (tiled, O(T) memory)
    # --- MLA (attention = "mla"), DeepSeek-V3 names
    q_lora_rank: int = 0                # Dq (0 = a plain wq, no query compression)
    kv_lora_rank: int = 32              # Dc: the cached KV latent
    qk_nope_head_dim: int = 32          # dn: per-head key/query part without RoPE
    qk_rope_head_dim: int = 16          # dr: RoPE part (one shared key per token)
    v_head_dim: int = 32                # dv
    # --- FFN
    ffn: str = "swiglu"                 # "swiglu" | "moe" | "none" (mixer-only blocks: Mamba-1)
    d_ff: int = 384                     # F: SwiGLU hidden width (each expert's, for MoE)
    moe_every: int = 1                  # MoE in layers i with i % moe_every == moe_offset
    moe_offset: int = None              #   (None = moe_every - 1: every moe_every-th layer)
    n_experts: int = 8                  # E routed experts
    top_k: int = 2                      # K experts per token
    capacity_factor: float = None       # per-expert capacity ceil(c N K / E); None = no drops
    n_shared: int = 0                   # shared experts (one SwiGLU of width n_shared * d_ff)
    score: str = "softmax"              # router scores: "softmax" (Mixtral) | "sigmoid" (DSv3)
    balance_coef: float = 0.01          # weight of the Switch balance loss
    z_coef: float = 0.001               # weight of the ST-MoE router z-loss
    bias_gamma: float = 0.0             # aux-loss-free bias speed (0 = off), DeepSeek-V3
    # --- hybrid (Mamba) layers
    layer_pattern: str = None           # e.g. "MAMA": M = Mamba mixer, A = attention; None = all A
                                        # (recurrent mixers, lm/mixers.py: L linear attention,
                                        # R RetNet, G GLA, D DeltaNet, S Mamba-2, W RWKV-4)
    d_state: int = 16                   # N: SSM state per channel
    d_conv: int = 4                     # causal depthwise conv width
    expand: int = 2                     # Mamba inner width = expand * D
    # --- details of released checkpoints (Hugging Face configs)
    router_bias: bool = False           # a trained router logit bias (gpt-oss)
    experts: str = "swiglu"             # MoE experts: "swiglu" (w1, w3, w2) | "clamped" (gpt-oss:
    swiglu_alpha: float = 1.702         #   interleaved gate_up with biases, gate clamped at
    swiglu_limit: float = 7.0           #   limit, up to [-limit, limit], gate sigma(alpha gate))
    attn_sinks: bool = False            # a learned sink logit per attention head (gpt-oss)
    n_group: int = 1                    # DeepSeek-V3 group-limited routing: expert groups
    topk_group: int = 1                 #   ... of which a token may route into this many
    norm_topk_prob: bool = True         # gates renormalised over the chosen k (else raw scores)
    routed_scaling_factor: float = 1.0  # gate multiplier (DeepSeek-V3: 2.5)
    mamba_inner_norms: bool = False     # Jamba's RMSNorms on dt, B, C inside Mamba layers
    dt_rank: int = None                 # R: Mamba's dt rank (None = ceil(d_model / 16))
    # --- options of published checkpoints (scratchllm.hub reads them from config.json)
    head_dim: int = None                # Dh when it is not d_model / n_heads (Qwen3, Gemma)
    qkv_bias: bool = False              # biases on the q, k, v projections (Qwen2)
    qk_norm: bool = False               # RMSNorm over each q and k head before RoPE (Qwen3)
    o_bias: bool = False                # bias on the attention output projection (GPT-2)
    norm: str = "rmsnorm"               # "rmsnorm" | "layernorm" (with bias: GPT-2)
    max_positions: int = 1024           # rows of positions="learned"'s table (GPT-2's wpe)
    gelu_approx: str = "tanh"           # ffn="gelu_mlp"/"geglu": "tanh" (GPT-2) | "none" (erf)
    block: str = "pre"                  # "pre" norm | "sandwich": also a norm on the mixer's
                                        #   and the FFN's outputs (Gemma 2, 3) | "post" norm
    norm_offset: float = 0.0            # RMSNorm gain = offset + g (Gemma: 1, g stored as w)
    embed_scale: bool = False           # x_0 = E[ids] * sqrt(D) (Gemma)
    attn_scale: float = None            # softmax scale; None = Dh^-1/2 (Gemma:
                                        #   query_pre_attn_scalar^-1/2)
    layer_types: list = None            # per layer "full_attention" | "sliding_attention"
                                        #   (window W, rope_local_base): Gemma 3
    rope_local_base: float = None       # RoPE base of the sliding layers, which then have no
                                        #   rope_scaling (Gemma 3); None = the full layers'
                                        #   RoPE, scaling included (gpt-oss)

    @property
    def dh(self):
        """Dh, the attention head dim."""
        return self.head_dim or self.d_model // self.n_heads

    def layer_kinds(self):
        """One letter per layer: "A" attention, "M" Mamba, or a recurrent mixer (LAYER_KINDS)."""
        return self.layer_pattern or "A" * self.n_layers

    def is_moe_layer(self, i):
        offset = self.moe_every - 1 if self.moe_offset is None else self.moe_offset
        return self.ffn == "moe" and i % self.moe_every == offset

    def validate(self):
        """Raise ValueError naming the first inconsistent field."""
        def bad(msg):
            raise ValueError(f"ModelConfig: {msg}")
        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff",
                  "moe_every", "n_experts", "top_k", "d_state", "d_conv", "expand"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
        if self.attention not in ("gqa", "mla"):
            bad(f"attention must be 'gqa' or 'mla', got {self.attention!r}")
        if self.ffn not in ("swiglu", "moe", "gelu_mlp", "geglu", "none"):
            bad(f"ffn must be 'swiglu', 'moe', 'gelu_mlp', 'geglu' or 'none', got {self.ffn!r}")
        for f, allowed in (("norm", ("rmsnorm", "layernorm")), ("gelu_approx", ("tanh", "none")),
                           ("block", ("pre", "sandwich", "post"))):
            if getattr(self, f) not in allowed:
                bad(f"{f} must be one of {allowed}, got {getattr(self, f)!r}")
        types = self.layer_types
        if types is not None and (len(types) != self.n_layers or set(types) - {
                "full_attention", "sliding_attention"}):
            bad(f"layer_types must be {self.n_layers} of 'full_attention'/'sliding_attention', "
                f"got {types!r}")
        if types is not None and "sliding_attention" in types and self.window is None:
            bad("layer_types has sliding_attention layers but window is None")
        if self.positions == "learned" and self.attention == "mla":
            bad("positions='learned' is implemented for attention='gqa' only")
        if self.experts not in ("swiglu", "clamped"):
            bad(f"experts must be 'swiglu' or 'clamped', got {self.experts!r}")
        if self.score not in ("softmax", "sigmoid"):
            bad(f"score must be 'softmax' or 'sigmoid', got {self.score!r}")
        if self.rope_style not in ("half", "interleaved"):
            bad(f"rope_style must be 'half' or 'interleaved', got {self.rope_style!r}")
        if self.head_dim is None and self.d_model % self.n_heads:
            bad(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or
                                          self.head_dim <= 0):
            bad(f"head_dim must be None or a positive integer, got {self.head_dim!r}")
        if self.dh % 2 or self.qk_rope_head_dim % 2:
            bad("RoPE needs even head dims (head_dim or d_model / n_heads, qk_rope_head_dim)")
        if self.attention == "mla" and (self.head_dim or self.qkv_bias or self.qk_norm):
            bad("head_dim, qkv_bias and qk_norm are options of attention='gqa' only")
        if self.n_heads % self.n_kv_heads:
            bad(f"n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}")
        self._validate_numbers()
        if self.top_k > self.n_experts:
            bad(f"top_k={self.top_k} must be <= n_experts={self.n_experts}")
        if self.window is not None and self.window < 1:
            bad(f"window must be None or >= 1, got {self.window!r}")
        if self.n_sink < 0 or (self.n_sink and self.window is None):
            bad(f"n_sink={self.n_sink} needs a window and must be >= 0")
        if self.positions not in ("rope", "alibi", "sinusoidal", "nope", "learned"):
            bad(f"positions must be 'rope', 'alibi', 'sinusoidal', 'nope' or 'learned', got "
                f"{self.positions!r}")
        if self.attn_impl not in ("sdpa", "flash"):
            bad(f"attn_impl must be 'sdpa' or 'flash', got {self.attn_impl!r}")
        if self.attention == "mla" and (self.positions != "rope" or self.attn_impl != "sdpa"):
            bad("attention='mla' supports positions='rope' and attn_impl='sdpa' only")
        if self.window is not None and self.attention == "mla":
            bad("a sliding window is implemented for attention='gqa' only")
        for f in ("n_group", "topk_group"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) <= 0:
                bad(f"{f} must be a positive integer, got {getattr(self, f)!r}")
        if self.moe_offset is not None and not (isinstance(self.moe_offset, int)
                                                and 0 <= self.moe_offset < self.moe_every):
            bad(f"moe_offset must be None or an integer in [0, moe_every={self.moe_every}), "
                f"got {self.moe_offset!r}")
        if self.dt_rank is not None and (not isinstance(self.dt_rank, int) or self.dt_rank <= 0):
            bad(f"dt_rank must be None or a positive integer, got {self.dt_rank!r}")
        kinds = self.layer_kinds()
        if len(kinds) != self.n_layers or set(kinds) - set(LAYER_KINDS):
            bad(f"layer_pattern must be {self.n_layers} letters of {LAYER_KINDS!r}, "
                f"got {kinds!r}")
        return self

    def _validate_numbers(self):
        """The real-valued knobs (finite, in their domain) and the integer ones' types."""
        fn = "ModelConfig"
        expect_finite(fn, "norm_eps", self.norm_eps, 0, open_low=True)
        for f in ("balance_coef", "z_coef", "bias_gamma"):
            expect_finite(fn, f, getattr(self, f), 0)
        for f in ("swiglu_alpha", "swiglu_limit"):
            expect_finite(fn, f, getattr(self, f), 0, open_low=True)
        if self.capacity_factor is not None:
            expect_finite(fn, "capacity_factor", self.capacity_factor, 0, open_low=True)
        if self.window is not None:
            expect_integer(fn, "window", self.window, 1)
        for f in ("n_sink", "q_lora_rank"):
            expect_integer(fn, f, getattr(self, f), 0)
        for f in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            expect_integer(fn, f, getattr(self, f), 1)
        try:  # rope_base and rope_scaling, checked the way attention will use them
            rope_frequencies(self.d_model // self.n_heads, self.rope_base, self.rope_scaling,
                             seq_len=1)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{fn}: rope_base={self.rope_base!r} / rope_scaling="
                             f"{self.rope_scaling!r}: {e}") from None

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        """Inverse of to_dict; unknown keys are an error (a config from another version)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**d).validate()


_MOE = dict(ffn="moe", n_experts=8, top_k=2, d_ff=192, balance_coef=0.01, z_coef=0.001)

PRESETS = {
    "dense": dict(),
    "moe": dict(_MOE),
    "mla": dict(_MOE, attention="mla", d_ff=96, n_shared=1, score="sigmoid", bias_gamma=1e-3,
                balance_coef=1e-4, z_coef=0.0),
    "swa": dict(window=32, n_sink=4),
    "hybrid": dict(_MOE, layer_pattern="MAMA", moe_every=2, n_experts=4),
    # recurrent mixers (issue 15): every layer one recurrence, SwiGLU FFN
    "linear": dict(layer_pattern="LLLL"),
    "deltanet": dict(layer_pattern="DDDD"),
    "mamba2": dict(layer_pattern="SSSS"),
    "rwkv": dict(layer_pattern="WWWW"),
}


def preset(name, **overrides):
    """The named preset as a ModelConfig, with field overrides (e.g. d_model=16 for tests)."""
    if name not in PRESETS:
        raise ValueError(f"preset: unknown preset {name!r}; choose from {sorted(PRESETS)}")
    fields = dict(PRESETS[name], name=name)
    fields.update(overrides)
    return ModelConfig(**fields).validate()
