"""Param, Module, and thin Modules that own parameters and call the functional pairs.

Modules own parameters; calls own activations:
    out, cache = module.forward(x)       # calls the pair, stores nothing on the module
    dx = module.backward(dout, cache)    # calls the pair, adds (+=) into each Param.grad
A Module names each Param after the pair argument it feeds, so `add_grads` can add a pair's
gradient dict into the Params in one place. A Module contains no math of its own, so a layer can be reused and weights can be tied
(the same Param object in two places accumulates both gradients).
"""
from contextlib import contextmanager

import numpy as np

from scratchllm.core import fused, gelu, norms, ops, relu
from scratchllm.core.fp8 import FP8Spec, fp8_linear_backward, fp8_linear_forward
from scratchllm.core.fused_geglu import GEGLU_TANH
from scratchllm.core.twins import TwinCache
from scratchllm.core.optim import NonFiniteError


class Param:
    """A trainable array and its accumulated gradient."""

    def __init__(self, data):
        self.data = data
        self.grad = np.zeros(data.shape, data.dtype)  # calloc: pages stay untouched until used

    def __repr__(self):
        return f"Param(shape={self.data.shape}, dtype={self.data.dtype})"


class Module:
    """A tree of Params and sub-Modules, found through the attributes (lists too)."""

    def named_parameters(self, prefix=""):
        """Yield (dotted name, Param) once per distinct Param, in attribute order."""
        seen = set()
        for name, p in self._walk(prefix):
            if id(p) not in seen:
                seen.add(id(p))
                yield name, p

    def _walk(self, prefix):
        for attr, value in vars(self).items():
            items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
            for i, item in items:
                name = f"{prefix}{attr}" if i is None else f"{prefix}{attr}.{i}"
                if isinstance(item, Param):
                    yield name, item
                elif isinstance(item, Module):
                    yield from item._walk(name + ".")

    def add_grads(self, grads):
        """Add a pair's gradients into this Module's own Params: p.grad += grads[name] for
        every Param attribute `name` (sub-Modules add theirs themselves). Returns grads["x"],
        the input gradient, or None when the pair has no input gradient (an embedding)."""
        for name, value in vars(self).items():
            if isinstance(value, Param):
                if name not in grads:
                    raise KeyError(f"{type(self).__name__}.add_grads: no gradient for Param "
                                   f"{name!r}; the backward gave {sorted(grads)}")
                value.grad += grads[name]
        return grads.get("x")

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def zero_grad(self):
        for p in self.parameters():
            p.grad[...] = 0

    def n_params(self):
        return sum(p.data.size for p in self.parameters())

    def named_modules(self, prefix=""):
        """Yield (dotted name, Module) for this Module ("" for itself) and every sub-Module."""
        yield prefix.rstrip("."), self
        for attr, value in vars(self).items():
            items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
            for i, item in items:
                if isinstance(item, Module):
                    name = f"{prefix}{attr}" if i is None else f"{prefix}{attr}.{i}"
                    yield from item.named_modules(name + ".")


def _non_finite(value):
    """True if `value` (an array, or a tuple of arrays and None) holds a NaN or inf."""
    if isinstance(value, tuple):
        return any(_non_finite(v) for v in value)
    return (isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.floating)
            and not np.isfinite(value).all())


@contextmanager
def detect_anomaly(*models):
    """Inside the block, every Module of `models` checks what it returns: the first forward
    output or backward input-gradient holding NaN or inf raises NonFiniteError naming that
    Module by its dotted path (the innermost one first: it returns first). Slower; for
    finding where a run diverged (`train --detect-anomaly`)."""
    patched = []
    for model in models:
        for name, module in model.named_modules():
            for method in ("forward", "backward"):
                if hasattr(module, method):
                    setattr(module, method, _checked(name or type(module).__name__, module,
                                                     method))
                    patched.append((module, method))
    try:
        yield
    finally:
        for module, method in patched:
            vars(module).pop(method, None)


def _checked(name, module, method):
    call = getattr(module, method)
    what = "output" if method == "forward" else "input gradient"

    def checked(*args, **kwargs):
        result = call(*args, **kwargs)
        out = result[0] if method == "forward" else result
        if _non_finite(out):
            raise NonFiniteError(f"detect_anomaly: the {what} of {name} "
                                 f"({type(module).__name__}.{method}) holds NaN or inf")
        return result
    return checked


