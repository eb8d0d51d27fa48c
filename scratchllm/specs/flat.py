"""The flat names (`preset("dense", d_model=64, window=32)`, config.json files of older
checkpoints) mapped into a ModelConfig of specs.

Each flat name is the spec field it sets, prefixed where the flat list needs it to be unique:
attn_sinks -> AttentionSpec.sinks, attn_scale -> .scale, attn_impl -> ScoresSpec.impl
(attn_softcap -> .softcap: AttentionSpec.scores), rope_base ->
RopeSpec.base, router_bias -> RouterSpec.bias, experts -> ExpertsSpec.kind, n_shared * d_ff ->
MoESpec.d_shared, block -> LayerSpec.placement, norm / norm_eps / norm_offset -> NormSpec.
causal -> every attention layer's Mask.causal; attention_chunk -> Mask.chunk of the
"chunked_attention" layers of layer_types; nope_layers: the indices of attention layers
without RoPE (NoPE layers, whose weightless qk_norm "l2" is off too, as Llama 4's);
moe_gate_input -> MoESpec.gate_input; attn_output_gate -> AttentionSpec.output_gate;
gdn_k_heads, gdn_v_heads, gdn_k_head_dim, gdn_v_head_dim (with d_conv, norm_eps) ->
GatedDeltaNetSpec (the "N" layers); shared_gate -> MoESpec.shared_gate; rope_partial ->
RopeSpec.partial; rescale_every N -> LayerSpec.out_scale 0.5 of every N-th layer (RWKV's
inference rescale; 0 off); attn_temperature [attn_scale, floor_scale] -> a TemperatureSpec as the
position_bias of every attention layer without RoPE (Llama 4's temperature tuning); index_topk, index_n_heads, index_head_dim ->
MLASpec.indexer, an IndexerSpec when index_topk is set (DeepSeek-V3.2); mlm_head ->
HeadSpec(transform=True, gelu_approx, bias=True) (BERT's MLM head, with the FFN's GELU);
mtp_depth, mtp_weight -> ModelConfig.mtp, an MTPSpec when mtp_depth > 0 (DeepSeek-V3's
multi-token prediction; 0: none). The per-layer choices
(layer_pattern, layer_types, moe_every, moe_offset, first_k_dense) pick
the spec of each layer.
"""
from dataclasses import dataclass, fields

from scratchllm.specs._check import SpecError
from scratchllm.specs.attention import (AttentionSpec, Mask, RopeSpec, ScoresSpec,
                                        TemperatureSpec)
from scratchllm.specs.ffn import ExpertsSpec, FFNSpec, MoESpec, RouterSpec
from scratchllm.specs.mixers import (GatedDeltaNetSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                     RWKVSpec)
from scratchllm.specs.mla import IndexerSpec, MLASpec
from scratchllm.specs.model import HeadSpec, LayerSpec, ModelConfig, MTPSpec, NormSpec

LAYER_KINDS = "AMLRGDSWFN"  # attention, Mamba, linear, RetNet, GLA, DeltaNet, Mamba-2, RWKV-4,
#                             F an MLP-only layer (in a pattern with F every layer is one
#                             sub-layer: the mixers lose their FFN, Mamba-2-Hybrid's form),
#                             N Qwen3-Next's gated DeltaNet (gdn_* sizes, d_conv, norm_eps)
RECURRENT = {"L": "linear", "R": "retnet", "G": "gla", "D": "delta"}


