"""The bad-input audit's further categories (benchmarks/audit.py runs them with its own):
masks, decoding states, the Tokenizer's methods, and sizes. Each case's `want` is the right
answer: ERROR (a clear error) or the value it must return."""
import numpy as np

from audit_common import ERROR, rng


def _qkv(T=4):
    q = rng().standard_normal((1, 2, T, 4))
    return q, q.copy(), q.copy()


# ---------------------------------------------------------------------------- masks
def sdpa_int_mask():
    from scratchllm.attention import sdpa_forward
    from scratchllm.specs import Mask
    q, k, v = _qkv()
    return sdpa_forward(q, k, v, Mask(array=np.tril(np.ones((4, 4), np.int64))))[0]


def sdpa_mask_wrong_shape():
    from scratchllm.attention import sdpa_forward
    from scratchllm.specs import Mask
    q, k, v = _qkv()
    return sdpa_forward(q, k, v, Mask(array=np.ones((4, 5), bool)))[0]


def sdpa_mask_list():
    from scratchllm.attention import sdpa_forward
    from scratchllm.specs import Mask
    q, k, v = _qkv()
    return sdpa_forward(q, k, v, Mask(array=[[True] * 4] * 4))[0]


def sdpa_fully_masked_row():
    from scratchllm.attention import sdpa_forward
    from scratchllm.specs import Mask
    q, k, v = _qkv()
    mask = np.ones((4, 4), bool)
    mask[2] = False
    return sdpa_forward(q, k, v, Mask(array=mask))[0][0, :, 2]  # a fully masked row: zeros


def cross_attention_mask_wrong_shape():
    from scratchllm.attention import AttentionWeights
    from scratchllm.attention.cross import cross_attention_forward
    from scratchllm.specs import AttentionSpec, Mask
    r = rng()
    x, ctx, w = r.standard_normal((1, 3, 8)), r.standard_normal((1, 5, 8)), np.eye(8)
    spec = AttentionSpec(2, 2, rope=None, mask=Mask(causal=False))
    return cross_attention_forward(x, ctx, AttentionWeights(w, w, w, w), spec=spec,
                                   mask=Mask(array=np.ones((3, 4), bool)))[0]


def causal_mask_negative():
    from scratchllm.attention import causal_mask
    return causal_mask(-3)


def causal_mask_float():
    from scratchllm.attention import causal_mask
    return causal_mask(2.5)


def sliding_window_zero():
    from scratchllm.attention import sliding_window_mask
    return sliding_window_mask(4, 0)  # no key at all: every row would be masked


def sink_mask_negative_sinks():
    from scratchllm.attention import attention_sink_mask
    return attention_sink_mask(4, 2, -1)


def block_sparse_zero_block():
    from scratchllm.attention import block_sparse_mask
    return block_sparse_mask(4, 0)


# ---------------------------------------------------------------------------- decoding states
def kvstate_float_batch():
    from scratchllm.attention import KVState
    return KVState(2.5, 1, 4, 8)


def kvstate_negative_len():
    from scratchllm.attention import KVState
    return KVState(1, 1, 4, -1)


def kvstate_int_keys():
    from scratchllm.attention import KVState
    s = KVState(1, 1, 4, 8)
    s.append(np.ones((1, 1, 1, 4), np.int64), np.ones((1, 1, 1, 4), np.int64))
    return s.kv()[0]


def rolling_state_float_window():
    from scratchllm.attention import RollingKVState
    return RollingKVState(2.5, 0, 1, 1, 4)


def _decode_layer():
    from scratchllm.attention import Attention
    from scratchllm.specs import AttentionSpec
    return Attention(8, AttentionSpec(2, 2), rng=rng(), dtype=np.float64)


def attention_decode_skipped_position():
    layer = _decode_layer()  # RoPE: a token at position 5 of an empty state is out of order
    return layer.decode(np.ones((1, 8)), layer.init_state(1, 8), 5)


def attention_decode_negative_position():
    layer = _decode_layer()
    return layer.decode(np.ones((1, 8)), layer.init_state(1, 8), -1)


def gla_step_state_wrong_shape():
    from scratchllm.linear_attention import gla_attention_step
    q = np.ones((1, 2, 3))
    return gla_attention_step(q, q, np.ones((1, 2, 5)), None, np.zeros((1, 2, 3, 4)))[0]


