"""The FFN of a Block: one interface for a dense MLP and a mixture of experts, built from the
LayerSpec's ffn (an FFNSpec or a MoESpec).

What a Block and the LM ask of every FFN:
    y, cache = ffn.forward(x)               x (..., D) -> y (..., D)
    ffn.aux_losses(cache)                   ((name, value), ...): terms the LM adds to its
                                            loss, coefficients applied (empty when dense)
    dx = ffn.backward(dy, cache, dloss_aux) dloss_aux: d loss / d each aux term (the loss's
                                            scale); those terms' gradients flow in here too
    ffn.named_buffers()                     [(name, array)]: state that is saved but not
                                            trained (the MoE's selection bias)
    ffn.after_step(caches)                  after an optimizer step, given this layer's cache
                                            of each data-parallel shard: the MoE's routed
                                            share per expert (and its bias update); None
The dense FFNs are core.nn's SwiGLU (Llama), GeluMLP (GPT-2) and GeGLU (Gemma) with that
interface added; the MoE is moe.MoE with its outputs (y, aux, z) split into y and the loss
terms of MoE.aux_losses:  balance_coef * aux (Switch)  and  z_coef * z (ST-MoE), the
coefficients of its MoESpec.

Glossary: D model width, F hidden width, E experts.
"""
import numpy as np

from scratchllm.core import GeGLU, GeluMLP, ReluMLP, SwiGLU
from scratchllm.linear_attention import RWKV4ChannelMix
from scratchllm.moe import MoE, SwitchMoE, SwitchOut
from scratchllm.specs import FFNSpec, MoESpec


class Dense:
    """The FFN interface of a dense MLP (mixed into its Module): no loss terms, no buffers."""

    def aux_losses(self, cache):
        return ()

    def backward(self, dy, cache, dloss_aux=1.0):
        """dy (..., D) -> dx; dloss_aux has nothing to reach (no aux terms)."""
        return super().backward(dy, cache)

    def named_buffers(self):
        return []

    def after_step(self, caches, across=None):
        return None


class SwiGLUFFN(Dense, SwiGLU):
    """y = (silu(x W1) * (x W3)) W2 as a Block's FFN."""


class GeluMLPFFN(Dense, GeluMLP):
    """y = gelu(x W1 + b1) W2 + b2 as a Block's FFN."""


class GeGLUFFN(Dense, GeGLU):
    """y = (gelu(x W1) * (x W3)) W2 as a Block's FFN."""


class RWKVChannelMixFFN(Dense, RWKV4ChannelMix):
    """RWKV-4's channel mix (FFNSpec kind "channel_mix"): a dense FFN with a decoding state,
    the previous token's x (init_state(batch), decode(x_t, state))."""


class ReluMLPFFN(Dense, ReluMLP):
    """y = max(x W1, 0) W2 as a Block's FFN (T5)."""


class MoEFFN(MoE):
    """The MoE layer as a Block's FFN: forward(x) -> (y, cache), the balance and z losses
    left in the cache for MoE.aux_losses (weighted by the MoESpec's balance_coef, z_coef), and
    backward(dy, cache, dloss_aux) with their gradients (MoE.aux_dout)."""

    def forward(self, x):
        """x (..., D) -> (y (..., D), the MoE's cache)."""
        out, cache = super().forward(x)
        return out.y, cache

    def backward(self, dy, cache, dloss_aux=1.0):
        """dy (..., D) -> dx. fwd: loss += balance_coef aux + z_coef z, so
        daux = dloss_aux balance_coef, dz = dloss_aux z_coef."""
        return super().backward(self.aux_dout(dy, dloss_aux), cache)

    def named_buffers(self):
        return [("selection_bias", self.selection_bias)]

    def after_step(self, caches, across=None):
        """The share of routed slots per expert (E,) over the shards' caches (and over the
        data-parallel processes: across sums an array over them); with the router's
        bias_gamma > 0, the aux-loss-free bias update from those counts (in place: replicas
        share the array)."""
        counts = sum(np.asarray(c.tokens_per_expert, np.float64) for c in caches)  # (E,)
        if across is not None:
            counts = across(counts)
        if self.spec.router.bias_gamma > 0:
            self.update_bias(counts, self.spec.router.bias_gamma)
        return counts / max(counts.sum(), 1)


class SwitchFFN(SwitchMoE):
    """Switch's sparse layer (moe/switch.py) as a Block's FFN: forward(x) -> (y, cache), the
    router logits kept in the cache (router_logits) for the model's stack losses; backward(dy,
    cache, dloss_aux) with dloss_aux the gradient on those logits (..., E) from the model, or
    a number (no router loss: the logits get none)."""

    def forward(self, x):
        """x (..., D) -> (y (..., D), (the layer's cache, its router logits (..., E)))."""
        out, cache = super().forward(x)
        return out.y, (cache, out.logits)

    def backward(self, dy, cache, dloss_aux=1.0):
        dlogits = dloss_aux if isinstance(dloss_aux, np.ndarray) else None
        return super().backward(SwitchOut(dy, dlogits), cache[0])

    @staticmethod
    def router_logits(cache):
        return cache[1]

    def aux_losses(self, cache):
        return ()  # the stack's (lm/seq2seq.py: router_losses_forward)

    def named_buffers(self):
        return []

    def after_step(self, caches, across=None):
        return None


GELU_FFNS = {"gelu_mlp": GeluMLPFFN, "geglu": GeGLUFFN}  # the FFNSpec kinds with gelu_approx


def make_ffn(d_model, spec, *, rng, dtype):
    """The FFN Module of an FFNSpec or a MoESpec."""
    if isinstance(spec, MoESpec):
        kind = MoEFFN if spec.expert_capacity is None else SwitchFFN
        return kind(d_model, spec, rng=rng, dtype=dtype)
    if not isinstance(spec, FFNSpec):
        raise TypeError(f"make_ffn: spec must be an FFNSpec or a MoESpec, got "
                        f"{type(spec).__name__}")
    if spec.kind == "channel_mix":
        return RWKVChannelMixFFN(d_model, spec.d_ff, rng=rng, dtype=dtype)
    if spec.kind in ("swiglu", "relu_mlp"):
        kind = SwiGLUFFN if spec.kind == "swiglu" else ReluMLPFFN
        return kind(d_model, spec.d_ff, rng=rng, dtype=dtype)
    return GELU_FFNS[spec.kind](d_model, spec.d_ff, rng=rng, approximate=spec.gelu_approx,
                                dtype=dtype)
