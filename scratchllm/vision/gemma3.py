"""The multimodal Gemma 3 (Gemma Team 2025, arXiv 2503.19786, section 2.1): a SigLIP tower's
patch vectors, average-pooled to a fixed number of tokens per image, RMS-normed and projected,
take the places of the image tokens in a Gemma 3 LM's input; each image's tokens attend each
other both ways.

    h = tower(pixel_values)                   (Bi, p*p, Dv) SigLIP's last_hidden_state
    q = avgpool_k(h as a p x p grid)          (Bi, t*t, Dv) k = p / t, row-major tokens
    f = rmsnorm(q; offset + g) W              (Bi, t*t, Dt) pool_project (the pair below)
    x_0 = E[ids] sqrt(Dt);  x_0[image] = f    (image ids outside the vocabulary embed as 0)
    mask_l = own_l OR (same image run AND key after query)   own_l: causal (and window)
    logits = lm.trunk(x_0) under mask_l       (B, T, V)
The "same image run" is a maximal run of consecutive image tokens (transformers'
token_type_ids blocks); decoding after the prompt is causal as usual.
Backward: the LM's blocks and head in reverse, the image rows of dx_0 through the projector
(pooling spreads each token's gradient evenly over its k x k patches) and the tower.
Reference: huggingface/transformers src/transformers/models/gemma3/modeling_gemma3.py
(Gemma3MultiModalProjector, get_block_sequence_ids_for_mask, create_masks_for_vision_model).

Glossary: Bi images, p patches per side, t tokens per side, k pooling size, Dv the tower's
width, Dt the LM's, B sequences, T tokens, V vocabulary.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import mask_array
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, rmsnorm_backward, rmsnorm_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_int,
                                      expect_linear, expect_ndim, expect_shape)
from scratchllm.lm import LM
from scratchllm.lm.model import LMCache
from scratchllm.specs import Mask
from scratchllm.specs.vision_lm import Gemma3VLConfig, PoolProjectorSpec
from scratchllm.vision.model import VisionTransformer
from scratchllm.vision.preprocess import preprocess
from scratchllm.vision.vlm import ImageTokensLM


class PoolProjectorWeights(NamedTuple):
    """g (Dv,) the RMSNorm's gain (used as offset + g); W (Dv, Dt)."""
    g: np.ndarray
    W: np.ndarray


class PoolProjectorCache(NamedTuple):
    norm: tuple
    proj: tuple
    shape: tuple  # x's (Bi, p*p, Dv)
    k: int


def pool_project_forward(x, w, *, spec):
    """Inputs:  x (Bi, p*p, Dv) float, patch vectors row-major over a p x p grid; w
             PoolProjectorWeights; spec a PoolProjectorSpec (t*t = tokens_per_image, t | p).
    Returns: f (Bi, t*t, Dt).  Cache: PoolProjectorCache."""
    if not isinstance(spec, PoolProjectorSpec):
        raise TypeError(f"pool_project: spec must be a PoolProjectorSpec, got "
                        f"{type(spec).__name__}")
    expect_ndim("pool_project", "x", x, 3, "(Bi, p*p, Dv)")
    expect_float("pool_project", "x", x)
    Bi, N, Dv = x.shape
    p, t = round(N ** 0.5), round(spec.tokens_per_image ** 0.5)
    if p * p != N or p % t:
        raise ValueError(f"pool_project: x has {N} patches; expected a square grid whose side "
                         f"is a multiple of {t} (tokens_per_image {spec.tokens_per_image})")
    if not isinstance(w, PoolProjectorWeights):
        raise TypeError(f"pool_project: w must be PoolProjectorWeights, got {type(w).__name__}")
    expect_float("pool_project", "w.g", w.g)
    expect_float("pool_project", "w.W", w.W)
    expect_shape("pool_project", "w.g", w.g, (Dv,), "(Dv,) with Dv = x.shape[2]")
    expect_linear("pool_project", Dv, w.W, names=("w.W", None))
    x, w = common_float(x, w)
    k = p // t
    q = x.reshape(Bi, t, k, t, k, Dv).mean(axis=(2, 4)).reshape(Bi, t * t, Dv)  # avgpool_k
    h, c_norm = rmsnorm_forward(q, spec.offset + w.g, spec.eps)  # (Bi, t*t, Dv)
    f, c_proj = linear_forward(h, w.W)  # (Bi, t*t, Dt)
    return f, PoolProjectorCache(c_norm, c_proj, x.shape, k)