def linear_step_state_wrong_shape():
    from scratchllm.linear_attention import linear_attention_step
    q = np.ones((1, 2, 3))
    return linear_attention_step(q, q, np.ones((1, 2, 5)), np.zeros((1, 2, 4, 6)))[0]


# ---------------------------------------------------------------------------- tokenizer
def _tok():
    from scratchllm.tokenizer import Tokenizer
    vocab, merges = {b: bytes([b]) for b in range(256)}, [(b"h", b"e"), (b"he", b"l")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return Tokenizer(vocab, merges, ["<|endoftext|>"])


def tok_encode_bytes():
    return _tok().encode(b"hello")


def tok_encode_none():
    return _tok().encode(None)


def tok_encode_lone_surrogate():
    return _tok().encode("a\ud800b")  # right: U+FFFD's bytes EF BF BD, as tiktoken does


def tok_decode_float_ids():
    return _tok().decode([1.5])


def tok_decode_negative_id():
    return _tok().decode(np.array([-1]))


def tok_decode_nested():
    return _tok().decode([[104, 105]])


def tok_decode_huge_id():
    return _tok().decode(np.array([2 ** 40]))


def tok_encode_iterable_zero_chunk():
    return list(_tok().encode_iterable(["hello"], chunk_chars=0))


def tok_special_in_text():
    return _tok().encode("hi <|endoftext|>")  # disallowed by default


def train_bpe_vocab_below_bytes():
    from scratchllm.tokenizer import train_bpe
    return train_bpe(["hello"], 100, workers=1)


def train_bpe_float_vocab():
    from scratchllm.tokenizer import train_bpe
    return train_bpe(["hello"], 300.5, workers=1)


# ---------------------------------------------------------------------------- sizes
def config_heads_do_not_divide():
    from scratchllm.specs import from_flat
    return from_flat(d_model=10, n_heads=3, n_kv_heads=3)


def config_kv_heads_do_not_divide():
    from scratchllm.specs import from_flat
    return from_flat(d_model=24, n_heads=6, n_kv_heads=4)


def config_float_width():
    from scratchllm.specs import from_flat
    return from_flat(d_model=128.0)


def lm_too_big_for_memory():
    from scratchllm.lm import LM
    from scratchllm.specs import from_flat
    cfg = from_flat(vocab_size=2 ** 20, d_model=2 ** 16, n_layers=64, n_heads=64,
                    n_kv_heads=64, d_ff=2 ** 18)
    return LM(cfg, rng=rng())


def kvstate_too_big_for_memory():
    from scratchllm.attention import KVState
    return KVState(1024, 64, 128, 10 ** 9)


EXTRA_CASES = [
    (sdpa_int_mask, ERROR), (sdpa_mask_wrong_shape, ERROR), (sdpa_mask_list, ERROR),
    (sdpa_fully_masked_row, np.zeros((2, 4))), (cross_attention_mask_wrong_shape, ERROR),
    (causal_mask_negative, ERROR), (causal_mask_float, ERROR), (sliding_window_zero, ERROR),
    (sink_mask_negative_sinks, ERROR), (block_sparse_zero_block, ERROR),
    (kvstate_float_batch, ERROR), (kvstate_negative_len, ERROR), (kvstate_int_keys, ERROR),
    (rolling_state_float_window, ERROR), (attention_decode_skipped_position, ERROR),
    (attention_decode_negative_position, ERROR), (gla_step_state_wrong_shape, ERROR),
    (linear_step_state_wrong_shape, ERROR),
    (tok_encode_bytes, ERROR), (tok_encode_none, ERROR),
    (tok_encode_lone_surrogate, [97, 239, 191, 189, 98]),
    (tok_decode_float_ids, ERROR), (tok_decode_negative_id, ERROR), (tok_decode_nested, ERROR),
    (tok_decode_huge_id, ERROR), (tok_encode_iterable_zero_chunk, ERROR),
    (tok_special_in_text, ERROR), (train_bpe_vocab_below_bytes, ERROR),
    (train_bpe_float_vocab, ERROR),
    (config_heads_do_not_divide, ERROR), (config_kv_heads_do_not_divide, ERROR),
    (config_float_width, ERROR), (lm_too_big_for_memory, ERROR),
    (kvstate_too_big_for_memory, ERROR),
]
