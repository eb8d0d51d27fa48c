"""Attention: RoPE and its scalings (rope), boolean masks (masks), scaled dot-product attention
with grouped K/V heads (sdpa), grouped-query attention and its decoding step (gqa), decoding
state (kv_state), multi-head latent attention (mla_projection, mla), and the Numba twins:
RoPE fused with the head split (rope_heads), sdpa's softmax in one pass per row
(sdpa_softmax).

Stands on core only; mla stands on sdpa, rope and masks."""
from .gqa import (QKV, Attention, gqa_backward, gqa_decode, gqa_forward, gqa_forward_ref,
                  project_qkv_backward, project_qkv_forward)
from .kv_state import KVState, LatentKVState, RollingKVState
from .masks import attention_sink_mask, block_sparse_mask, causal_mask, sliding_window_mask
from .mla import MLA, mla_backward, mla_decode, mla_decode_ref, mla_forward, mla_softmax_scale
from .mla_projection import MLAProjection, mla_project_backward, mla_project_forward
from .rope import get_mscale, rope_backward, rope_forward, rope_frequencies
from .rope_heads import (rope_heads_backward, rope_heads_backward_ref, rope_heads_forward,
                         rope_heads_forward_ref)
from .sdpa import (merge_heads, repeat_kv_backward, repeat_kv_forward, sdpa_backward,
                   sdpa_forward, split_heads)
from .sdpa_softmax import softmax_scores_, softmax_scores_backward_

__all__ = [
    "Attention", "KVState", "LatentKVState", "MLA", "MLAProjection", "QKV", "RollingKVState",
    "attention_sink_mask", "block_sparse_mask", "causal_mask", "get_mscale", "gqa_backward",
    "gqa_decode", "gqa_forward", "gqa_forward_ref", "merge_heads", "mla_backward", "mla_decode",
    "mla_decode_ref", "mla_forward", "mla_project_backward", "mla_project_forward",
    "mla_softmax_scale", "project_qkv_backward", "project_qkv_forward", "repeat_kv_backward",
    "repeat_kv_forward", "rope_backward", "rope_forward", "rope_frequencies",
    "rope_heads_backward", "rope_heads_backward_ref", "rope_heads_forward",
    "rope_heads_forward_ref", "sdpa_backward",
    "sdpa_forward", "sliding_window_mask", "softmax_scores_", "softmax_scores_backward_",
    "split_heads",
]
