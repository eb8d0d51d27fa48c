"""The vision-language specs: an image encoder's features in a decoder LM's input. LLaVA (a
Vision Transformer, a GELU projector), Qwen2-VL (its own tower with the patch merger, M-RoPE)
and the multimodal Gemma 3 (a SigLIP tower, pooled and normed projector, bidirectional
attention over each image's tokens). Plain Python.

Glossary: D model width, N patches.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, one_of, positive_int, real
from scratchllm.specs.attention import AttentionSpec
from scratchllm.specs.model import LayerSpec, ModelConfig
from scratchllm.specs.vision import MergerSpec, VisionConfig


def _check_image_tokens(spec):
    """A vision-language config's image_token_id lies in its text's vocabulary, and the LM's
    input is its token embedding alone (where image features take the image tokens' places)."""
    if spec.image_token_id >= spec.text.vocab_size:
        fail(spec, f"image_token_id={spec.image_token_id} is outside the vocabulary "
                   f"({spec.text.vocab_size})", "image_token_id")
    if spec.text.positions != "none" or spec.text.embed_scale:
        fail(spec, "the LM's input is its token embedding alone (positions='none', no "
                   "embed_scale), where image features take the image tokens' places", "text")


@dataclass(frozen=True)
class LlavaConfig:
    """A LLaVA vision-language model (Liu et al. 2023, arXiv 2304.08485): an image encoder
    (vision), a two-layer GELU projector (Linear, GELU, Linear; projector_bias, gelu_approx
    "none" (erf) | "tanh"), and a decoder LM (text). The image's hidden state after
    feature_layer blocks (transformers' hidden_states index: -2 the one before the last)
    loses its first token when select is "default" ([CLS]), is projected to the LM's width,
    and takes the places of the image_token_id tokens of the input, in order."""
    name: str = "custom"
    vision: VisionConfig = VisionConfig()
    text: ModelConfig = ModelConfig()
    feature_layer: int = -2
    select: str = "default"
    projector_bias: bool = True
    gelu_approx: str = "none"
    image_token_id: int = 0

    def __post_init__(self):
        instance(self, "vision", VisionConfig)
        instance(self, "text", ModelConfig)
        one_of(self, "select", ("default", "full"))
        one_of(self, "gelu_approx", ("none", "tanh"))
        flag(self, "projector_bias")
        positive_int(self, "image_token_id", low=0)
        L = self.vision.n_layers
        if isinstance(self.feature_layer, bool) or not isinstance(self.feature_layer, int) \
                or not -L - 1 <= self.feature_layer <= L:
            fail(self, f"feature_layer must index the {L + 1} hidden states of the vision "
                       f"encoder, got {self.feature_layer!r}", "feature_layer")
        _check_image_tokens(self)

    @property
    def n_layers(self):
        return self.text.n_layers

    def n_params(self):
        Dv, Dt = self.vision.d_model, self.text.d_model
        proj = Dv * Dt + Dt * Dt + (2 * Dt if self.projector_bias else 0)
        return self.vision.n_params() + proj + self.text.n_params()


@dataclass(frozen=True)
class Qwen2VLConfig:
    """Qwen2-VL (Wang et al. 2024, arXiv 2409.12191): a vision tower of d_vision over the
    patch rows of images of any sizes (n_channels * temporal_patch_size * patch_size^2 numbers
    each, Conv3d's kernel without bias), one LayerSpec per block (bidirectional attention with
    the axial 2-D RoPE; each frame of an image attends itself), the patch merger (merger) to
    the LM's width, and a decoder LM (text) with M-RoPE (its attention's rope.mrope_section).
    The merged image tokens take the places of the image_token_id tokens of the input, in
    order."""
    name: str = "custom"
    d_vision: int = 1280
    layers: tuple = ()
    patch_size: int = 14
    temporal_patch_size: int = 2
    n_channels: int = 3
    merger: MergerSpec = MergerSpec()
    text: ModelConfig = None
    image_token_id: int = 0

    def __post_init__(self):
        for name in ("d_vision", "patch_size", "temporal_patch_size", "n_channels"):
            positive_int(self, name)
        instance(self, "merger", MergerSpec)
        instance(self, "text", ModelConfig)
        positive_int(self, "image_token_id", low=0)
        if not isinstance(self.layers, tuple) or not self.layers or not all(
                isinstance(s, LayerSpec) and isinstance(s.mixer, AttentionSpec)
                and s.mixer.rope is not None and s.mixer.rope.axial for s in self.layers):
            fail(self, "layers must be a non-empty tuple of LayerSpecs whose attention has "
                       "the axial RoPE (RopeSpec(mrope_section=(Dh/4, Dh/4), axial=True))",
                 "layers")
        if any(getattr(s.mixer, "rope", None) is None or s.mixer.rope.mrope_section is None
               for s in self.text.layers):
            fail(self, "every layer of text needs M-RoPE (rope.mrope_section)", "text")
        _check_image_tokens(self)

    @property
    def n_layers(self):
        return self.text.n_layers

    @property
    def patch_dim(self):
        """The numbers of one patch row: C * T * P * P."""
        return self.n_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclass(frozen=True)
class PoolProjectorSpec:
    """The multimodal Gemma 3's projector: a square grid of patch vectors average-pooled to
    tokens_per_image tokens (a square number; the grid's side a multiple of its side), an
    RMSNorm (eps, gain offset + g: Gemma's 1 + w) and a matrix to the LM's width."""
    tokens_per_image: int = 256
    eps: float = 1e-6
    offset: float = 1.0

    def __post_init__(self):
        positive_int(self, "tokens_per_image")
        real(self, "eps", 0.0, open_low=True)
        real(self, "offset")
        if round(self.tokens_per_image ** 0.5) ** 2 != self.tokens_per_image:
            fail(self, f"tokens_per_image={self.tokens_per_image} must be a square (a t x t "
                       f"grid of pooled tokens)", "tokens_per_image")


@dataclass(frozen=True)
class Gemma3VLConfig:
    """The multimodal Gemma 3 (Gemma Team 2025, arXiv 2503.19786): a SigLIP tower (vision, no
    [CLS]; its last_hidden_state), the pooled projector (projector), and a Gemma 3 LM (text).
    The projected tokens take the places of the image_token_id tokens (which may lie outside
    the vocabulary: they embed as id 0 first, as transformers does); each run of consecutive
    image tokens attends itself both ways (causal elsewhere, within each layer's window)."""
    name: str = "custom"
    vision: VisionConfig = VisionConfig()
    text: ModelConfig = None
    projector: PoolProjectorSpec = PoolProjectorSpec()
    image_token_id: int = 0

    def __post_init__(self):
        instance(self, "vision", VisionConfig)
        instance(self, "text", ModelConfig)
        instance(self, "projector", PoolProjectorSpec)
        positive_int(self, "image_token_id", low=0)
        side, t = self.vision.patch.grid, round(self.projector.tokens_per_image ** 0.5)
        if self.vision.patch.cls_token or side[0] != side[1] or side[0] % t:
            fail(self, f"the tower's patches ({side[0]} x {side[1]}, cls_token="
                       f"{self.vision.patch.cls_token}) must be a square grid without [CLS] "
                       f"whose side is a multiple of {t} (tokens_per_image "
                       f"{self.projector.tokens_per_image})", "vision")

    @property
    def n_layers(self):
        return self.text.n_layers
