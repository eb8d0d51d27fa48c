"""The attention specs: RoPE, the mask, how scores are computed, a GQA layer and its position
biases (specs/mla.py holds DeepSeek's attentions). Frozen, plain Python.

A spec travels unchanged from the ModelConfig through the Module into the pair: Attention
(attention/gqa.py) reads an AttentionSpec, gqa_forward(x, w, spec=..., rope=..., mask=...)
reads the same object. Arrays never live in a spec; what a spec turns into at run time (RoPE's
inv_freq, a mask's boolean array) is built by the attention package from it.

Glossary: H query heads, Hkv KV heads, Dh head dim, W window, S sink tokens.
"""
import math
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, one_of, positive_int, real


# Hugging Face's rope_scaling dicts: rope_type -> (required keys, optional keys)
ROPE_SCALINGS = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor", "original_max_position_embeddings"), ()),
    "yarn": (("factor", "original_max_position_embeddings"),
             ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
              "truncate")),
    "llama3": (("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"), ()),
}


def rope_scaling_params(scaling):
    """(rope_type, the other keys as a dict) of a rope_scaling dict ("type" in older
    configs); ValueError for an unknown rope_type, an unknown or missing key, or a value
    outside its domain (_check_scaling_values)."""
    params = dict(scaling)
    if "rope_type" in params and "type" in params and params["rope_type"] != params["type"]:
        raise ValueError(f"rope_type={params['rope_type']!r} and type={params['type']!r} "
                         f"disagree; give one")
    rope_type = params.pop("rope_type", params.pop("type", None))
    params.pop("type", None)
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"scaling['rope_type'] = {rope_type!r} is not one of "
                         f"{sorted(ROPE_SCALINGS)}")
    required, optional = ROPE_SCALINGS[rope_type]
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} for rope_type {rope_type!r}; valid keys: "
                         f"{['rope_type', *required, *optional]}")
    missing = [k for k in required if params.get(k) is None]
    if missing:
        raise ValueError(f"rope_type {rope_type!r} needs key(s) {missing}")
    _check_scaling_values(rope_type, params)
    return rope_type, params


def _number(params, key, low, *, strict=True):
    """params[key] (when present and not None) is a finite real > low (>= low if not
    strict); an int where the key counts positions."""
    v = params.get(key)
    if v is None:
        return
    if key == "original_max_position_embeddings":
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {v!r}"
                             + (" (a string)" if isinstance(v, str) else ""))
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (
            v <= low if strict else v < low):
        raise ValueError(f"{key} must be a finite number {'>' if strict else '>='} {low}, "
                         f"got {v!r}")


def _check_scaling_values(rope_type, params):
    """The domains HF's rope init functions assume: a factor >= 1 (a factor below 1 would
    compress positions the other way), yarn's beta_fast > beta_slow > 0, llama3's
    0 < low_freq_factor < high_freq_factor, and counts of positions as integers."""
    _number(params, "factor", 1.0, strict=False)
    _number(params, "original_max_position_embeddings", 1)
    for key in ("beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor", "mscale",
                "mscale_all_dim"):
        _number(params, key, 0.0)
    _number(params, "attention_factor", 0.0)
    if rope_type == "yarn" and params.get("beta_fast", 32) <= params.get("beta_slow", 1):
        raise ValueError(f"yarn needs beta_fast > beta_slow, got beta_fast="
                         f"{params.get('beta_fast', 32)!r}, beta_slow="
                         f"{params.get('beta_slow', 1)!r}")
    if rope_type == "llama3" and params["low_freq_factor"] >= params["high_freq_factor"]:
        raise ValueError(f"llama3 needs low_freq_factor < high_freq_factor, got "
                         f"{params['low_freq_factor']!r} >= {params['high_freq_factor']!r}")
    if "truncate" in params and not isinstance(params["truncate"], bool):
        raise ValueError(f"truncate must be True or False, got {params['truncate']!r}")


