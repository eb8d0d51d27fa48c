"""The encoder-decoder spec: two stacks of the library's one LayerSpec and the cross-attention
that joins them (Vaswani et al. 2017, arXiv 1706.03762; T5: Raffel et al. 2019, arXiv
1910.10683). Plain Python.

    encoder  x = E[input_ids];          x = block_l(x) for the encoder's layers;  e = norm(x)
    decoder  y = E[decoder_input_ids];  y = block_l(y, cross-attention to e);     h = norm(y)
    logits = s h W_head,  W_head = E^T when tied,  s = D^-1/2 with scale_output (T5), else 1
T5's relative position bias is an option of each layer's AttentionSpec (position_bias a
RelativeBiasSpec: bidirectional in the encoder, causal buckets in the decoder); shared_bias:
the first layer's table serves every layer of its stack, as T5 computes the bias once per
stack. A Switch Transformer (Fedus et al. 2021, arXiv 2101.03961) is the same with a MoESpec
as the FFN of every N-th layer.

Glossary: D model width, V vocabulary, E the shared embedding.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, positive_int
from scratchllm.specs.attention import AttentionSpec, Mask, RelativeBiasSpec
from scratchllm.specs.ffn import FFNSpec
from scratchllm.specs.model import LayerSpec, NormSpec

_T5_NORM = NormSpec("rmsnorm", 1e-6)
_T5_SELF = AttentionSpec(8, 8, head_dim=64, scale=1.0, rope=None,
                         position_bias=RelativeBiasSpec(32, 128, True), mask=Mask(causal=False))
T5_ENCODER_LAYER = LayerSpec(_T5_SELF, FFNSpec("relu_mlp", 2048), _T5_NORM)  # t5-small's
T5_DECODER_LAYER = LayerSpec(
    AttentionSpec(8, 8, head_dim=64, scale=1.0, rope=None,
                  position_bias=RelativeBiasSpec(32, 128, False), mask=Mask()),
    FFNSpec("relu_mlp", 2048), _T5_NORM)
T5_CROSS = AttentionSpec(8, 8, head_dim=64, scale=1.0, rope=None, mask=Mask(causal=False))


def _stack(spec, name, causal):
    """Every layer of the stack `name` is a LayerSpec of attention with the stack's mask."""
    layers = getattr(spec, name)
    if not isinstance(layers, tuple) or not layers or not all(
            isinstance(layer, LayerSpec) for layer in layers):
        fail(spec, f"{name} must be a non-empty tuple of LayerSpec, got {layers!r}", name)
    for i, layer in enumerate(layers):
        mixer = layer.mixer
        if not isinstance(mixer, AttentionSpec) or mixer.mask.causal != causal:
            fail(spec, f"{name}[{i}]: the {name} attends with an AttentionSpec whose mask is "
                       f"{'causal' if causal else 'Mask(causal=False)'}, got {mixer!r}", name)
        rel = mixer.relative
        if rel is not None and rel.bidirectional == causal:
            fail(spec, f"{name}[{i}]: a {'causal' if causal else 'bidirectional'} stack takes "
                       f"RelativeBiasSpec(bidirectional={not causal}), got {rel!r}", name)
        if spec.shared_bias and mixer.position_bias != layers[0].mixer.position_bias:
            fail(spec, f"{name}[{i}]: shared_bias: every layer of a stack reads the first "
                       f"layer's bias, so their position_bias must be equal ({name}[0] has "
                       f"{layers[0].mixer.position_bias!r}, got {mixer.position_bias!r})", name)


@dataclass(frozen=True)
class Seq2SeqConfig:
    """An encoder-decoder LM: vocab_size, d_model, the encoder's and the decoder's LayerSpecs
    (tuples), the decoder's cross-attention (cross: an AttentionSpec with rope=None and
    Mask(causal=False), one for every decoder layer), the final norm of each stack (norm),
    tie_embeddings (the head is the shared embedding transposed), scale_output (the decoder's
    output times D^-1/2 before the head: T5 with tied embeddings), shared_bias (each stack's
    first relative-bias table serves all its layers), decoder_start_id (the first decoder
    input: T5's pad id 0). name: the Hugging Face model_type a loaded checkpoint keeps."""
    name: str = "custom"
    vocab_size: int = 32128
    d_model: int = 512
    encoder: tuple = (T5_ENCODER_LAYER,) * 6
    decoder: tuple = (T5_DECODER_LAYER,) * 6
    cross: AttentionSpec = T5_CROSS
    norm: NormSpec = _T5_NORM
    tie_embeddings: bool = True
    scale_output: bool = True
    shared_bias: bool = True
    decoder_start_id: int = 0

    def __post_init__(self):
        if not isinstance(self.name, str):
            fail(self, f"name must be a string, got {self.name!r}", "name")
        positive_int(self, "vocab_size")
        positive_int(self, "d_model")
        for name in ("tie_embeddings", "scale_output", "shared_bias"):
            flag(self, name)
        _stack(self, "encoder", causal=False)
        _stack(self, "decoder", causal=True)
        instance(self, "cross", AttentionSpec)
        instance(self, "norm", NormSpec)
        if self.cross.rope is not None or self.cross.position_bias is not None \
                or self.cross.mask.causal:
            fail(self, f"cross: cross-attention has no positions and reads the whole encoder "
                       f"output: rope=None, no position_bias, Mask(causal=False); got "
                       f"{self.cross!r}", "cross")
        positive_int(self, "decoder_start_id", low=0)
        if self.decoder_start_id >= self.vocab_size:
            fail(self, f"decoder_start_id={self.decoder_start_id} must be < vocab_size="
                       f"{self.vocab_size}", "decoder_start_id")
        for name in ("encoder", "decoder"):
            for i, layer in enumerate(getattr(self, name)):
                layer.mixer.dh(self.d_model)  # d_model divisible by n_heads (or head_dim)

    @property
    def n_layers(self):
        """The decoder's layers (what decoding runs through)."""
        return len(self.decoder)

    def n_params(self):
        """Embedding + encoder + decoder (each layer with its cross-attention and its norm)
        + the two final norms (+ the untied head); with shared_bias one table per stack."""
        D, V = self.d_model, self.vocab_size
        n = V * D + 2 * self.norm.n_params(D) + (0 if self.tie_embeddings else D * V)
        for stack in (self.encoder, self.decoder):
            n += sum(layer.n_params(D) for layer in stack)
            rel = stack[0].mixer.relative
            if self.shared_bias and rel is not None:
                n -= (len(stack) - 1) * rel.num_buckets * stack[0].mixer.n_heads
        return n + sum(self.cross.n_params(D) + layer.norm.n_params(D)
                       for layer in self.decoder)
