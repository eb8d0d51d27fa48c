"""The linear-attention family, one recurrence S_t = (decay) S_{t-1} + (write) with three forms
each (parallel, chunked, recurrent): gated linear attention, the engine (gla;
its per-channel intra-chunk scores as a Numba kernel in gla_scores; its chunked form as Numba
lane kernels, spans of (batch, head) lanes on threads, in gla_chunks; the delta rule's chunks run their
lane groups in threads, lanes); causal linear
attention (linear); RetNet's scalar decay (retnet); the delta rule and gated DeltaNet (delta);
RWKV-4's WKV (rwkv; its recurrent training pair, the stabilised scan and its adjoint, in
rwkv_scan) and its time-mix / channel-mix blocks (rwkv_blocks: TimeMixWeights,
ChannelMixWeights, RWKVSpec); RWKV-7's generalised delta rule (rwkv7: recurrent, chunked
and step forms); the token-mixer pair and Module for a language model (layer: RecurrentWeights,
RecurrentSpec); Qwen3-Next's gated DeltaNet layer (gated_deltanet: conv, l2-normed q and k,
the decay and β gates, the gated output norm around delta's gated rule). Stands on core and specs."""
from .delta import (delta_rule_backward, delta_rule_final_state, delta_rule_forward,
                    delta_rule_recurrent, delta_rule_recurrent_ref, delta_rule_step)
from .gated_deltanet import (GatedDeltaNet, GatedDeltaState, GatedDeltaWeights,
                             gated_deltanet_backward, gated_deltanet_forward,
                             gated_deltanet_step)
from .gla import (GLACache, gla_attention_backward, gla_attention_forward,
                  gla_attention_recurrent, gla_attention_recurrent_ref, gla_attention_step)
from .layer import (RecurrentMixer, RecurrentWeights, recurrent_mixer_backward,
                    recurrent_mixer_forward, recurrent_mixer_step)
from .linear import (linear_attention_backward, linear_attention_forward,
                     linear_attention_recurrent, linear_attention_recurrent_ref,
                     linear_attention_step)
from .rwkv import (WKVState, rwkv4_wkv_backward, rwkv4_wkv_forward, rwkv4_wkv_recurrent,
                   rwkv4_wkv_recurrent_ref, rwkv4_wkv_step)
from .rwkv_scan import (rwkv4_wkv_scan_backward, rwkv4_wkv_scan_backward_ref,
                        rwkv4_wkv_scan_forward, rwkv4_wkv_scan_forward_ref)
from .rwkv_blocks import (ChannelMixWeights, RWKV4ChannelMix, RWKV4TimeMix, TimeMixWeights,
                          rwkv4_channel_mix_backward, rwkv4_channel_mix_forward,
                          rwkv4_channel_mix_step, rwkv4_time_mix_backward,
                          rwkv4_time_mix_forward, rwkv4_time_mix_step)
from .rwkv7 import (rwkv7_backward, rwkv7_forward, rwkv7_recurrent, rwkv7_recurrent_ref,
                    rwkv7_step)
from .retnet import (retnet_attention_backward, retnet_attention_forward,
                     retnet_attention_recurrent, retnet_attention_recurrent_ref,
                     retnet_attention_step, retnet_gammas)

__all__ = [
    "ChannelMixWeights", "GLACache", "GatedDeltaNet", "GatedDeltaState", "GatedDeltaWeights",
    "gated_deltanet_backward", "gated_deltanet_forward", "gated_deltanet_step", "RWKV4ChannelMix", "RWKV4TimeMix", "RecurrentMixer",
    "RecurrentWeights",
    "TimeMixWeights", "WKVState", "delta_rule_backward", "delta_rule_final_state",
    "delta_rule_forward", "delta_rule_recurrent", "delta_rule_recurrent_ref", "delta_rule_step",
    "gla_attention_backward", "gla_attention_forward", "gla_attention_recurrent",
    "gla_attention_recurrent_ref", "gla_attention_step", "linear_attention_backward",
    "linear_attention_forward", "linear_attention_recurrent", "linear_attention_recurrent_ref",
    "linear_attention_step", "recurrent_mixer_backward", "recurrent_mixer_forward",
    "recurrent_mixer_step", "retnet_attention_backward", "retnet_attention_forward",
    "retnet_attention_recurrent", "retnet_attention_recurrent_ref", "retnet_attention_step",
    "retnet_gammas", "rwkv4_channel_mix_backward", "rwkv4_channel_mix_forward",
    "rwkv4_channel_mix_step", "rwkv4_time_mix_backward", "rwkv4_time_mix_forward",
    "rwkv4_time_mix_step", "rwkv4_wkv_backward", "rwkv4_wkv_forward", "rwkv4_wkv_recurrent",
    "rwkv4_wkv_recurrent_ref", "rwkv4_wkv_scan_backward", "rwkv4_wkv_scan_backward_ref",
    "rwkv4_wkv_scan_forward", "rwkv4_wkv_scan_forward_ref", "rwkv4_wkv_step",
    "rwkv7_backward", "rwkv7_forward", "rwkv7_recurrent", "rwkv7_recurrent_ref", "rwkv7_step",
]