class _NoDraws:
    """An rng for a model's constructor when its weights will be overwritten or only their
    shapes matter (hub's loader, a rank building its shard): normal_init sees skip_init and
    returns np.empty (no draw, no page touched); a module drawing directly gets a constant
    array of its size (standard_normal 0, uniform its low end: Mamba-2 takes log(U[1, 16)))."""

    skip_init = True

    @staticmethod
    def standard_normal(size):
        return np.zeros(size, np.float32)  # (size)

    @staticmethod
    def uniform(low, high, size):
        return np.full(size, low, np.float32)  # (size)


NO_DRAWS = _NoDraws()  # Model(cfg, rng=NO_DRAWS): weights np.empty, nothing drawn


def normal_init(rng, shape, std, dtype):
    """A weight drawn from N(0, std^2) in `dtype` (std = d_in^-1/2 for projections). An rng
    with `skip_init = True` (NO_DRAWS: hub's loader, which overwrites every Param) gets
    np.empty: no draws and no memory touched."""
    if getattr(rng, "skip_init", False):
        return np.empty(shape, dtype)
    return (rng.standard_normal(shape) * std).astype(dtype)


class Linear(Module):
    """y = x @ W (+ b); W (d_in, d_out) ~ N(0, 1/d_in)."""

    def __init__(self, d_in, d_out, *, bias=False, rng, dtype=np.float32):
        self.W = Param(normal_init(rng, (d_in, d_out), d_in ** -0.5, dtype))
        self.b = Param(np.zeros(d_out, dtype)) if bias else None

    def forward(self, x):
        return ops.linear_forward(x, self.W.data, None if self.b is None else self.b.data)

    def backward(self, dy, cache):
        """dy (..., Dout) -> dx (..., Din); W.grad += x^T dy by one gemm into W.grad
        (linear_backward's into=: no (Din, Dout) temporary), b.grad += the rows' sum of dy.
        An FP8 cache (core.fp8.fp8_matmuls) adds its pair's gradients."""
        if not isinstance(cache, ops.LinearCache):
            return self.add_grads(ops.linear_backward(dy, cache))
        g = ops.linear_backward(dy, cache, into=self.W.grad)  # fwd: y = x W (+ b)
        if self.b is not None:
            self.b.grad += g["b"]
        return g["x"]


class FP8Linear(Linear):
    """y = Q(x) @ Q(W) (+ b) in FP8 (core.fp8: e4m3 operands on fine-grained scales, the
    backward straight through the rounding); the Params stay in their float dtype (the master
    weights the optimizer updates)."""

    def __init__(self, d_in, d_out, *, bias=False, rng, dtype=np.float32, spec=FP8Spec()):
        super().__init__(d_in, d_out, bias=bias, rng=rng, dtype=dtype)
        self.spec = spec

    def forward(self, x):
        return fp8_linear_forward(x, self.W.data, None if self.b is None else self.b.data,
                                  spec=self.spec)

    def backward(self, dy, cache):
        return self.add_grads(fp8_linear_backward(dy, cache))


class Embedding(Module):
    """out = E[ids]; E (V, D) ~ N(0, 1). `attend` reuses E as a tied output head."""

    def __init__(self, vocab_size, d_model, *, rng, dtype=np.float32):
        self.E = Param(normal_init(rng, (vocab_size, d_model), 1.0, dtype))

    def forward(self, ids):
        return ops.embedding_forward(ids, self.E.data)

    def backward(self, dout, cache):
        """E.grad += dE, scattered into the rows of ids (a 49k-word table's (V, D) of zeros
        and its add cost more than the rows themselves)."""
        ops.embedding_backward(dout, cache, into=self.E.grad)

    def attend(self, x):
        """Tied head: logits = x @ E^T, (..., D) -> (..., V)."""
        return ops.linear_forward(x, self.E.data.T)

    def attend_backward(self, dlogits, cache):
        g = ops.linear_backward(dlogits, cache)
        self.E.grad += g["W"].T  # W = E^T, so dE = dW^T
        return g["x"]


