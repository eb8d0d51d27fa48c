"""The output head's transform (HeadSpec.transform): BERT's MLM head (Devlin et al. 2018,
arXiv 1810.04805), which maps the last hidden state once more before the tied projection:

    t = norm(gelu(h W_t + b_t))        W_t (D, D), b_t (D,), norm the trunk's NormSpec
Backward: dh = (d norm -> d gelu -> d linear)(dt), each by its own pair.

Reference: huggingface/transformers src/transformers/models/bert/modeling_bert.py
(BertPredictionHeadTransform: dense, transform_act_fn, LayerNorm).
Glossary: D model width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import gelu
from scratchllm.core.nn import Linear, Module
from scratchllm.lm.mixers import make_norm


class TransformCache(NamedTuple):
    dense: tuple
    act: tuple
    norm: tuple


class HeadTransform(Module):
    """t = norm(gelu(h W_t + b_t)) (Params: dense.W, dense.b, norm.g [, norm.b])."""

    def __init__(self, d_model, head, norm, *, rng, dtype=np.float32):
        self.dense = Linear(d_model, d_model, bias=True, rng=rng, dtype=dtype)
        self.norm = make_norm(d_model, norm, dtype)
        self.approximate = head.gelu_approx

    def forward(self, h):
        """h (..., D) -> (t (..., D), TransformCache)."""
        a, c_dense = self.dense.forward(h)  # (..., D)
        g, c_act = gelu.gelu_forward(a, self.approximate)  # (..., D)
        t, c_norm = self.norm.forward(g)  # (..., D)
        return t, TransformCache(c_dense, c_act, c_norm)

    def backward(self, dt, cache):
        """dt (..., D) -> dh (..., D); Param grads accumulate."""
        dg = self.norm.backward(dt, cache.norm)  # fwd: t = norm(g)
        da = gelu.gelu_backward(dg, cache.act)["x"]  # fwd: g = gelu(a)
        return self.dense.backward(da, cache.dense)  # fwd: a = h W_t + b_t
