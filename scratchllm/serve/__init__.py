"""Serving: quantised arrays (quantize: int8, fp8 e4m3, int4 packed), a paged KV cache (blocks:
block tables, free list, prefix sharing, copy-on-write; pool: the per-layer arrays, paged or
contiguous, read by the LM's decode through KVState-like views) and a continuous-batching
engine (engine: generate_batch; rows: one decode
call for sequences at different positions), and what quantising the cache costs (quality)."""
from .blocks import BlockManager, OutOfBlocks
from .engine import Engine, Request, generate_batch, make_engine
from .pool import KV_DTYPES, ContiguousCache, GroupState, PagedCache, attention_layers
from .quality import kv_attention_error, kv_cross_entropy
from .rows import decode_rows, rows_supported
from .quantize import (FORMATS, Quantized, default_group_size, dequantize_codes, error_bound,
                       quantize)

__all__ = ["FORMATS", "KV_DTYPES", "BlockManager", "ContiguousCache", "Engine", "GroupState",
           "OutOfBlocks", "PagedCache", "Quantized", "Request", "attention_layers",
           "decode_rows", "default_group_size", "dequantize_codes", "error_bound", "generate_batch",
           "kv_attention_error", "kv_cross_entropy", "make_engine", "quantize", "rows_supported"]