class RMSNorm(Module):
    """y = x / rms(x) * (offset + g); g starts at ones (offset 0), or at zeros with offset 1
    (Gemma stores w and scales by 1 + w). The pair sees the gain offset + g, whose gradient
    is g's. Runs the fused twin unless
    SCRATCHLLM_READABLE."""

    def __init__(self, d_model, *, eps=1e-5, offset=0.0, dtype=np.float32):
        self.g = Param(np.full(d_model, 1.0 - offset, dtype))
        self.eps, self.offset = eps, offset

    def forward(self, x):
        g = self.g.data + self.offset if self.offset else self.g.data  # (D,)
        return fused.RMSNORM.forward(x, g, self.eps)

    def backward(self, dy, cache):
        return self.add_grads(fused.RMSNORM.backward(dy, cache))


class SwiGLU(Module):
    """y = (silu(x @ W1) * (x @ W3)) @ W2, the Llama FFN; the fused twin unless
    SCRATCHLLM_READABLE."""

    def __init__(self, d_model, d_ff, *, rng, dtype=np.float32):
        self.W1 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.W3 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.W2 = Param(normal_init(rng, (d_ff, d_model), d_ff ** -0.5, dtype))

    def forward(self, x):
        return fused.SWIGLU.forward(x, self.W1.data, self.W3.data, self.W2.data)

    def backward(self, dy, cache):
        return self.add_grads(fused.SWIGLU.backward(dy, cache))


class LayerNorm(Module):
    """y = (x - mean) / std * g (+ b); g starts at ones, b at zeros (GPT-2's ln_1, ln_2)."""

    def __init__(self, d_model, *, eps=1e-5, bias=True, dtype=np.float32):
        self.g = Param(np.ones(d_model, dtype))
        self.b = Param(np.zeros(d_model, dtype)) if bias else None
        self.eps = eps

    def forward(self, x):
        return norms.layernorm_forward(x, self.g.data, None if self.b is None else self.b.data,
                                       self.eps)

    def backward(self, dy, cache):
        return self.add_grads(norms.layernorm_backward(dy, cache))


class GeluMLP(Module):
    """y = gelu(x @ W1 + b1) @ W2 + b2, the GPT-2 MLP (c_fc, c_proj)."""

    def __init__(self, d_model, d_ff, *, rng, approximate="tanh", dtype=np.float32):
        self.W1 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.b1 = Param(np.zeros(d_ff, dtype))
        self.W2 = Param(normal_init(rng, (d_ff, d_model), d_ff ** -0.5, dtype))
        self.b2 = Param(np.zeros(d_model, dtype))
        self.approximate = approximate

    def forward(self, x):
        return gelu.gelu_mlp_forward(x, self.W1.data, self.b1.data, self.W2.data, self.b2.data,
                                     approximate=self.approximate)

    def backward(self, dy, cache):
        return self.add_grads(gelu.gelu_mlp_backward(dy, cache))


class ReluMLP(Module):
    """y = max(x @ W1, 0) @ W2, T5's DenseReluDense (wi, wo; no biases)."""

    def __init__(self, d_model, d_ff, *, rng, dtype=np.float32):
        self.W1 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.W2 = Param(normal_init(rng, (d_ff, d_model), d_ff ** -0.5, dtype))

    def forward(self, x):
        return relu.relu_mlp_forward(x, self.W1.data, self.W2.data)

    def backward(self, dy, cache):
        return self.add_grads(relu.relu_mlp_backward(dy, cache))


class GeGLU(Module):
    """y = (gelu(x @ W1) * (x @ W3)) @ W2, Gemma's MLP (gate_proj, up_proj, down_proj)."""

    def __init__(self, d_model, d_ff, *, rng, approximate="tanh", dtype=np.float32):
        self.W1 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.W3 = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.W2 = Param(normal_init(rng, (d_ff, d_model), d_ff ** -0.5, dtype))
        self.approximate = approximate

    def forward(self, x):
        """The tanh gate takes core/fused_geglu.py's twin (the fused one unless
        SCRATCHLLM_READABLE); the erf and quick gates the readable pair."""
        if self.approximate == "tanh":
            return GEGLU_TANH.forward(x, self.W1.data, self.W3.data, self.W2.data)
        y, cache = gelu.geglu_forward(x, self.W1.data, self.W3.data, self.W2.data,
                                      approximate=self.approximate)
        return y, TwinCache(gelu.geglu_backward, cache)

    def backward(self, dy, cache):
        return self.add_grads(GEGLU_TANH.backward(dy, cache))  # the cache's own backward
