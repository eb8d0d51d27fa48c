"""LLaVA (Liu et al. 2023, arXiv 2304.08485; the GELU-MLP projector of LLaVA-1.5, Liu et al.
2023, arXiv 2310.03744): an image encoder's features, projected to the LM's width, take the
places of the image tokens in the LM's input.

    f = vision(pixel_values, hidden_layer=feature_layer)      (Bi, N', Dv)  [1:] if "default"
    p = gelu(f W1 + b1) W2 + b2                                (Bi, N, Dt)   the projector
    x_0 = E[input_ids];  x_0[input_ids == image_token_id] = p  (in order: image by image)
    logits = lm.trunk(x_0)                                     (B, T, V)
Decoding: prefill runs the prompt (image features in place) through the LM's decoding state;
decode then feeds one token at a time as the LM does.
Backward: the LM's trunk backward gives dx_0; its image rows go back through the projector
and the vision encoder, the text rows into E.

Glossary: B sequences, T tokens, Bi images, N' vision tokens, N image features per image,
Dv, Dt the vision and LM widths, V vocabulary.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.gelu import gelu_backward, gelu_forward
from scratchllm.core.nn import Linear
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm import LM
from scratchllm.specs.vision_lm import LlavaConfig
from scratchllm.vision.model import VisionTransformer
from scratchllm.vision.preprocess import preprocess
from scratchllm.vision.vlm import ImageTokensLM


class LlavaCache(NamedTuple):
    vision: tuple
    proj1: tuple
    act: tuple
    proj2: tuple
    embed: tuple
    image: np.ndarray   # (B, T) bool: the image tokens' places
    lm: tuple
    feature_shape: tuple  # the vision encoder's output shape (Bi, N', Dv)


class Llava(ImageTokensLM):
    """The model of a LlavaConfig (Params: tower, proj1, proj2, lm)."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, LlavaConfig):
            raise TypeError(f"Llava: cfg must be a LlavaConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        Dv, Dt = cfg.vision.d_model, cfg.text.d_model
        self.tower = VisionTransformer(cfg.vision, rng=rng, dtype=dtype)
        self.proj1 = Linear(Dv, Dt, bias=cfg.projector_bias, rng=rng, dtype=dtype)
        self.proj2 = Linear(Dt, Dt, bias=cfg.projector_bias, rng=rng, dtype=dtype)
        self.lm = LM(cfg.text, rng=rng, dtype=dtype)

    def image_features(self, pixel_values):
        """pixel_values (Bi, C, H, W) -> (projected features (Bi, N, Dt), caches)."""
        f, c_vis = self.tower.forward(pixel_values, hidden_layer=self.cfg.feature_layer)
        shape = f.shape  # (Bi, N', Dv)
        f = f[:, 1:] if self.cfg.select == "default" else f  # (Bi, N, Dv)
        a, c1 = self.proj1.forward(f)  # (Bi, N, Dt)
        g, c_act = gelu_forward(a, self.cfg.gelu_approx)  # (Bi, N, Dt)
        p, c2 = self.proj2.forward(g)  # (Bi, N, Dt)
        return p, (c_vis, c1, c_act, c2, shape)

    def _inputs(self, input_ids, pixel_values):
        """x_0 (B, T, Dt) with the image features in place, and what backward needs:
        (x_0, embedding cache, image places (B, T), feature caches)."""
        expect_int("Llava", "input_ids", input_ids)
        expect_ndim("Llava", "input_ids", input_ids, 2, "(B, T)")
        x, c_emb = self.lm.embed.forward(input_ids)  # (B, T, Dt)
        image = input_ids == self.cfg.image_token_id  # (B, T)
        parts = (None,) * 5
        if pixel_values is not None:
            p, parts = self.image_features(pixel_values)  # (Bi, N, Dt)
            x = self.place_features(x, image, p)  # (B, T, Dt)
        elif image.any():
            raise ValueError("Llava: input_ids hold image tokens but no pixel_values")
        return x, c_emb, image, parts

    def forward(self, input_ids, pixel_values=None, *, attention_mask=None):
        """input_ids (B, T) ints [, pixel_values (Bi, C, H, W)] -> (logits (B, T, V),
        LlavaCache). The image tokens (image_token_id) must number Bi * N. attention_mask
        (all ones), which transformers' processor also gives, is checked and adds nothing."""
        self.check_extras(input_ids, attention_mask)
        x, c_emb, image, parts = self._inputs(input_ids, pixel_values)  # (B, T, Dt)
        logits, c_lm = self.lm.trunk_forward(x)  # (B, T, V)
        c_vis, c1, c_act, c2, shape = parts
        return logits, LlavaCache(c_vis, c1, c_act, c2, c_emb, image, c_lm, shape)

    def image_inputs(self, images, spec):
        """images (paths or PIL images) and the checkpoint's ImageProcessorSpec -> (prefill's
        and forward's keywords {"pixel_values": (Bi, C, H, W)}, image tokens per image)."""
        pixel_values = preprocess(images, spec)  # (Bi, C, H, W)
        n = self.cfg.vision.patch.n_positions - (self.cfg.select == "default")
        return {"pixel_values": pixel_values}, [n] * len(pixel_values)

    def init_state(self, batch, max_len):
        """The LM's decoding state."""
        return self.lm.init_state(batch, max_len)

    def prefill(self, input_ids, state, pixel_values=None):
        """The prompt (with its image) at positions 0..T-1 into the fresh state: logits
        (B, T, V); decoding continues with decode(ids_t, state, T)."""
        x, _, _, _ = self._inputs(input_ids, pixel_values)  # (B, T, Dt)
        return self.lm.trunk_prefill(x, state)

    def decode(self, ids_t, state, position):
        """One text token per sequence (B,) at `position` -> logits (B, V)."""
        return self.lm.decode(ids_t, state, position)

    def backward(self, dlogits, cache, encoder=True):
        """dlogits (B, T, V) -> Param grads (+=); returns d pixel_values (None without an
        image, or with encoder=False: the image encoder below the projector gets no
        gradient, as in LLaVA's stage 1, and its backward is not run)."""
        dx = self.lm.trunk_backward(dlogits, cache.lm)  # fwd: logits = trunk(x_0)
        dpixels = None
        if cache.vision is not None:
            dp, dx = self.split_grad(dx, cache.image)  # fwd: x_0[image] = p   (Bi*N, Dt)
            Bi, n_tokens, _ = cache.feature_shape
            N = n_tokens - (1 if self.cfg.select == "default" else 0)
            dg = self.proj2.backward(dp.reshape(Bi, N, -1), cache.proj2)  # fwd: p = g W2 + b2
            da = gelu_backward(dg, cache.act)["x"]  # fwd: g = gelu(a)
            df = self.proj1.backward(da, cache.proj1)  # fwd: a = f W1 + b1
            if self.cfg.select == "default":  # fwd: f = f[:, 1:]
                df = np.concatenate([np.zeros_like(df[:, :1]), df], axis=1)
            dpixels = self.tower.backward(df, cache.vision) if encoder else None
        self.lm.embed.backward(dx, cache.embed)  # fwd: x_0 = E[input_ids]
        return dpixels