def pool_project_backward(df, cache):
    """Math: dW, dh from the matmul; dq, dg from the RMSNorm (dg is d(offset + g)); each
    pooled token's dq / k^2 to each of its k x k patches.
    Returns {"x": dx (Bi, p*p, Dv), "w": PoolProjectorWeights(dg, dW)}."""
    norm, proj, (Bi, N, Dv), k = cache
    expect_dout("pool_project_backward", df, proj[0].shape[:-1] + (proj[1].shape[1],),
                proj[0].dtype, name="df")
    g_proj = linear_backward(df, proj)  # fwd: f = h W
    g_norm = rmsnorm_backward(g_proj["x"], norm)  # fwd: h = rmsnorm(q; offset + g)
    t = round(N ** 0.5) // k
    dq = g_norm["x"].reshape(Bi, t, 1, t, 1, Dv) / (k * k)  # fwd: q = mean over k x k
    dx = np.broadcast_to(dq, (Bi, t, k, t, k, Dv)).reshape(Bi, N, Dv)
    return {"x": dx, "w": PoolProjectorWeights(g_norm["g"], g_proj["W"])}


class PoolProjector(Module):
    """The Params of pool_project: g from 0 (gain offset + g = 1), W ~ N(0, 1/Dv)."""

    def __init__(self, d_in, d_out, spec, *, rng, dtype=np.float32):
        self.g = Param(np.zeros(d_in, dtype))
        self.W = Param(normal_init(rng, (d_in, d_out), d_in ** -0.5, dtype))
        self.spec = spec

    def forward(self, x):
        return pool_project_forward(x, PoolProjectorWeights(self.g.data, self.W.data),
                                    spec=self.spec)

    def backward(self, df, cache):
        g = pool_project_backward(df, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))


def image_runs(image):
    """image (B, T) bool -> (B, T) ints: the index of each maximal run of image tokens in its
    row (-1 for text tokens)."""
    start = image & ~np.pad(image, ((0, 0), (1, 0)))[:, :-1]  # (B, T) first token of a run
    return np.where(image, np.cumsum(start, axis=1) - 1, -1)


def bidirectional_masks(layers, image):
    """One Mask(array=(B, 1, T, T)) per attention layer: its own mask, OR a key after the
    query in the query's own image run (every image token sees its whole image)."""
    runs = image_runs(image)  # (B, T)
    T = image.shape[1]
    later = np.triu(np.ones((T, T), bool), 1)  # (T, T) key j > query i
    same = (runs[:, :, None] == runs[:, None, :]) & (runs[:, :, None] >= 0) & later  # (B,T,T)
    return [Mask(array=(mask_array(layer.mixer.spec.mask, T, T) | same)[:, None])
            for layer in layers]


class Gemma3VLCache(NamedTuple):
    tower: tuple
    proj: tuple
    embed: tuple
    image: np.ndarray  # (B, T) bool
    lm: tuple


