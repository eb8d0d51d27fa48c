"""The vision specs: the patch embedding of an image, a Vision Transformer, and the image
preprocessing a checkpoint asks for. Plain Python.

A ViT (Dosovitskiy et al. 2020, arXiv 2010.11929) cuts an image into P x P patches, embeds
each patch linearly (a stride-P convolution), optionally prepends a learned [CLS] vector,
adds a learned position table, and runs an encoder of bidirectional blocks: the library's one
LayerSpec (an AttentionSpec with rope=None and Mask(causal=False), a GELU MLP, LayerNorm).
SigLIP's vision tower (Zhai et al. 2023, arXiv 2303.15343) is the same without [CLS].

Glossary: C channels, P patch side, N = (H/P)(W/P) patches, D model width.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, one_of, positive_int, real
from scratchllm.specs.attention import AttentionSpec, Mask
from scratchllm.specs.ffn import FFNSpec
from scratchllm.specs.model import LayerSpec, NormSpec

# ViT-Base's block (Dosovitskiy et al. 2020, table 1): 12 heads, MLP 3072, LayerNorm
VIT_BASE_LAYER = LayerSpec(AttentionSpec(12, 12, qkv_bias=True, o_bias=True, rope=None,
                                         mask=Mask(causal=False)),
                           FFNSpec("gelu_mlp", 3072, gelu_approx="none"),
                           NormSpec("layernorm", 1e-12))


@dataclass(frozen=True)
class PatchSpec:
    """The patch embedding of an image of image_size = (height, width) pixels with n_channels
    channels, in patches of patch_size x patch_size; cls_token: a learned [CLS] vector goes
    first (ViT), so the position table has N + 1 rows (N without it: SigLIP); patch_bias:
    the patch map's bias (CLIP has none)."""
    image_size: tuple = (224, 224)
    patch_size: int = 16
    n_channels: int = 3
    cls_token: bool = True
    patch_bias: bool = True

    def __post_init__(self):
        positive_int(self, "patch_size")
        positive_int(self, "n_channels")
        flag(self, "cls_token")
        flag(self, "patch_bias")
        size = self.image_size
        if (not isinstance(size, tuple) or len(size) != 2
                or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in size)):
            fail(self, f"image_size must be a tuple (height, width) of positive ints, got "
                       f"{size!r}", "image_size")
        if size[0] % self.patch_size or size[1] % self.patch_size:
            fail(self, f"image_size={size} must be a multiple of patch_size={self.patch_size} "
                       f"on both sides", "image_size")

    @property
    def grid(self):
        """(H/P, W/P): patches per column and per row."""
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    @property
    def n_patches(self):
        """N = (H/P)(W/P)."""
        return self.grid[0] * self.grid[1]

    @property
    def n_positions(self):
        """Rows of the position table: N, + 1 with [CLS]."""
        return self.n_patches + (1 if self.cls_token else 0)

    @property
    def patch_dim(self):
        """Numbers in one flattened patch: C P P."""
        return self.n_channels * self.patch_size ** 2

    def n_params(self, d_model):
        """The patch map (C P P, D) and its bias, [CLS], the position table."""
        D = d_model
        return ((self.patch_dim + self.patch_bias) * D + (D if self.cls_token else 0)
                + self.n_positions * D)