@dataclass
class Flat:
    """Every flat name with its default (the values of today's `dense` preset)."""
    name: str = "custom"
    vocab_size: int = 1024
    d_model: int = 128
    n_layers: int = 4
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    attention: str = "gqa"
    n_heads: int = 4
    n_kv_heads: int = 2
    rope_base: float = 10000.0
    rope_scaling: dict = None
    rope_style: str = "half"
    window: int = None
    n_sink: int = 0
    positions: str = "rope"
    attn_impl: str = "sdpa"
    q_lora_rank: int = 0
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    ffn: str = "swiglu"
    d_ff: int = 384
    moe_every: int = 1
    moe_offset: int = None
    first_k_dense: int = 0
    dense_d_ff: int = None
    n_experts: int = 8
    top_k: int = 2
    capacity_factor: float = None
    n_shared: int = 0
    score: str = "softmax"
    balance_coef: float = 0.01
    z_coef: float = 0.001
    bias_gamma: float = 0.0
    layer_pattern: str = None
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    router_bias: bool = False
    experts: str = "swiglu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    attn_sinks: bool = False
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    mamba_inner_norms: bool = False
    mamba_scan: str = "sequential"
    dt_rank: int = None
    head_dim: int = None
    qkv_bias: bool = False
    qk_norm: bool = False
    o_bias: bool = False
    norm: str = "rmsnorm"
    max_positions: int = 1024
    gelu_approx: str = "tanh"
    block: str = "pre"
    norm_offset: float = 0.0
    embed_scale: bool = False
    attn_scale: float = None
    layer_types: list = None
    rope_local_base: float = None
    causal: bool = True
    type_vocab_size: int = 0
    embed_norm: bool = False
    final_norm: bool = True
    mlm_head: bool = False
    pad_id: int = None
    attn_softcap: float = None
    logit_softcap: float = None
    group_top: int = 2
    mla_norm_eps: float = 1e-6
    ssm_groups: int = 1
    attention_chunk: int = None
    nope_layers: list = None
    moe_gate_input: bool = False
    index_topk: int = None
    index_n_heads: int = 4
    index_head_dim: int = 32
    shared_gate: bool = False
    rope_partial: float = 1.0
    attn_temperature: list = None
    rescale_every: int = 0
    attn_output_gate: bool = False
    gdn_k_heads: int = 2
    gdn_v_heads: int = 4
    gdn_k_head_dim: int = 16
    gdn_v_head_dim: int = 16
    mtp_depth: int = 0
    mtp_weight: float = 0.3


FLAT_NAMES = tuple(f.name for f in fields(Flat))
RENAMED = {  # (spec, field) -> the flat name that sets it, where the two differ
    ("AttentionSpec", "sinks"): "attn_sinks", ("AttentionSpec", "scale"): "attn_scale",
    ("AttentionSpec", "output_gate"): "attn_output_gate",
    ("GatedDeltaNetSpec", "n_k_heads"): "gdn_k_heads",
    ("GatedDeltaNetSpec", "n_v_heads"): "gdn_v_heads",
    ("GatedDeltaNetSpec", "k_head_dim"): "gdn_k_head_dim",
    ("GatedDeltaNetSpec", "v_head_dim"): "gdn_v_head_dim",
    ("ScoresSpec", "impl"): "attn_impl", ("ScoresSpec", "softcap"): "attn_softcap",
    ("RopeSpec", "base"): "rope_base",
    ("RopeSpec", "scaling"): "rope_scaling", ("RopeSpec", "style"): "rope_style",
    ("RopeSpec", "partial"): "rope_partial",
    ("TemperatureSpec", "attn_scale"): "attn_temperature",
    ("TemperatureSpec", "floor_scale"): "attn_temperature",
    ("RouterSpec", "bias"): "router_bias",
    ("ExpertsSpec", "kind"): "experts", ("ExpertsSpec", "alpha"): "swiglu_alpha",
    ("ExpertsSpec", "limit"): "swiglu_limit", ("MambaSpec", "inner_norms"): "mamba_inner_norms",
    ("MambaSpec", "scan"): "mamba_scan",
    ("NormSpec", "kind"): "norm", ("NormSpec", "eps"): "norm_eps",
    ("NormSpec", "offset"): "norm_offset", ("LayerSpec", "placement"): "block",
    ("HeadSpec", "transform"): "mlm_head",
    ("MLASpec", "norm_eps"): "mla_norm_eps", ("Mamba2Spec", "n_groups"): "ssm_groups",
    ("Mask", "chunk"): "attention_chunk", ("MoESpec", "gate_input"): "moe_gate_input",
    ("IndexerSpec", "top_k"): "index_topk", ("IndexerSpec", "n_heads"): "index_n_heads",
    ("IndexerSpec", "head_dim"): "index_head_dim",
    ("MTPSpec", "depth"): "mtp_depth", ("MTPSpec", "weight"): "mtp_weight",
}


