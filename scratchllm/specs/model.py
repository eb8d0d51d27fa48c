"""ModelConfig: a trunk (vocabulary, width, embedding, final norm) plus one LayerSpec per layer.

A LayerSpec is a token mixer spec (AttentionSpec, MLASpec, MambaSpec, Mamba2Spec,
RecurrentSpec, RWKVSpec, GatedDeltaNetSpec), an FFN spec (FFNSpec, MoESpec or None for a mixer-only block), the
norm and where it sits: "pre" (x + f(norm(x))), "post" (norm(x + f(x)): Vaswani et al. 2017)
"sandwich" (x + norm(f(norm(x))): Gemma 2, 3) or "output" (x + norm(f(x)): OLMo 2's norm on
the sub-layer's output only). lm/ builds one Block per LayerSpec; teach/
sizes the same objects, so `size` and `LM` can never disagree. Plain Python: no numpy here.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, one_of, positive_int, real
from scratchllm.specs.attention import AttentionSpec
from scratchllm.specs.ffn import FFNSpec, MoESpec
from scratchllm.specs.mixers import (GatedDeltaNetSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                     RWKVSpec)
from scratchllm.specs.mla import MLASpec

MIXERS = (AttentionSpec, MLASpec, MambaSpec, Mamba2Spec, RecurrentSpec, RWKVSpec,
          GatedDeltaNetSpec)
FFNS = (FFNSpec, MoESpec)


@dataclass(frozen=True)
class NormSpec:
    """A norm: "rmsnorm" (Zhang & Sennrich 2019) or "layernorm" (with bias: GPT-2), eps, and
    a gain offset (Gemma stores w with gain = offset + w)."""
    kind: str = "rmsnorm"
    eps: float = 1e-5
    offset: float = 0.0

    def __post_init__(self):
        one_of(self, "kind", ("rmsnorm", "layernorm"))
        real(self, "eps", 0, open_low=True)
        real(self, "offset")

    def n_params(self, d_model):
        return 2 * d_model if self.kind == "layernorm" else d_model


@dataclass(frozen=True)
class HeadSpec:
    """The output head after the last block (and the final norm): logits = t(h) W_head (+ b).
    transform: t(h) = norm(gelu(h W_t + b_t)), the norm the trunk's NormSpec (BERT's MLM head
    transform; else t(h) = h); gelu_approx: its GELU, "none" (erf) or "tanh"; bias: an output
    bias b of V numbers (BERT's cls.predictions.bias)."""
    transform: bool = False
    gelu_approx: str = "none"
    bias: bool = False

    def __post_init__(self):
        flag(self, "transform")
        one_of(self, "gelu_approx", ("tanh", "none"))
        flag(self, "bias")

    def n_params(self, d_model, vocab_size):
        return (d_model * d_model + 3 * d_model if self.transform else 0) + (
            vocab_size if self.bias else 0)


@dataclass(frozen=True)
class MTPSpec:
    """Multi-token prediction after the trunk (DeepSeek-V3; lm/mtp.py): depth modules, module
    k predicting the token k + 1 ahead through one block of the trunk's last LayerSpec; their
    loss weighted weight / depth (DeepSeek-V3: 0.3, later 0.1)."""
    depth: int = 1
    weight: float = 0.3

    def __post_init__(self):
        positive_int(self, "depth")
        real(self, "weight", 0)

    def n_params(self, d_model, layer, norm, active=False):
        """Per module: two input norms, the 2D -> D map, a block, its own final norm."""
        D = d_model
        return self.depth * (2 * D * D + 3 * norm.n_params(D) + layer.n_params(D, active))


@dataclass(frozen=True)
class LayerSpec:
    """One block: mixer, ffn (None = the block is the mixer alone), norm and its placement.
    mixer None: an MLP-only layer, the FFN sub-layer alone (NVIDIA's Mamba-2-Hybrid, Waleffe
    et al. 2024, arXiv 2406.07887, makes each layer one of Mamba-2, attention or an MLP).
    out_scale: the block's output y times out_scale (1.0: as is; RWKV's inference rescale
    halves the hidden state after every rescale_every-th block: 0.5)."""
    mixer: object = AttentionSpec()
    ffn: object = FFNSpec()
    norm: NormSpec = NormSpec()
    placement: str = "pre"
    out_scale: float = 1.0

    def __post_init__(self):
        instance(self, "mixer", MIXERS, none_ok=True)
        instance(self, "ffn", FFNS, none_ok=True)
        if self.mixer is None and self.ffn is None:
            fail(self, "a layer needs a mixer, an FFN or both; both are None")
        if self.mixer is None and self.placement != "pre":
            fail(self, f"an MLP-only block (mixer=None) is pre-norm, got {self.placement!r}")
        instance(self, "norm", NormSpec)
        one_of(self, "placement", ("pre", "post", "sandwich", "output"))
        real(self, "out_scale", 0, open_low=True)
        if self.ffn is None and self.placement != "pre":
            fail(self, f"a mixer-only block (ffn=None) is pre-norm, got {self.placement!r}")

    @property
    def n_norms(self):
        """norm1 (+ norm2 with an FFN) (+ the two output norms of a sandwich block); an
        "output" block's norm1 and norm2 sit on the sub-layers' outputs."""
        subs = (self.mixer is not None) + (self.ffn is not None)
        return subs * (2 if self.placement == "sandwich" else 1)

    def n_params(self, d_model, active=False):
        ffn = 0 if self.ffn is None else (
            self.ffn.n_params(d_model, active) if isinstance(self.ffn, MoESpec)
            else self.ffn.n_params(d_model))
        mixer = 0 if self.mixer is None else self.mixer.n_params(d_model)
        return mixer + ffn + self.n_norms * self.norm.n_params(d_model)


@dataclass(frozen=True)
class ModelConfig:
    """A decoder LM: the trunk fields and `layers`, one LayerSpec per layer (a tuple).

    positions: what the embedding adds ("none"; "learned": GPT-2's wpe of max_positions rows;
    "sinusoidal": Vaswani et al.'s fixed table); RoPE and ALiBi live in each AttentionSpec.
    embed_scale: x_0 = E[ids] sqrt(D) (Gemma).  tie_embeddings: the head is E^T.
    type_vocab_size: rows of a token-type table added to x_0 (BERT's segments; 0 = none);
    embed_norm: the trunk's norm on x_0 (BERT); final_norm: the norm after the last block
    (False: post-norm encoders, whose blocks end in a norm); head: the output head;
    pad_id: the token whose embedding lookups pass no gradient (torch's Embedding
    padding_idx: BERT's pad_token_id; None = none);
    logit_softcap c: the logits become c tanh(logits / c) (Gemma 2), None for plain logits;
    mtp: an MTPSpec (multi-token-prediction modules after the trunk, DeepSeek-V3's) or None."""
    name: str = "custom"
    vocab_size: int = 1024
    d_model: int = 128
    layers: tuple = (LayerSpec(),) * 4
    norm: NormSpec = NormSpec()
    tie_embeddings: bool = False
    embed_scale: bool = False
    positions: str = "none"
    max_positions: int = 1024
    type_vocab_size: int = 0
    embed_norm: bool = False
    final_norm: bool = True
    head: HeadSpec = HeadSpec()
    pad_id: int = None
    logit_softcap: float = None
    mtp: MTPSpec = None

    def __post_init__(self):
        if not isinstance(self.name, str):
            fail(self, f"name must be a string, got {self.name!r}")
        positive_int(self, "vocab_size")
        positive_int(self, "d_model")
        positive_int(self, "max_positions")
        if not isinstance(self.layers, tuple) or not self.layers:
            fail(self, f"layers must be a non-empty tuple of LayerSpec, got {self.layers!r}")
        for i, layer in enumerate(self.layers):
            if not isinstance(layer, LayerSpec):
                fail(self, f"layers[{i}] must be a LayerSpec, got {layer!r}")
            if isinstance(layer.mixer, AttentionSpec):
                dh = layer.mixer.dh(self.d_model)  # d_model divisible by n_heads (or head_dim)
                if layer.mixer.rope is not None and dh % 2:
                    fail(self, f"layers[{i}]: RoPE rotates pairs, head dim {dh} is odd")
            if self.positions != "none" and isinstance(layer.mixer, MLASpec):
                fail(self, f"layers[{i}]: positions={self.positions!r} is implemented for "
                           f"attention layers (AttentionSpec) only, not MLA")
        instance(self, "norm", NormSpec)
        flag(self, "tie_embeddings")
        flag(self, "embed_scale")
        one_of(self, "positions", ("none", "learned", "sinusoidal"))
        positive_int(self, "type_vocab_size", low=0)
        flag(self, "embed_norm")
        flag(self, "final_norm")
        instance(self, "head", HeadSpec)
        positive_int(self, "pad_id", low=0, none_ok=True)
        if self.pad_id is not None and self.pad_id >= self.vocab_size:
            fail(self, f"pad_id={self.pad_id} must be < vocab_size={self.vocab_size}")
        real(self, "logit_softcap", 0, open_low=True, none_ok=True)
        instance(self, "mtp", MTPSpec, none_ok=True)

    @property
    def n_layers(self):
        return len(self.layers)

    def n_params(self, active=False):
        """Parameters of LM(self), counted from the specs without allocating anything:
        embedding (+ position and token-type tables, norm) + blocks + final norm + head
        (transform, bias) (+ untied head W). active=True counts
        the K routed experts a token uses instead of all E."""
        D, V = self.d_model, self.vocab_size
        n = V * D + (self.max_positions * D if self.positions == "learned" else 0)
        n += self.type_vocab_size * D + (self.norm.n_params(D) if self.embed_norm else 0)
        n += sum(layer.n_params(D, active) for layer in self.layers)
        n += self.norm.n_params(D) if self.final_norm else 0
        if self.mtp is not None:
            n += self.mtp.n_params(D, self.layers[-1], self.norm, active)
        return n + self.head.n_params(D, V) + (0 if self.tie_embeddings else D * V)