@dataclass(frozen=True)
class VisionConfig:
    """A Vision Transformer: the patch embedding, one LayerSpec per block, the final norm and
    what the model returns: the final norm's output (B, N', D) (n_labels = 0: an image
    encoder, SigLIP's last_hidden_state), or the logits (B, n_labels) of a linear head on the
    [CLS] vector (ViTForImageClassification; needs patch.cls_token). pool: SigLIP's
    attention-pooling head (a learned probe attends the tokens: the LayerSpec's mixer, then
    z + ffn(norm(z))), whose (B, D) output forward gives on request; None: no such head.
    pre_norm: a norm on the embedding before the blocks (CLIP's pre_layrnorm), or None.
    norm_cls: the final norm reads the [CLS] vector alone and gives the pooled output (CLIP's
    post_layernorm): the encoder's output is then the last block's, un-normed.
    name: the Hugging Face model_type a checkpoint loaded from keeps ("custom" else)."""
    name: str = "custom"
    d_model: int = 768
    patch: PatchSpec = PatchSpec()
    layers: tuple = (VIT_BASE_LAYER,) * 12
    norm: NormSpec = NormSpec("layernorm", 1e-12)
    n_labels: int = 0
    pool: LayerSpec = None
    pre_norm: NormSpec = None
    norm_cls: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str):
            fail(self, f"name must be a string, got {self.name!r}", "name")
        positive_int(self, "d_model")
        instance(self, "patch", PatchSpec)
        instance(self, "norm", NormSpec)
        positive_int(self, "n_labels", low=0)
        instance(self, "pool", LayerSpec, none_ok=True)
        instance(self, "pre_norm", NormSpec, none_ok=True)
        flag(self, "norm_cls")
        if self.norm_cls and (not self.patch.cls_token or self.pool or self.n_labels):
            fail(self, "norm_cls: the final norm pools the [CLS] vector; it needs "
                       "patch.cls_token and excludes pool and n_labels", "norm_cls")
        if not isinstance(self.layers, tuple) or not self.layers or not all(
                isinstance(layer, LayerSpec) for layer in self.layers):
            fail(self, f"layers must be a non-empty tuple of LayerSpec, got {self.layers!r}",
                 "layers")
        named = [(f"layers[{i}]", layer) for i, layer in enumerate(self.layers)]
        for where, layer in named + ([("pool", self.pool)] if self.pool else []):
            mask = getattr(layer.mixer, "mask", None)
            if mask is None or mask.causal or getattr(layer.mixer, "rope", None) is not None:
                fail(self, f"{where}: a vision block attends every patch without rotary "
                           f"positions: an AttentionSpec with rope=None and "
                           f"Mask(causal=False), got {layer.mixer!r}", "layers")
        if self.pool is not None and (self.pool.ffn is None or self.pool.placement != "pre"
                                      or self.pool.mixer.n_kv_heads != self.pool.mixer.n_heads):
            fail(self, f"pool: the attention-pooling head is multi-head attention, then a "
                       f"pre-norm FFN; got {self.pool!r}", "pool")
        if self.n_labels and not self.patch.cls_token:
            fail(self, f"n_labels={self.n_labels}: the classification head reads the [CLS] "
                       f"vector; give patch.cls_token=True", "n_labels")

    @property
    def n_layers(self):
        return len(self.layers)

    def n_params(self):
        """Patch embedding (+ pre-norm) + blocks + final norm (+ the head (D + 1) n_labels)
        (+ the pooling head: its probe and its LayerSpec's attention (with all four biases),
        its one norm and FFN)."""
        D = self.d_model
        n = (self.patch.n_params(D) + sum(layer.n_params(D) for layer in self.layers)
             + self.norm.n_params(D) + (D + 1) * self.n_labels)
        n += 0 if self.pre_norm is None else self.pre_norm.n_params(D)
        if self.pool is None:
            return n
        return n + D + self.pool.n_params(D) - self.pool.norm.n_params(D)  # one norm, not two


RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def _size_pair(spec, name, none_ok):
    v = getattr(spec, name)
    if v is None and none_ok:
        return
    if (not isinstance(v, tuple) or len(v) != 2
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in v)):
        fail(spec, f"{name} must be a tuple (height, width) of positive ints"
                   f"{' or None' if none_ok else ''}, got {v!r}", name)