@dataclass(frozen=True)
class RopeSpec:
    """Rotary positions (Su et al. 2021, arXiv 2104.09864): theta_i = base^(-2i/Dh).

    scaling is Hugging Face's rope_scaling dict (linear, dynamic, yarn, llama3, ...) or None;
    style "half" pairs (i, i + Dh/2) (rotate_half: HF, GPT-NeoX), "interleaved" pairs
    (2i, 2i + 1) (RoFormer, Meta's Llama); partial: the fraction of each head that turns, the
    first int(Dh partial) numbers (transformers' partial_rotary_factor: GPT-NeoX, Phi,
    Qwen3-Next), the rest passing unchanged (attention/rope.py makes a Rope per call).
    mrope_section (Qwen2-VL's M-RoPE): the Dh/2 pairs in consecutive sections of these sizes,
    section s rotated by position row s mod 3 (temporal, height, width); positions are then
    (3, T) or (3, B, T). axial (Qwen2-VL's tower): section pair j of n turns at base^(-j/n)."""
    base: float = 10000.0
    scaling: dict = None
    style: str = "half"
    partial: float = 1.0
    mrope_section: tuple = None
    axial: bool = False

    def __post_init__(self):
        real(self, "base", 1.0, open_low=True)
        real(self, "partial", 0, open_low=True)
        if self.partial > 1:
            fail(self, f"partial={self.partial} is the fraction of a head RoPE turns: at most 1",
                 "partial")
        instance(self, "scaling", dict, none_ok=True)
        one_of(self, "style", ("half", "interleaved"))
        flag(self, "axial")
        sections = self.mrope_section
        if (self.axial or sections is not None) and (not isinstance(sections, tuple) or not all(
                type(n) is int and n > 0 for n in sections) or not sections):
            fail(self, f"mrope_section must be a tuple of positive ints (pairs per position "
                       f"section; axial needs it) or None, got {sections!r}", "mrope_section")
        if self.axial and (self.scaling is not None or self.partial != 1):
            fail(self, "axial frequencies take no scaling and turn the whole head (partial 1)",
                 "axial")
        if self.scaling is not None:
            try:
                rope_scaling_params(self.scaling)
            except ValueError as e:
                fail(self, f"scaling: {e}", "scaling")


@dataclass(frozen=True)
class Mask:
    """Which keys a query may attend: one vocabulary for sdpa, flash, gqa, mla and decoding.

    causal: key j <= query i.  window W: also i - j < W (sliding window, Mistral; needs
    causal).  n_sink S: the first S keys stay visible beside the window (StreamingLLM, Xiao et
    al. 2023).  block (with n_global): the block-sparse pattern of attention/masks.py.
    array: an explicit boolean array broadcastable to (B, H, Tq, Tk), True = may attend, for
    what the names cannot say (it excludes the other fields).  Mask(causal=False) attends
    everywhere (an encoder).  attention/masks.py mask_array(mask, Tq, Tk) builds the array."""
    causal: bool = True
    window: int = None
    n_sink: int = 0
    block: int = None
    n_global: int = 0
    array: object = None
    chunk: int = None

    def __post_init__(self):
        flag(self, "causal")
        positive_int(self, "window", none_ok=True)
        positive_int(self, "n_sink", low=0)
        positive_int(self, "block", none_ok=True)
        positive_int(self, "n_global", low=0)
        positive_int(self, "chunk", none_ok=True)
        if self.chunk is not None and (self.window is not None or self.block is not None
                                       or not self.causal):
            fail(self, f"chunk={self.chunk} is a causal pattern of its own: it excludes "
                       f"window, block and causal=False")
        if self.window is not None and not self.causal:
            fail(self, f"window={self.window} needs causal=True (a sliding window looks back)")
        if self.n_sink and self.window is None:
            fail(self, f"n_sink={self.n_sink} keeps sink tokens beside a window; give window")
        if self.n_global and self.block is None:
            fail(self, f"n_global={self.n_global} belongs to a block pattern; give block")
        if self.block is not None and (self.window is not None or not self.causal):
            fail(self, f"block={self.block} is a causal pattern of its own: it excludes window "
                       f"and causal=False")
        if self.array is not None and (self.window or self.n_sink or self.block or self.chunk
                                       or not self.causal):
            fail(self, "array excludes window, n_sink, block, chunk and causal=False: put the "
                       "whole pattern in the array")

    @property
    def is_plain_causal(self):
        """The lower triangle and nothing else."""
        return (self.causal and self.window is None and self.block is None
                and self.array is None and self.chunk is None)


