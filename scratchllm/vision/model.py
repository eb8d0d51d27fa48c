"""The Vision Transformer of a VisionConfig (Dosovitskiy et al. 2020, arXiv 2010.11929): the
embedding of vision/embed.py, the library's one Block per LayerSpec (lm/block.py: pre-norm
LayerNorm, bidirectional attention without RoPE, a GELU MLP with biases), a final norm, and
an optional linear head on the [CLS] vector.

    z_0 = [cls ; patches(x) W + b] + E_pos     (then pre_norm(z_0): CLIP)
    z_l = block_l(z_{l-1})                      l = 1..L
    h = norm(z_L)                               the image encoder's output (B, N', D)
    logits = h[:, 0] W_head + b_head            with n_labels > 0 (B, n_labels)
    pooled = attention_pool(h)                  with cfg.pool, on request (B, D)
    z_k                                         on request: a hidden state before the norm
                                                (what a vision-language model projects)
Hugging Face: ViTForImageClassification (vit) and SigLIP's vision tower (siglip_vision_model:
no [CLS], h is its last_hidden_state). Backward: the same chain in reverse; the head's
gradient reaches only the [CLS] row.

Glossary: B batch, C channels, H, W image size, N' tokens, D model width, L layers.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Linear, Module
from scratchllm.core.validate import expect_float
from scratchllm.lm import Block
from scratchllm.lm.mixers import make_norm
from scratchllm.specs.vision import VisionConfig
from scratchllm.vision.embed import VisionEmbedding
from scratchllm.vision.pool import AttentionPool


class VisionCache(NamedTuple):
    embed: tuple
    pre_norm: tuple  # cfg.pre_norm's cache, else None
    blocks: list
    norm: tuple      # the final norm's (None for a hidden layer, or with norm_cls unpooled)
    head: tuple      # the classifier's or the pooling head's cache; None for h itself
    hidden_shape: tuple
    pooled: bool     # the output is the pooling head's (or the [CLS] norm's: norm_cls)


class VisionTransformer(Module):
    """The model of a VisionConfig; Params in float32 (default) or float64."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, VisionConfig):
            raise TypeError(f"VisionTransformer: cfg must be a VisionConfig "
                            f"(scratchllm.specs.vision), got {type(cfg).__name__}")
        self.cfg = cfg
        D = cfg.d_model
        self.embed = VisionEmbedding(D, cfg.patch, rng=rng, dtype=dtype)
        self.layers = [Block(D, spec, rng=rng, dtype=dtype) for spec in cfg.layers]
        self.pre_norm = None if cfg.pre_norm is None else make_norm(D, cfg.pre_norm, dtype)
        self.norm = make_norm(D, cfg.norm, dtype)
        self.head = Linear(D, cfg.n_labels, bias=True, rng=rng, dtype=dtype) \
            if cfg.n_labels else None
        self.pool = None if cfg.pool is None else AttentionPool(D, cfg.pool, rng=rng,
                                                                dtype=dtype)

    @property
    def dtype(self):
        return self.embed.W.data.dtype

    def named_buffers(self):
        """Non-trainable saved state: none (the hub asks every model)."""
        return []

    def forward(self, pixel_values, *, pooled=False, hidden_layer=None):
        """pixel_values (B, C, H, W) -> (out, VisionCache): out the logits (B, n_labels) with
        a head, else the final norm's output (B, N', D) (last_hidden_state; with
        cfg.norm_cls the last block's, un-normed); pooled=True: the pooling head's output
        (B, D) (SigLIP's pooler_output), or with cfg.norm_cls the norm of the [CLS] vector
        (CLIP's); hidden_layer=k: z_k, the
        output of the first k blocks (B, N', D) before any norm, k counted as Python indexes
        transformers' hidden_states (0 the embeddings, -1 the last block, -2 the one before:
        a vision-language model's vision_feature_layer)."""
        cls_norm = self.cfg.norm_cls
        if pooled and self.pool is None and not cls_norm:
            raise ValueError("VisionTransformer.forward: pooled=True needs the pooling head "
                             "(cfg.pool) or the [CLS] norm (cfg.norm_cls)")
        L = len(self.layers)
        if hidden_layer is not None and (pooled or not -L - 1 <= hidden_layer <= L):
            raise ValueError(f"VisionTransformer.forward: hidden_layer={hidden_layer!r} must "
                             f"index the {L + 1} hidden states (-{L + 1}..{L}), without pooled")
        expect_float("VisionTransformer", "pixel_values", pixel_values, 4)
        x, c_emb = self.embed.forward(pixel_values.astype(self.dtype, copy=False))  # (B, N', D)
        c_pre = None
        if self.pre_norm is not None:
            x, c_pre = self.pre_norm.forward(x)  # (B, N', D)
        blocks = []
        run = self.layers if hidden_layer is None else self.layers[:hidden_layer % (L + 1)]
        for layer in run:
            x, c = layer.forward(x)  # (B, N', D)
            blocks.append(c)
        if hidden_layer is not None or (cls_norm and not pooled):
            return x, VisionCache(c_emb, c_pre, blocks, None, None, x.shape, False)
        if cls_norm:  # CLIP's pooler_output: the norm of the [CLS] vector
            out, c_norm = self.norm.forward(x[:, 0])  # (B, D)
            return out, VisionCache(c_emb, c_pre, blocks, c_norm, None, x.shape, True)
        h, c_norm = self.norm.forward(x)  # (B, N', D)
        if pooled:
            out, c_pool = self.pool.forward(h)  # (B, D)
            return out, VisionCache(c_emb, c_pre, blocks, c_norm, c_pool, h.shape, True)
        if self.head is None:
            return h, VisionCache(c_emb, c_pre, blocks, c_norm, None, h.shape, False)
        logits, c_head = self.head.forward(h[:, 0])  # (B, n_labels)
        return logits, VisionCache(c_emb, c_pre, blocks, c_norm, c_head, h.shape, False)

    def backward(self, dout, cache):
        """dout like forward's out -> Param grads (+=); returns d pixel_values (B, C, H, W)."""
        c_emb, c_pre, blocks, c_norm, c_head, shape, pooled = cache
        if pooled and c_head is None:  # fwd: out = norm(z_L[:, 0]) (norm_cls)
            dx = np.zeros(shape, self.dtype)  # (B, N', D)
            dx[:, 0] = self.norm.backward(dout, c_norm)
        else:
            if pooled:
                dh = self.pool.backward(dout, c_head)  # fwd: out = attention_pool(h)
            elif c_head is None:
                dh = dout  # (B, N', D)
            else:
                dh = np.zeros(shape, self.dtype)  # (B, N', D)
                dh[:, 0] = self.head.backward(dout, c_head)  # fwd: logits = h[:, 0] W + b
            dx = dh if c_norm is None else self.norm.backward(dh, c_norm)  # fwd: h = norm(z_L)
        for layer, c in zip(reversed(self.layers[:len(blocks)]), reversed(blocks)):
            dx = layer.backward(dx, c)  # fwd: z_l = block_l(z_{l-1})
        if c_pre is not None:
            dx = self.pre_norm.backward(dx, c_pre)  # fwd: z_0 = pre_norm(embedding)
        return self.embed.backward(dx, c_emb)  # fwd: z_0 = [cls ; patches W + b] + pos