@dataclass(frozen=True)
class ImageProcessorSpec:
    """How a checkpoint's images become pixel_values (transformers' image processors, PIL
    backend): convert to RGB (compositing transparency onto white), resize to size = (height,
    width), or so that the shorter side is shortest_edge (CLIP; size None), with Pillow's
    `resample` filter (RESAMPLE: 2 bilinear, 3 bicubic, ...), crop the centre crop_size =
    (height, width) (None: no crop), rescale (x * rescale_factor, 1/255: uint8 -> [0, 1]),
    normalise ((x - mean) / std per channel); each step on or off."""
    size: tuple = (224, 224)
    resample: int = 2
    do_convert_rgb: bool = False
    do_resize: bool = True
    do_rescale: bool = True
    rescale_factor: float = 1 / 255
    do_normalize: bool = True
    image_mean: tuple = (0.5, 0.5, 0.5)
    image_std: tuple = (0.5, 0.5, 0.5)
    shortest_edge: int = None
    crop_size: tuple = None

    def __post_init__(self):
        for name in ("do_convert_rgb", "do_resize", "do_rescale", "do_normalize"):
            flag(self, name)
        if self.resample not in RESAMPLE:
            fail(self, f"resample must be one of {RESAMPLE} (Pillow's filters), got "
                       f"{self.resample!r}", "resample")
        _size_pair(self, "size", none_ok=True)
        _size_pair(self, "crop_size", none_ok=True)
        positive_int(self, "shortest_edge", none_ok=True)
        if (self.size is None) == (self.shortest_edge is None):
            fail(self, f"give size (height, width) or shortest_edge, one of them: got "
                       f"size={self.size!r}, shortest_edge={self.shortest_edge!r}", "size")
        for name in ("image_mean", "image_std"):
            v = getattr(self, name)
            if not isinstance(v, tuple) or not v or not all(
                    isinstance(c, (int, float)) and not isinstance(c, bool) for c in v):
                fail(self, f"{name} must be a non-empty tuple of numbers, got {v!r}", name)
        if len(self.image_mean) != len(self.image_std) or 0 in self.image_std:
            fail(self, f"image_mean {self.image_mean} and image_std {self.image_std} need one "
                       f"entry per channel, std nonzero", "image_std")
        if isinstance(self.rescale_factor, bool) or not isinstance(self.rescale_factor,
                                                                   (int, float)):
            fail(self, f"rescale_factor must be a number, got {self.rescale_factor!r}",
                 "rescale_factor")


@dataclass(frozen=True)
class SmartResizeSpec:
    """Qwen2-VL's image preprocessing (transformers' Qwen2VLImageProcessor): `image` says the
    RGB conversion, resample filter, rescale and normalisation (its size is unused); each
    image is resized to the nearest multiple of factor = patch_size * merge_size per side
    with min_pixels <= H*W <= max_pixels, keeping the aspect (smart_resize), then cut into
    patch_size x patch_size patches, each repeated temporal_patch_size times (a still image is
    a video of T equal frames) and flattened to a row of C*T*P*P, the rows in merge_size x
    merge_size groups (the order the patch merger gathers)."""
    image: ImageProcessorSpec = ImageProcessorSpec(
        resample=3, do_convert_rgb=True, image_mean=(0.48145466, 0.4578275, 0.40821073),
        image_std=(0.26862954, 0.26130258, 0.27577711))
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2

    def __post_init__(self):
        instance(self, "image", ImageProcessorSpec)
        for name in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size",
                     "merge_size"):
            positive_int(self, name)
        if self.min_pixels > self.max_pixels:
            fail(self, f"min_pixels={self.min_pixels} exceeds max_pixels={self.max_pixels}",
                 "min_pixels")


@dataclass(frozen=True)
class MergerSpec:
    """Qwen2-VL's patch merger: each merge_size x merge_size group of consecutive patch
    vectors is LayerNormed (eps), concatenated and mapped by a GELU MLP (gelu_approx "none" the
    erf form | "tanh") to the language model's width."""
    merge_size: int = 2
    eps: float = 1e-6
    gelu_approx: str = "none"

    def __post_init__(self):
        positive_int(self, "merge_size")
        real(self, "eps", 0.0, open_low=True)
        one_of(self, "gelu_approx", ("none", "tanh"))
