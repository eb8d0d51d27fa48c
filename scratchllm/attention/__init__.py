"""Attention: RoPE and its scalings (rope), boolean masks and the array of a Mask spec
(masks), scaled dot-product attention with grouped K/V heads (sdpa), the projections of a
GQA layer (qkv), grouped-query attention and its decoding step (gqa), decoding state
(kv_state), gated attention's output gate (gate), and multi-head latent attention (mla_projection, mla); tiled Flash attention
(flash), sinusoidal and ALiBi positions (positions), MHA -> GQA conversion (convert),
cross-attention (cross), DeepSeek's top-k sparse attention (indexer, sparse), the fixed
sparse patterns and document masks (sparse_masks), native sparse attention (nsa);
the Numba twins: RoPE fused with the head split (rope_heads), sdpa's softmax in one pass
per row (sdpa_softmax).

A layer's options arrive as specs (scratchllm.specs: AttentionSpec, MLASpec, RopeSpec, Mask),
its arrays as one NamedTuple (AttentionWeights, MLAWeights), RoPE at run time as a Rope.
Stands on core and specs; mla stands on sdpa, rope and masks."""
from .convert import mha_to_gqa
from .cross import (CrossAttention, CrossContext, cross_attention_backward,
                    cross_attention_context, cross_attention_forward, cross_attention_read)
from .flash import FlashCache, flash_sdpa_backward, flash_sdpa_forward
from .gate import GateCache, output_gate_backward, output_gate_forward
from .gqa import Attention, gqa_backward, gqa_decode, gqa_forward, gqa_forward_ref
from .indexer import (attention_distribution, indexer_kl_loss_backward,
                      indexer_kl_loss_forward, lightning_indexer_backward,
                      lightning_indexer_forward)
from .kv_state import KVState, LatentKVState, RollingKVState
from .masks import (attention_sink_mask, block_sparse_mask, causal_mask, chunked_causal_mask,
                    mask_array, padding_mask, sliding_window_mask)
from .mla import MLA, mla_backward, mla_decode, mla_decode_ref, mla_forward, mla_softmax_scale
from .mla_projection import MLAProjection, MLAWeights, mla_project_backward, mla_project_forward
from .nsa import (compress_matrix, nsa_backward, nsa_forward, nsa_forward_ref, nsa_indices,
                  selection_weights)
from .nsa_mlp import (CompressWeights, NSAWeights, nsa_compress_backward, nsa_compress_forward,
                      nsa_mlp_backward, nsa_mlp_forward, nsa_mlp_forward_ref)
from .positions import (alibi_bias, alibi_slopes, relative_bias_backward, relative_bias_forward,
                        relative_offset_buckets, relative_position_buckets, sinusoidal_positions)
from .qkv import QKV, AttentionWeights, project_qkv_backward, project_qkv_forward
from .rope import Rope, get_mscale, make_rope, rope_backward, rope_forward, rope_frequencies
from .sparse_masks import (bigbird_mask, document_mask, document_positions, fixed_mask,
                           mask_receptive_field, packed_mask, strided_mask)
from .sparse import topk_select, topk_sparse_attention_backward, topk_sparse_attention_forward
from .rope_heads import (rope_heads_backward, rope_heads_backward_ref, rope_heads_forward,
                         rope_heads_forward_ref)
from .sdpa import (merge_heads, repeat_kv_backward, repeat_kv_forward, sdpa_backward,
                   sdpa_forward, split_heads)
from .sdpa_softmax import softmax_scores_, softmax_scores_backward_

__all__ = [
    "compress_matrix", "nsa_backward", "nsa_forward", "nsa_forward_ref", "nsa_indices",
    "selection_weights",
    "CompressWeights", "NSAWeights", "nsa_compress_backward", "nsa_compress_forward",
    "nsa_mlp_backward", "nsa_mlp_forward", "nsa_mlp_forward_ref",
    "bigbird_mask", "document_mask", "document_positions", "fixed_mask", "mask_receptive_field",
    "packed_mask", "strided_mask",
    "Attention", "AttentionWeights", "KVState", "LatentKVState", "MLA", "MLAProjection",
    "MLAWeights", "QKV", "RollingKVState", "Rope", "attention_sink_mask", "block_sparse_mask",
    "causal_mask", "chunked_causal_mask", "get_mscale", "gqa_backward", "gqa_decode", "gqa_forward",
    "GateCache", "output_gate_backward", "output_gate_forward",
    "gqa_forward_ref", "make_rope", "mask_array", "merge_heads", "mla_backward", "mla_decode",
    "mla_decode_ref", "mla_forward", "mla_project_backward", "mla_project_forward",
    "mla_softmax_scale", "project_qkv_backward", "project_qkv_forward", "repeat_kv_backward",
    "repeat_kv_forward", "rope_backward", "rope_forward", "rope_frequencies",
    "rope_heads_backward", "rope_heads_backward_ref", "rope_heads_forward",
    "rope_heads_forward_ref", "sdpa_backward",
    "sdpa_forward", "sliding_window_mask", "softmax_scores_", "softmax_scores_backward_",
    "split_heads",
    # flash attention, cross-attention, positions, MHA -> GQA
    "CrossAttention", "CrossContext", "cross_attention_context", "cross_attention_read",
    "FlashCache", "alibi_bias", "cross_attention_backward",
    "cross_attention_forward", "alibi_slopes", "flash_sdpa_backward", "flash_sdpa_forward",
    "mha_to_gqa", "sinusoidal_positions", "relative_bias_backward", "relative_bias_forward",
    "relative_offset_buckets", "relative_position_buckets",
    "padding_mask",
    # DeepSeek sparse attention
    "attention_distribution", "indexer_kl_loss_backward", "indexer_kl_loss_forward",
    "lightning_indexer_backward", "lightning_indexer_forward", "topk_select",
    "topk_sparse_attention_backward", "topk_sparse_attention_forward",
]