def from_flat(**flat):
    """A ModelConfig from flat names (FLAT_NAMES); an unknown name or a value a spec refuses
    is a ValueError "ModelConfig: ..." naming the flat field. Every flat field is checked,
    also those of layer kinds the config lacks (a bad value never passes unnoticed)."""
    unknown = sorted(set(flat) - set(FLAT_NAMES))
    if unknown:
        raise ValueError(f"ModelConfig: unknown field(s) {unknown}; known: {sorted(FLAT_NAMES)}")
    f = Flat(**flat)
    _check_layers(f)
    try:
        norm = NormSpec(f.norm, f.norm_eps, f.norm_offset)
        single = "F" in _kinds(f)  # one sub-layer per layer
        layers = tuple(LayerSpec(_mixer(f, i, kind), None if single and kind != "F" else
                                 _ffn(f, i), norm, f.block, _out_scale(f, i))
                       for i, kind in enumerate(_kinds(f)))
        for kind in "AMN":  # the fields of the kinds it lacks
            _mixer(f, 0, kind)
        _moe(f)
        embedded = f.positions if f.positions in ("learned", "sinusoidal") else "none"
        head = HeadSpec(True, f.gelu_approx, True) if f.mlm_head is True else HeadSpec(
            f.mlm_head)  # HeadSpec checks the flag
        mtp = MTPSpec(f.mtp_depth or 1, f.mtp_weight)  # checked even when mtp_depth is 0
        return ModelConfig(f.name, f.vocab_size, f.d_model, layers, norm, f.tie_embeddings,
                           f.embed_scale, embedded, f.max_positions, f.type_vocab_size,
                           f.embed_norm, f.final_norm, head, f.pad_id, f.logit_softcap,
                           mtp if f.mtp_depth else None)
    except SpecError as e:
        if e.spec == "ModelConfig":
            raise
        name = RENAMED.get((e.spec, e.field))
        if name is None:
            raise ValueError(f"ModelConfig: {e}") from None
        raise ValueError(f"ModelConfig: {name}{e.msg[len(e.field):]} ({e.spec}."
                         f"{e.field})") from None


def _out_scale(f, i):
    """LayerSpec.out_scale of layer i: 0.5 after every rescale_every-th block, else 1.0."""
    return 0.5 if f.rescale_every and (i + 1) % f.rescale_every == 0 else 1.0


def _kinds(f):
    return f.layer_pattern or "A" * f.n_layers


