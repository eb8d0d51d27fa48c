"""Serving: quantised arrays (quantize: int8, fp8 e4m3, int4 packed), a paged KV cache (blocks:
block tables, free list, prefix sharing, copy-on-write; pool: the per-layer arrays, paged or
contiguous, keys and values of GQA layers or MLA's latents, read by the LM's decode through
views with its states' interfaces: views), one call for sequences at
different positions (rows), a continuous-batching engine (engine: generate_batch), what
quantising the cache costs (quality), weight quantisation of Linear layers (weights),
speculative decoding (speculative; its drafters: another model or the target's MTP module,
drafts), token eviction under a KV budget (evict), decode attention reading a quantised
paged cache in one Numba pass (qattention); calibrated int4 weights (gptq: GPTQ).
"""
from .blocks import BlockManager, OutOfBlocks
from .evict import POLICIES, EvictingKV, kv_budget_cross_entropy
from .engine import Engine, Request, generate_batch, make_engine
from .pool import (KV_DTYPES, CacheLayer, ContiguousCache, PagedCache, StateCache,
                   attention_layers, cache_layers, paged_supported)
from .views import GroupState, KernelView, LatentView
from .quality import kv_attention_error, kv_cross_entropy
from .drafts import MTPDraft, ModelDraft
from .rows import (attention_weights, block_rows, decode_rows, forward_rows, prefill_rows,
                   rows_supported, trunk_rows)
from .speculative import accept_draft, residual, speculative_generate
from .weights import quantizable, quantize_weights
from .gptq import gptq_quantize, gptq_weights
from .qattention import (QUANTIZED_PAGED_ATTENTION, ScoreOptions, quantized_paged_attention,
                         quantized_paged_attention_ref)
from .quantize import (FORMATS, Quantized, default_group_size, dequantize_codes, error_bound,
                       quantize)

__all__ = ["BlockManager", "ContiguousCache", "Engine", "EvictingKV", "FORMATS", "GroupState",
           "KV_DTYPES", "MTPDraft", "ModelDraft", "OutOfBlocks", "POLICIES", "PagedCache",
           "QUANTIZED_PAGED_ATTENTION", "Quantized", "Request", "ScoreOptions", "StateCache",
           "accept_draft", "attention_layers", "attention_weights", "block_rows", "decode_rows",
           "default_group_size", "dequantize_codes", "error_bound", "forward_rows",
           "generate_batch", "kv_attention_error", "kv_budget_cross_entropy", "kv_cross_entropy",
           "make_engine", "paged_supported", "prefill_rows", "quantizable", "quantize",
           "quantize_weights", "quantized_paged_attention", "quantized_paged_attention_ref",
           "residual", "rows_supported", "speculative_generate", "trunk_rows"]
__all__ += ["gptq_quantize", "gptq_weights", "CacheLayer", "KernelView", "LatentView",
            "cache_layers"]
