"""The output head's pieces beyond a plain projection:

The transform (HeadSpec.transform): BERT's MLM head (Devlin et al. 2018, arXiv 1810.04805),
which maps the last hidden state once more before the tied projection:
    t = norm(gelu(h W_t + b_t))        W_t (D, D), b_t (D,), norm the trunk's NormSpec
Backward: dh = (d norm -> d gelu -> d linear)(dt), each by its own pair.
Reference: huggingface/transformers src/transformers/models/bert/modeling_bert.py
(BertPredictionHeadTransform: dense, transform_act_fn, LayerNorm).

The tied projection's backward (backprop_tied_head): logits = h E^T with E (V, D) the
embedding table, so
    dh = dlogits E,        dE += dlogits^T h     (V, D): the embedding's own layout
The generic linear backward forms dW = h^T dlogits (D, V) and adds its transpose into
E.grad: a strided pass over V*D numbers (28M at a 49,152-word vocabulary), about as long as
the GEMM itself. Formed as dlogits^T h in E's layout, one gemm with beta = 1 adds it
straight into E.grad (core.gemm.matmul_add): no (V, D) temporary, no pass after.

Glossary: N rows (B*T), D model width, V vocabulary.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import gelu
from scratchllm.core.nn import Linear, Module
from scratchllm.core.gemm import matmul_add
from scratchllm.core.ops import LinearCache, linear_out
from scratchllm.core.validate import expect_dout
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


def backprop_tied_head(dlogits, cache, embed):
    """The backward of the tied head logits = h @ E^T (embed.attend) into the embedding's
    Param E: E.grad += dlogits^T h, formed in E's own (V, D) layout; returns dh.

    Inputs:  dlogits (..., V); cache the head's LinearCache (h (..., D), W = E.data^T);
             embed the Embedding Module (E.data, E.grad (V, D)).
    Returns: dh (..., D) = dlogits E.
    Math:    fwd logits = h E^T -> dh = dlogits E, dE = dlogits^T h (= (h^T dlogits)^T).
    A cache of another kind (FP8) takes embed.attend_backward (the linear pair, its dW
    added transposed: tests/lm/test_heads.py checks the two agree).
    """
    if not isinstance(cache, LinearCache):
        return embed.attend_backward(dlogits, cache)
    expect_dout("backprop_tied_head", dlogits, *linear_out(cache), name="dlogits")
    h, W, _ = cache
    D, V = W.shape
    h2, dl = h.reshape(-1, D), dlogits.reshape(-1, V)  # (N, D), (N, V)
    matmul_add(embed.E.grad, dl.T, h2)  # (V, D)   fwd: logits = h E^T -> dE += dlogits^T h
    return (dl @ W.T).reshape(h.shape)  # (..., D)   dh = dlogits E