def _check_layers(f):
    """The flat-only fields (they choose per-layer specs and have no spec of their own)."""
    def bad(msg):
        raise ValueError(f"ModelConfig: {msg}")
    for name in ("n_layers", "moe_every"):
        v = getattr(f, name)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            bad(f"{name} must be a positive integer, got {v!r}")
    v = f.rescale_every
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        bad(f"rescale_every must be an integer >= 0 (0: off), got {v!r}")
    kinds = _kinds(f)
    if not isinstance(kinds, str) or len(kinds) != f.n_layers or set(kinds) - set(LAYER_KINDS):
        bad(f"layer_pattern must be {f.n_layers} letters of {LAYER_KINDS!r}, got {kinds!r}")
    if "F" in kinds and f.ffn == "none":
        bad(f"layer_pattern {kinds!r} has MLP-only layers (F) but ffn='none'")
    if f.attention not in ("gqa", "mla"):
        bad(f"attention must be 'gqa' or 'mla', got {f.attention!r}")
    if f.ffn not in ("swiglu", "moe", "gelu_mlp", "geglu", "relu_mlp", "channel_mix",
                     "none"):
        bad(f"ffn must be 'swiglu', 'moe', 'gelu_mlp', 'geglu', 'relu_mlp' or 'none' (or "
            f"'channel_mix', RWKV-4's), got {f.ffn!r}")
    if f.positions not in ("rope", "alibi", "sinusoidal", "nope", "learned"):
        bad(f"positions must be 'rope', 'alibi', 'sinusoidal', 'nope' or 'learned', got "
            f"{f.positions!r}")
    if f.moe_offset is not None and (isinstance(f.moe_offset, bool) or not isinstance(
            f.moe_offset, int) or not 0 <= f.moe_offset < f.moe_every):
        bad(f"moe_offset must be None or an integer in [0, moe_every={f.moe_every}), got "
            f"{f.moe_offset!r}")
    if isinstance(f.first_k_dense, bool) or not isinstance(f.first_k_dense, int) \
            or f.first_k_dense < 0:
        bad(f"first_k_dense must be an integer >= 0, got {f.first_k_dense!r}")
    if f.dense_d_ff is not None and (isinstance(f.dense_d_ff, bool) or not isinstance(
            f.dense_d_ff, int) or f.dense_d_ff <= 0):
        bad(f"dense_d_ff must be None or a positive integer, got {f.dense_d_ff!r}")
    types = f.layer_types
    if types is not None and (len(types) != f.n_layers or set(types) - {
            "full_attention", "sliding_attention", "chunked_attention"}):
        bad(f"layer_types must be {f.n_layers} of 'full_attention'/'sliding_attention'/"
            f"'chunked_attention', got {types!r}")
    if types is not None and "sliding_attention" in types and f.window is None:
        bad("layer_types has sliding_attention layers but window is None")
    if (types is not None and "chunked_attention" in types) != (f.attention_chunk is not None):
        bad(f"attention_chunk={f.attention_chunk!r} goes with 'chunked_attention' layers in "
            f"layer_types (one without the other does nothing)")
    nope = f.nope_layers
    if nope is not None and (not isinstance(nope, (list, tuple)) or any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < f.n_layers
            for i in nope) or list(nope) != sorted(set(nope)) or f.positions != "rope"):
        bad(f"nope_layers must be None or increasing layer indices in [0, {f.n_layers}) of a "
            f"model with positions='rope', got {nope!r} (positions={f.positions!r})")
    if f.n_sink and f.window is None:
        bad(f"n_sink={f.n_sink} needs a window (the sink tokens are kept beside it)")
    if f.attention == "mla" and (f.positions != "rope" or f.attn_impl != "sdpa"
                                 or f.window is not None or f.head_dim or f.qkv_bias
                                 or f.qk_norm or f.attn_softcap is not None
                                 or f.attention_chunk or f.nope_layers
                                 or f.attn_output_gate):
        bad("attention='mla' supports positions='rope', attn_impl='sdpa', no window, and none "
            "of head_dim, qkv_bias, qk_norm, attn_softcap, attention_chunk, nope_layers, "
            "attn_output_gate (options of attention='gqa')")
    temp = f.attn_temperature
    if temp is not None and (not isinstance(temp, (list, tuple)) or len(temp) != 2
                             or not (f.positions == "nope" or f.nope_layers)):
        bad(f"attn_temperature must be None or [attn_scale, floor_scale] for a model with "
            f"layers without RoPE (positions='nope' or nope_layers), got {temp!r}")
    if f.index_topk is not None and f.attention != "mla":
        bad(f"index_topk={f.index_topk} (DeepSeek-V3.2's indexer) needs attention='mla'")
    if f.positions != "rope" and f.rope_partial != 1.0:
        bad(f"rope_partial={f.rope_partial} acts only through RoPE, and positions="
            f"{f.positions!r}")
    if f.positions != "rope" and (f.rope_scaling is not None or f.rope_style != "half"):
        bad(f"rope_scaling={f.rope_scaling!r} and rope_style={f.rope_style!r} act only "
            f"through RoPE, and positions={f.positions!r}")