class Gemma3VL(ImageTokensLM):
    """The model of a Gemma3VLConfig (Params: tower, proj, lm). Gemma3Processor writes
    "\n\n" before and after each image's <start_of_image> ... <end_of_image>."""
    IMAGE_AROUND = ("\n\n", "\n\n")

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, Gemma3VLConfig):
            raise TypeError(f"Gemma3VL: cfg must be a Gemma3VLConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tower = VisionTransformer(cfg.vision, rng=rng, dtype=dtype)
        self.proj = PoolProjector(cfg.vision.d_model, cfg.text.d_model, cfg.projector, rng=rng,
                                  dtype=dtype)
        self.lm = LM(cfg.text, rng=rng, dtype=dtype)

    def _inputs(self, input_ids, pixel_values):
        """(x_0 (B, T, Dt), embedding cache, image places (B, T), tower and projector caches
        or None, per-layer masks or None without image tokens)."""
        expect_int("Gemma3VL", "input_ids", input_ids)
        expect_ndim("Gemma3VL", "input_ids", input_ids, 2, "(B, T)")
        image = input_ids == self.cfg.image_token_id  # (B, T)
        x, c_emb = self.lm._embed_forward(np.where(image, 0, input_ids))  # (B, T, Dt)
        c_tower = c_proj = None
        if pixel_values is not None:
            h, c_tower = self.tower.forward(pixel_values)  # (Bi, p*p, Dv)
            f, c_proj = self.proj.forward(h)  # (Bi, t*t, Dt)
            x = self.place_features(x, image, f)  # (B, T, Dt)
        elif image.any():
            raise ValueError("Gemma3VL: input_ids hold image tokens but no pixel_values")
        masks = bidirectional_masks(self.lm.layers, image) if image.any() else None
        return x, c_emb, image, (c_tower, c_proj), masks

    def forward(self, input_ids, pixel_values=None, *, token_type_ids=None, attention_mask=None):
        """input_ids (B, T) ints [, pixel_values (Bi, C, H, W)] -> (logits (B, T, V),
        Gemma3VLCache). token_type_ids (1 at the image tokens) and attention_mask (all ones),
        which transformers' processor also gives, are checked and add nothing."""
        self.check_extras(input_ids, attention_mask, token_type_ids, "token_type_ids")
        x, c_emb, image, (c_tower, c_proj), masks = self._inputs(input_ids, pixel_values)
        blocks = []
        for i, layer in enumerate(self.lm.layers):
            mask = None if masks is None else masks[i]
            x, c = layer.body(x, lambda a, layer=layer, mask=mask: layer.mixer.forward(
                a, None, mask))  # (B, T, Dt)
            blocks.append(c)
        logits, (cn, ch, c_cap) = self.lm.head_forward(x)  # (B, T, V)
        c_lm = LMCache(None, blocks, cn, ch, [() for _ in blocks], c_cap, x)
        return logits, Gemma3VLCache(c_tower, c_proj, c_emb, image, c_lm)

    def backward(self, dlogits, cache, encoder=True):
        """dlogits (B, T, V) -> Param grads (+=); returns d pixel_values (None without an
        image, or with encoder=False: the tower gets no gradient, its backward not run)."""
        dx = self.lm.trunk_backward(dlogits, cache.lm)  # fwd: logits = trunk(x_0)
        dpixels = None
        if cache.tower is not None:
            df, dx = self.split_grad(dx, cache.image)  # fwd: x_0[image] = f
            Bi, n = cache.proj.shape[0], self.cfg.projector.tokens_per_image
            dh = self.proj.backward(df.reshape(Bi, n, -1), cache.proj)  # fwd: f = proj(h)
            dpixels = self.tower.backward(dh, cache.tower) if encoder else None  # h = tower(.)
        self.lm.embed_backward(dx, cache.embed)  # fwd: x_0 = E[ids] sqrt(Dt)
        return dpixels

    def image_inputs(self, images, spec):
        """images (paths or PIL images) and the checkpoint's ImageProcessorSpec -> (prefill's
        and forward's keywords {"pixel_values": (Bi, C, H, W)}, image tokens per image)."""
        pixel_values = preprocess(images, spec)  # (Bi, C, H, W)
        return {"pixel_values": pixel_values}, [self.cfg.projector.tokens_per_image] * len(
            pixel_values)

    # ------------------------------------------------------------------ decoding
    def init_state(self, batch, max_len):
        """The LM's decoding state."""
        return self.lm.init_state(batch, max_len)

    def prefill(self, input_ids, state, pixel_values=None):
        """The prompt (with its images, their tokens attending each other both ways) into the
        fresh state: logits (B, T, V); decoding continues with decode(ids_t, state, T)."""
        x, _, _, _, masks = self._inputs(input_ids, pixel_values)  # (B, T, Dt)
        for i, (layer, st) in enumerate(zip(self.lm.layers, state)):
            mask = None if masks is None else masks[i]
            x = layer.body(x, lambda a, layer=layer, st=st, mask=mask: (
                layer.mixer.prefill(a, st, mask=mask), None))[0]  # (B, T, Dt)
        return self.lm.head_forward(x)[0]  # (B, T, V)

    def decode(self, ids_t, state, position):
        """One text token per sequence (B,) at `position` -> logits (B, V)."""
        return self.lm.decode(ids_t, state, position)
