"""Which Module a spec becomes: the token mixer of a LayerSpec (GQA attention, MLA, Mamba,
Mamba-2, a linear-attention-family recurrence, RWKV-4's time mix, Qwen3-Next's gated
DeltaNet) and the norms (RMSNorm or LayerNorm). No math here: each mixer Module is built as
Module(d_model, spec, rng=, dtype=) and passes its spec unchanged into its pair.

Every mixer offers forward(x) -> (y, cache), backward(dy, cache) -> dx, and for decoding
init_state(batch, max_len) -> state, decode(x_t, state, position) -> y_t and (attention, MLA,
Mamba) prefill(x, state) -> y.
"""
from scratchllm.attention import MLA, Attention
from scratchllm.core import LayerNorm, RMSNorm
from scratchllm.linear_attention import GatedDeltaNet, RecurrentMixer, RWKV4TimeMix
from scratchllm.specs import (AttentionSpec, GatedDeltaNetSpec, Mamba2Spec, MambaSpec, MLASpec,
                              RecurrentSpec, RWKVSpec)
from scratchllm.ssm import Mamba, Mamba2

MIXER_MODULES = {AttentionSpec: Attention, MLASpec: MLA, MambaSpec: Mamba, Mamba2Spec: Mamba2,
                 RecurrentSpec: RecurrentMixer, RWKVSpec: RWKV4TimeMix,
                 GatedDeltaNetSpec: GatedDeltaNet}


def make_mixer(d_model, spec, *, rng, dtype):
    """The token mixer Module of a mixer spec (LayerSpec.mixer)."""
    if type(spec) not in MIXER_MODULES:
        raise TypeError(f"make_mixer: spec must be one of "
                        f"{[c.__name__ for c in MIXER_MODULES]}, got {type(spec).__name__}")
    return MIXER_MODULES[type(spec)](d_model, spec, rng=rng, dtype=dtype)


def make_norm(d_model, spec, dtype):
    """A NormSpec's Module: RMSNorm (gain offset + g), or LayerNorm with bias (GPT-2)."""
    if spec.kind == "layernorm":
        if spec.offset:
            raise ValueError(f"make_norm: a gain offset ({spec.offset}) is an RMSNorm option; "
                             f"LayerNorm has none")
        return LayerNorm(d_model, eps=spec.eps, dtype=dtype)
    return RMSNorm(d_model, eps=spec.eps, offset=spec.offset, dtype=dtype)