def _attention_layer(f, i):
    """(Mask, RopeSpec) of attention layer i: with layer_types, a sliding layer has the
    window and rope_local_base without scaling when that is given (Gemma 3), else the full
    layers' RoPE (gpt-oss); a chunked layer has chunks of attention_chunk (Llama 4) and no
    window, a full layer neither."""
    window, base, scaling = f.window, f.rope_base, f.rope_scaling
    kind = None if f.layer_types is None else f.layer_types[i]
    if kind in ("full_attention", "chunked_attention"):
        window = None
    elif kind is not None and f.rope_local_base is not None:
        base, scaling = f.rope_local_base, None
    chunk = f.attention_chunk if kind == "chunked_attention" else None
    mask = Mask(f.causal, window=window, n_sink=f.n_sink if window else 0, chunk=chunk)
    return mask, RopeSpec(base, scaling, f.rope_style, f.rope_partial)


def _mixer(f, i, kind):
    if kind == "F":  # an MLP-only layer
        return None
    if kind in RECURRENT:
        return RecurrentSpec(RECURRENT[kind], f.n_heads)
    if kind == "S":
        return Mamba2Spec(f.n_heads, f.d_state, f.expand, f.d_conv, n_groups=f.ssm_groups)
    if kind == "W":
        return RWKVSpec()
    if kind == "N":
        return GatedDeltaNetSpec(f.gdn_k_heads, f.gdn_v_heads, f.gdn_k_head_dim,
                                 f.gdn_v_head_dim, f.d_conv, f.norm_eps)
    if kind == "M":
        return MambaSpec(f.d_state, f.d_conv, f.expand, f.dt_rank, f.mamba_inner_norms,
                         f.norm_eps, f.mamba_scan)
    mask, rope = _attention_layer(f, i)
    if f.attention == "mla":
        indexer = None if f.index_topk is None else IndexerSpec(
            f.index_n_heads, f.index_head_dim, f.index_topk)
        return MLASpec(f.n_heads, f.q_lora_rank, f.kv_lora_rank, f.qk_nope_head_dim,
                       f.qk_rope_head_dim, f.v_head_dim, f.mla_norm_eps, rope,
                       indexer=indexer)
    nope = f.positions != "rope" or i in (f.nope_layers or ())
    qk_norm = False if nope and f.qk_norm == "l2" and f.nope_layers else f.qk_norm
    bias = "alibi" if f.positions == "alibi" else None
    if nope and f.attn_temperature is not None and bias is None:
        bias = TemperatureSpec(*f.attn_temperature)
    return AttentionSpec(
        f.n_heads, f.n_kv_heads, f.head_dim, f.qkv_bias, f.o_bias, qk_norm, f.norm_eps,
        f.norm_offset, f.attn_scale, f.attn_sinks, None if nope else rope,
        bias, mask=mask, scores=ScoresSpec(f.attn_impl, softcap=f.attn_softcap),
        output_gate=f.attn_output_gate)


def is_moe_layer(f, i):
    offset = f.moe_every - 1 if f.moe_offset is None else f.moe_offset
    return f.ffn == "moe" and i >= f.first_k_dense and i % f.moe_every == offset


def _ffn(f, i):
    if f.ffn == "none":
        return None
    if f.ffn in ("gelu_mlp", "geglu", "relu_mlp", "channel_mix"):
        return FFNSpec(f.ffn, f.d_ff, f.gelu_approx)
    if not is_moe_layer(f, i):  # a dense layer (of an MoE model: dense_d_ff wide)
        return FFNSpec("swiglu", f.dense_d_ff or f.d_ff)
    return _moe(f)


def _moe(f):
    router = RouterSpec(f.n_experts, f.top_k, f.score, f.router_bias, f.n_group, f.topk_group,
                        f.norm_topk_prob, f.routed_scaling_factor, f.bias_gamma,
                        group_top=f.group_top)
    experts = ExpertsSpec(f.experts, f.d_ff, f.swiglu_alpha, f.swiglu_limit)
    return MoESpec(router, experts, f.capacity_factor, f.n_shared * f.d_ff, f.balance_coef,
                   f.z_coef, gate_input=f.moe_gate_input, shared_gate=f.shared_gate)