@dataclass(frozen=True)
class ScoresSpec:
    """How a layer computes its scores. impl "sdpa" (dense scores) or "flash" (tiled, block x
    block); softcap c: the scores become c tanh(scores / c) before the mask (Gemma 2; impl
    "sdpa"), None for plain scores. AttentionSpec.scores; its impl, block and softcap read
    through as AttentionSpec.impl, .block and .softcap."""
    impl: str = "sdpa"
    block: int = 128
    softcap: float = None

    def __post_init__(self):
        one_of(self, "impl", ("sdpa", "flash"))
        positive_int(self, "block")
        real(self, "softcap", 0, open_low=True, none_ok=True)
        if self.impl == "flash" and self.softcap is not None:
            fail(self, "softcap caps the dense scores: it needs impl='sdpa'", "softcap")


@dataclass(frozen=True)
class AttentionSpec:
    """A grouped-query attention layer (GQA, Ainslie et al. 2023; MHA at Hkv = H, MQA at 1).

    head_dim None means d_model / n_heads.  qkv_bias, o_bias: biases on the projections
    (Qwen2; GPT-2).  qk_norm: an RMSNorm over each q and k head before RoPE (True: Qwen3,
    Gemma 3), or "full": over the whole q and k projections (H*Dh and Hkv*Dh: OLMo 2), with
    its eps and gain offset (Gemma: gain = offset + g).  scale: the softmax scale (None =
    Dh^-1/2); qk_norm "l2": the RMSNorm over each head without gains (Llama 4's
    L2-norm, which it applies after RoPE: a rotation keeps the norm, so the order does not
    matter).  sinks: a learned sink logit per head (gpt-oss).  rope None: no rotary positions
    (NoPE, or GPT-2's learned table); position_bias: a bias on the scores instead, "alibi"
    (ALiBi's fixed per-head slopes), a RelativeBiasSpec (T5's learned relative position
    bias: the layer owns a (num_buckets, H) table) or a TemperatureSpec (not a bias: Llama
    4's per-query scale growing with the position), None for none.  mask: the Mask every call
    of the layer uses (decoding keeps window + n_sink keys).  scores: a ScoresSpec, dense or
    flash and the soft-cap (read as .impl, .block, .softcap).  output_gate: the heads' output
    times sigmoid(x Wg (+ bg with qkv_bias)) before wo, one gate per head and channel (gated
    attention, Qiu et al. 2025, arXiv 2505.06708: Qwen3-Next)."""
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = None
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: object = False
    norm_eps: float = 1e-6
    norm_offset: float = 0.0
    scale: float = None
    sinks: bool = False
    rope: RopeSpec = RopeSpec()
    position_bias: object = None
    mask: Mask = Mask()
    scores: ScoresSpec = ScoresSpec()
    output_gate: bool = False

    def __post_init__(self):
        for name in ("n_heads", "n_kv_heads"):
            positive_int(self, name)
        positive_int(self, "head_dim", none_ok=True)
        for name in ("qkv_bias", "o_bias", "sinks", "output_gate"):
            flag(self, name)
        if not isinstance(self.qk_norm, bool) and self.qk_norm not in ("full", "l2"):
            fail(self, f"qk_norm must be False, True (per head) 'full' (over the whole "
                       f"projection) or 'l2' (per head, no gains), got {self.qk_norm!r}",
                 "qk_norm")
        real(self, "norm_eps", 0, open_low=True)
        real(self, "norm_offset")
        real(self, "scale", 0, open_low=True, none_ok=True)
        instance(self, "rope", RopeSpec, none_ok=True)
        instance(self, "mask", Mask)
        instance(self, "scores", ScoresSpec)
        if self.n_heads % self.n_kv_heads:
            fail(self, f"n_heads={self.n_heads} must be a multiple of n_kv_heads="
                       f"{self.n_kv_heads}")
        if self.position_bias != "alibi":
            instance(self, "position_bias", (RelativeBiasSpec, TemperatureSpec), none_ok=True)
        if self.rope is not None and self.position_bias is not None:
            fail(self, "rope and a position bias are two position schemes; give one (rope=None "
                       "with position_bias)", "position_bias")
        if self.head_dim is not None and self.rope is not None and self.head_dim % 2:
            fail(self, f"RoPE rotates pairs: head_dim={self.head_dim} must be even")
        if self.relative is not None and (self.impl != "sdpa" or self.mask.window is not None):
            fail(self, "a relative position bias (T5's) needs impl='sdpa' and no window",
                 "position_bias")
        if self.impl == "flash" and (self.mask.array is not None or self.mask.block
                                     or self.mask.chunk):
            fail(self, "impl='flash' tiles causal, window and n_sink; a mask array or a block "
                       "pattern needs impl='sdpa', and so do chunks")

    @property
    def impl(self):
        """scores.impl: "sdpa" or "flash"."""
        return self.scores.impl

    @property
    def block(self):
        """scores.block: flash's tile."""
        return self.scores.block

    @property
    def softcap(self):
        """scores.softcap: the soft-cap of the scores, or None."""
        return self.scores.softcap

    @property
    def alibi(self):
        """position_bias is ALiBi's."""
        return self.position_bias == "alibi"

    @property
    def temperature(self):
        """position_bias when it is Llama 4's query temperature (a TemperatureSpec), else None."""
        return self.position_bias if isinstance(self.position_bias, TemperatureSpec) else None

    @property
    def relative(self):
        """position_bias when it is T5's relative bias (a RelativeBiasSpec), else None."""
        return self.position_bias if isinstance(self.position_bias, RelativeBiasSpec) else None

    def dh(self, d_model):
        """Dh for a model of width d_model."""
        if self.head_dim is None and d_model % self.n_heads:
            fail(self, f"d_model={d_model} must be divisible by n_heads={self.n_heads} "
                       f"(or give head_dim)")
        return self.head_dim or d_model // self.n_heads

    def n_params(self, d_model):
        """wq, wk, wv, wo (+ biases, QK-norm gains, sink logits, relative bias table, the
        output gate's wg)."""
        D, H, Hkv, Dh = d_model, self.n_heads, self.n_kv_heads, self.dh(d_model)
        n = D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + self.n_biases(d_model)
        n += D * H * Dh if self.output_gate else 0
        n += {"full": (H + Hkv) * Dh, "l2": 0, True: 2 * Dh}.get(self.qk_norm, 0)
        n += self.relative.num_buckets * H if self.relative is not None else 0
        return n + (H if self.sinks else 0)

    def n_biases(self, d_model):
        """The bias vectors among n_params: bq, bk, bv (qkv_bias; and bg with output_gate) and
        bo (o_bias)."""
        heads = self.n_heads * (2 if self.output_gate else 1) + 2 * self.n_kv_heads
        qkv = heads * self.dh(d_model) if self.qkv_bias else 0
        return qkv + (d_model if self.o_bias else 0)

    def kv_per_token(self, d_model):
        """Numbers a decoding state holds per token: K and V of every KV head."""
        return 2 * self.n_kv_heads * self.dh(d_model)


