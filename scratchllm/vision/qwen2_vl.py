"""Qwen2-VL (Wang et al. 2024, arXiv 2409.12191): the vision tower's merged tokens take the
places of the image tokens in the input of a decoder LM whose RoPE is M-RoPE.

    p = tower(pixel_values, image_grid_thw)        (Ni, Dt)   qwen2_tower.py
    x_0 = E[input_ids];  x_0[input_ids == image_token_id] = p   (in order: image by image)
    positions, deltas = mrope_positions(input_ids, image_grid_thw)   (3, B, T), (B, 1)
    logits = lm.trunk(x_0) at those positions      (B, T, V)  (Packing without documents)
Decoding: prefill runs the prompt (image tokens in place) through the LM's decoding state at
its M-RoPE positions and keeps each row's delta; the token at slot s (s >= T) then turns at
s + delta in all three rows (transformers' rope_deltas), while its key and value go to slot s.
Backward: the LM's trunk backward gives dx_0; its image rows go back through the tower, the
text rows into E.

Glossary: B sequences, T tokens, Ni merged image tokens, Dt the LM's width, V vocabulary.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import make_rope
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm import LM
from scratchllm.lm.block import Packing
from scratchllm.specs.vision_lm import Qwen2VLConfig
from scratchllm.vision.dynamic import preprocess_patches
from scratchllm.vision.mrope import mrope_positions
from scratchllm.vision.qwen2_tower import Qwen2VisionTower
from scratchllm.vision.vlm import ImageTokensLM


class Qwen2VLCache(NamedTuple):
    tower: tuple
    embed: tuple
    image: np.ndarray  # (B, T) bool: the image tokens' places
    lm: tuple


class Qwen2VLState:
    """The LM's per-layer decoding states (layers) and each row's M-RoPE offset (deltas
    (B, 1) int64, set by prefill)."""

    def __init__(self, layers, batch):
        self.layers, self.batch = layers, batch
        self.deltas = np.zeros((batch, 1), np.int64)


class Qwen2VL(ImageTokensLM):
    """The model of a Qwen2VLConfig (Params: tower, lm; the projector is the tower's
    merger)."""
    PROJECTOR = ("tower.merger.",)

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, Qwen2VLConfig):
            raise TypeError(f"Qwen2VL: cfg must be a Qwen2VLConfig, got {type(cfg).__name__}")
        self.cfg = cfg
        self.tower = Qwen2VisionTower(cfg, rng=rng, dtype=dtype)
        self.lm = LM(cfg.text, rng=rng, dtype=dtype)

    def _inputs(self, input_ids, pixel_values, image_grid_thw):
        """(x_0 (B, T, Dt) with the image tokens in place, embedding cache, image places
        (B, T), tower cache or None, positions (3, B, T), deltas (B, 1))."""
        fn = "Qwen2VL"
        expect_int(fn, "input_ids", input_ids)
        expect_ndim(fn, "input_ids", input_ids, 2, "(B, T)")
        if (pixel_values is None) != (image_grid_thw is None):
            given = "pixel_values" if image_grid_thw is None else "image_grid_thw"
            raise ValueError(f"{fn}: pixel_values and image_grid_thw go together (got only "
                             f"{given})")
        image = input_ids == self.cfg.image_token_id  # (B, T)
        if pixel_values is None and image.any():
            raise ValueError(f"{fn}: input_ids hold image tokens ({self.cfg.image_token_id}) "
                             f"but no pixel_values")
        positions, deltas = mrope_positions(input_ids, image_grid_thw, self.cfg.image_token_id,
                                            self.cfg.merger.merge_size)  # (3, B, T), (B, 1)
        x, c_emb = self.lm.embed.forward(input_ids)  # (B, T, Dt)
        c_tower = None
        if pixel_values is not None:
            p, c_tower = self.tower.forward(pixel_values, image_grid_thw)  # (Ni, Dt)
            x = self.place_features(x, image, p)  # (B, T, Dt); mrope_positions checked the count
        return x, c_emb, image, c_tower, positions, deltas

    def forward(self, input_ids, pixel_values=None, image_grid_thw=None, *,
                attention_mask=None, mm_token_type_ids=None):
        """input_ids (B, T) ints [, pixel_values (N, C*T*P*P) and image_grid_thw (n_images, 3)
        (preprocess_patches')] -> (logits (B, T, V), Qwen2VLCache). The image tokens
        (image_token_id) must number sum(t h w) / m^2. attention_mask (all ones: no padding)
        and mm_token_type_ids (1 at the image tokens), which transformers' processor also
        gives, are checked and add nothing."""
        self.check_extras(input_ids, attention_mask, mm_token_type_ids)
        x, c_emb, image, c_tower, positions, _ = self._inputs(input_ids, pixel_values,
                                                              image_grid_thw)
        logits, c_lm = self.lm.trunk_forward(x, Packing(None, positions))  # (B, T, V)
        return logits, Qwen2VLCache(c_tower, c_emb, image, c_lm)

    def backward(self, dlogits, cache, encoder=True):
        """dlogits (B, T, V) -> Param grads (+=); returns d pixel_values (None without an
        image, or with encoder=False: the tower's blocks and patch embedding get no
        gradient and are not run backward; the merger, the projector, still is)."""
        dx = self.lm.trunk_backward(dlogits, cache.lm)  # fwd: logits = trunk(x_0)  (B, T, Dt)
        dpixels = None
        if cache.tower is not None:
            dp, dx = self.split_grad(dx, cache.image)  # fwd: x_0[image] = p   (Ni, Dt)
            dpixels = self.tower.backward(dp, cache.tower, blocks=encoder)
        self.lm.embed.backward(dx, cache.embed)  # fwd: x_0 = E[input_ids]
        return dpixels

    def image_inputs(self, images, spec):
        """images (paths or PIL images of any sizes) and the checkpoint's SmartResizeSpec ->
        (prefill's and forward's keywords {"pixel_values": (N, C*T*P*P), "image_grid_thw":
        (n_images, 3)}, image tokens per image: t h w / m^2)."""
        pixel_values, grid = preprocess_patches(images, spec)
        n = (grid.prod(axis=1) // self.cfg.merger.merge_size ** 2).tolist()
        return {"pixel_values": pixel_values, "image_grid_thw": grid}, n

    # ------------------------------------------------------------------ decoding
    def init_state(self, batch, max_len):
        """The LM's decoding state with each row's M-RoPE offset (0 until prefill)."""
        return Qwen2VLState(self.lm.init_state(batch, max_len), batch)

    def prefill(self, input_ids, state, pixel_values=None, image_grid_thw=None):
        """The prompt (with its images) at its M-RoPE positions into the fresh state: logits
        (B, T, V); decoding continues with decode(ids_t, state, T)."""
        if input_ids.shape[0] != state.batch:
            raise ValueError(f"Qwen2VL.prefill: input_ids has {input_ids.shape[0]} rows, the "
                             f"state was made for {state.batch} (init_state)")
        x, _, _, _, positions, deltas = self._inputs(input_ids, pixel_values, image_grid_thw)
        state.deltas[...] = deltas
        for layer, st in zip(self.lm.layers, state.layers):
            def mix(a, layer=layer, st=st):
                return layer.mixer.prefill(a, st, positions), None
            x = layer.body(x, mix)[0]  # (B, T, Dt)
        return self.lm.head_forward(x)[0]  # (B, T, V)

    def decode(self, ids_t, state, position):
        """One text token per sequence, ids_t (B,), into slot `position` (an int: the tokens
        the state holds), turned at position + each row's delta -> logits (B, V)."""
        expect_int("Qwen2VL.decode", "ids_t", ids_t)
        expect_ndim("Qwen2VL.decode", "ids_t", ids_t, 1, "(B,)")
        if np.ndim(position) or not isinstance(state, Qwen2VLState):
            raise ValueError(f"Qwen2VL.decode: give one int position (the tokens every row "
                             f"holds) and the state of init_state, got position {position!r}, "
                             f"state {type(state).__name__}")
        x = self.lm.embed.forward(ids_t[:, None])[0][:, 0]  # (B, Dt)
        turn = np.broadcast_to((position + state.deltas)[None], (3, state.batch, 1))
        for layer, st in zip(self.lm.layers, state.layers):
            spec = layer.mixer.spec
            rope = make_rope(spec.rope, layer.mixer.head_dim, turn)  # (3, B, 1) positions

            def mix(a, layer=layer, st=st, rope=rope):
                return layer.mixer.decode(a, st, position, rope=rope), None
            x = layer.body(x, mix)[0]  # (B, Dt)
        return self.lm.head_forward(x[:, None])[0][:, 0]  # (B, V)