@dataclass(frozen=True)
class RelativeBiasSpec:
    """T5's relative position bias (Raffel et al. 2019, arXiv 1910.10683, section 2.1): a
    learned scalar per head and bucket of the offset key - query, added to the scores.
    num_buckets: the buckets (half of them per sign when bidirectional); max_distance: the
    offset from which every larger one shares the last bucket; bidirectional: keys after the
    query get buckets of their own (an encoder), else they share bucket 0 with the query
    (a causal decoder)."""
    num_buckets: int = 32
    max_distance: int = 128
    bidirectional: bool = True

    def __post_init__(self):
        positive_int(self, "num_buckets", low=2)
        positive_int(self, "max_distance")
        flag(self, "bidirectional")
        exact = self.num_buckets // (2 if self.bidirectional else 1) // 2
        if exact < 1 or self.max_distance <= exact:
            fail(self, f"max_distance={self.max_distance} must exceed the exact buckets "
                       f"({exact} per sign of num_buckets={self.num_buckets})")


@dataclass(frozen=True)
class TemperatureSpec:
    """Llama 4's attention temperature tuning on its NoPE layers (attn_temperature_tuning;
    Nakanishi 2025, arXiv 2501.19399): the query at position p is scaled by
    1 + attn_scale log(1 + floor((p + 1) / floor_scale)), sharper attention far into a long
    context. A position scheme of a layer without RoPE (AttentionSpec.position_bias).
    Reference: huggingface/transformers src/transformers/models/llama4/modeling_llama4.py
    Llama4TextAttention."""
    attn_scale: float = 0.1
    floor_scale: int = 8192

    def __post_init__(self):
        real(self, "attn_scale", 0)
        positive_int(self, "floor_scale")
