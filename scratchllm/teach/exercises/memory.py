"""Ex. 1, 4 and 5 (the attention and SSM chapters): Llama 3 405B's KV bytes per token per
layer against MHA; a Mamba layer's fixed state against a
growing GQA cache, checked against the sizing module and the library's own decoding states;
repeat vs repeat_interleave and the mean-pool conversion of MHA to GQA (Ainslie et al. 2023,
arXiv 2305.13245 §2.1), checked with scratchllm.attention.gqa_forward.

Glossary: Hkv KV heads, Dh head dim, G = H / Hkv query heads per KV head, N state size,
Di = expand·D Mamba inner width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm import attention
from scratchllm.specs import AttentionSpec, MambaSpec
from scratchllm.ssm import Mamba
from scratchllm.teach import arch, rules, sizing
from scratchllm.teach.drills.bank import assert_close
from scratchllm.teach.exercises.core import exercise, rng as _rng


# ---------------------------------------------------------------------------- Ex. 4
class StateVsCache(NamedTuple):
    kv: int             # bytes of the GQA cache for `context` tokens, all layers
    state_chapter: int  # bytes of the Mamba states counted as D·N per layer
    state_full: int     # bytes with the expand factor and the conv state


LLAMA_3_8B = dict(d_model=4096, n_layers=32, n_kv_heads=8, head_dim=128,
                  mamba=MambaSpec(d_state=16, d_conv=4, expand=2), itemsize=2)


def _state_vs_sizing(fn):
    llama = arch.get("llama-3-8b")
    mamba = arch.with_mixer(llama, LLAMA_3_8B["mamba"])  # the same D and L, Mamba mixers
    m = rules.mamba_state_numbers(mamba)
    rows = []
    for T in rules.CONTEXTS:
        got = StateVsCache(*fn(T, **LLAMA_3_8B))
        want = StateVsCache(sizing.kv_cache(llama, T).bytes, 32 * m.chapter * 2,
                            sizing.kv_cache(mamba, T).bytes)
        if got != want:
            raise AssertionError(f"context {T:,}: got {got}, expected {want}")
        rows.append(f"{T:,}: {got.kv / got.state_chapter:,.0f}x")
    if StateVsCache(*fn(32, **LLAMA_3_8B)).kv != want.state_chapter:
        raise AssertionError("at 32 tokens the cache (2·8·128·32 per layer) equals D·N "
                             "= 4096·16")
    return "GQA cache / Mamba state (D·N) at " + ", ".join(rows)


def _state_vs_library(fn):
    rng, B, T = _rng(40), 1, 9
    sizes = dict(d_model=12, n_layers=1, n_kv_heads=1, head_dim=4,
                 mamba=MambaSpec(d_state=5, d_conv=3, expand=2), itemsize=8)
    att = attention.Attention(12, AttentionSpec(3, 1), rng=rng, dtype=np.float64)
    mamba = Mamba(12, MambaSpec(d_state=5, d_conv=3, expand=2), rng=rng, dtype=np.float64)
    kv_state, m_state = att.init_state(B, T), mamba.init_state(B, T)
    for t in range(T):  # decode T tokens: the cache fills, the state stays the same size
        x_t = rng.standard_normal((B, 12))
        att.decode(x_t, kv_state, t)
        mamba.decode(x_t, m_state)
    got = StateVsCache(*fn(T, **sizes))
    held = m_state.conv.nbytes + m_state.ssm.nbytes
    if kv_state.length != T or got.kv != kv_state.nbytes:
        raise AssertionError(f"KVState holds {kv_state.nbytes} B after {T} tokens, "
                             f"you predict {got.kv}")
    if got.state_full != held:
        raise AssertionError(f"MambaState holds {held} B (conv {m_state.conv.shape}, ssm "
                             f"{m_state.ssm.shape}), you predict {got.state_full}")
    return f"KVState {kv_state.nbytes} B after {T} tokens; MambaState {held} B"


@exercise(4, "a Mamba state against the GQA cache at 1k, 32k and 1M tokens",
          "07_selective_scan", '''
    Take a Llama-3-8B-sized model (D 4096, L 32, GQA with Hkv 8, Dh 128, bf16) and the same
    width and depth built from Mamba layers (N 16, expand 2, d_conv 4). How many bytes does
    one sequence's decoding memory take at 1k, 32k and 1M tokens, for the GQA cache and for
    the Mamba states, counting the state as the chapter does (D·N per layer) and in full?
    Write state_vs_cache(context, *, d_model, n_layers, n_kv_heads, head_dim, mamba,
    itemsize) -> (kv, state_chapter, state_full) in bytes, where mamba is the Mamba layer's
    scratchllm.specs.MambaSpec (its d_state, expand and d_conv).
''', '''
    The cache keeps K and V for every past token of every layer; the state keeps one
    N-vector per scanned channel, whatever the context, plus what the causal conv remembers.
''', '''
    GQA: 2·Hkv·Dh = 2·8·128 = 2,048 numbers per token per layer (4 KiB in bf16), so
    kv = T·L·2·Hkv·Dh·2 B = T·128 KiB: 128 MiB at 1k, 4 GiB at 32k, 128 GiB at 1M tokens.
    Mamba, chapter: D·N = 4096·16 = 65,536 numbers per layer ("~64k"), L·D·N·2 B = 4 MiB.
    Mamba, full: the scan runs on Di = expand·D = 8192 channels (×2) and the conv keeps its
    last d_conv - 1 = 3 inputs: Di·N + 3·Di = 155,648 numbers per layer, 9.5 MiB in all.
    Neither grows with T: the cache passes the chapter's state at T = 32 tokens
    (2·8·128·T = 4096·16) and is 32x it at 1k, 1,024x at 32k, 32,768x at 1M.
    The library agrees: a KVState holds B·2·Hkv·Dh·max_len·itemsize bytes, a MambaState
    (B, d_conv-1, Di) + (B, Di, N), constant while decoding.
''', '''
    def state_vs_cache(context, *, d_model, n_layers, n_kv_heads, head_dim, mamba, itemsize):
        """One sequence of `context` tokens; mamba: a MambaSpec (d_state N, expand, d_conv).
        Return (kv, state_chapter, state_full) in bytes: the GQA cache of all layers; the
        Mamba states as D·N per layer; and in full, with the expand factor (Di = expand·D
        channels) and the conv state (d_conv - 1 inputs)."""
''', [
    ("Llama-3-8B size at 1k / 32k / 1M equals scratchllm.teach.sizing", _state_vs_sizing),
    ("the library's KVState and MambaState hold those bytes", _state_vs_library),
])
def _state_vs_cache(context, *, d_model, n_layers, n_kv_heads, head_dim, mamba, itemsize):
    Di, N = mamba.expand * d_model, mamba.d_state
    kv = context * n_layers * 2 * n_kv_heads * head_dim * itemsize
    return StateVsCache(kv, n_layers * d_model * N * itemsize,
                        n_layers * (Di * N + (mamba.d_conv - 1) * Di) * itemsize)


# ---------------------------------------------------------------------------- Ex. 5
def _gqa_weights(rng, D=10, H=6, Dh=3):
    return (rng.standard_normal((2, 5, D)), rng.standard_normal((D, H * Dh)),
            rng.standard_normal((H * Dh, D)))


def _heads(w, Dh):
    return w.reshape(w.shape[0], -1, Dh)  # (D, heads, Dh)


def _gqa_forward(x, wq, wk, wv, wo, n_heads, n_kv_heads):
    """y of scratchllm's gqa_forward without RoPE, head dim from wq (D, H·Dh)."""
    spec = AttentionSpec(n_heads, n_kv_heads, head_dim=wq.shape[1] // n_heads, rope=None)
    return attention.gqa_forward(x, attention.AttentionWeights(wq, wk, wv, wo), spec=spec)[0]


def _pool_by_loop(fn):
    w, H, Hkv, Dh = _rng(50).standard_normal((10, 6 * 3)), 6, 2, 3
    G = H // Hkv
    want = np.concatenate([np.mean([_heads(w, Dh)[:, j * G + i] for i in range(G)], axis=0)
                           for j in range(Hkv)], axis=1)  # (D, Hkv·Dh)
    return assert_close(fn(w, H, Hkv), want, tol=1e-12, what="pooled heads")


def _pool_lossless(fn):
    rng, H, Hkv, Dh = _rng(51), 6, 2, 3
    x, wq, wo = _gqa_weights(rng)
    base_k, base_v = rng.standard_normal((10, Hkv, Dh)), rng.standard_normal((10, Hkv, Dh))
    # an MHA whose heads are equal within each group (head h = KV head h // G)
    wk, wv = (np.repeat(b, H // Hkv, axis=1).reshape(10, H * Dh) for b in (base_k, base_v))
    mha = _gqa_forward(x, wq, wk, wv, wo, H, H)
    gqa = _gqa_forward(x, wq, fn(wk, H, Hkv), fn(wv, H, Hkv), wo, H, Hkv)
    return assert_close(gqa, mha, tol=1e-12, what="GQA of the pooled weights vs the MHA")


def _repeat_not_tile(fn):
    rng, H, Hkv, Dh = _rng(52), 6, 2, 3
    G = H // Hkv
    x, wq, wo = _gqa_weights(rng)
    wk, wv = rng.standard_normal((10, H * Dh)), rng.standard_normal((10, H * Dh))
    gqa = _gqa_forward(x, wq, fn(wk, H, Hkv), fn(wv, H, Hkv), wo, H, Hkv)

    def group_means(w):  # (D, Hkv, Dh), by a loop over the groups
        return np.stack([_heads(w, Dh)[:, j * G:(j + 1) * G].mean(axis=1)
                         for j in range(Hkv)], axis=1)

    def mha(expand):  # an MHA whose head h holds the mean of a group, expanded by `expand`
        wk_h, wv_h = (expand(group_means(w)).reshape(10, H * Dh) for w in (wk, wv))
        return _gqa_forward(x, wq, wk_h, wv_h, wo, H, H)

    detail = assert_close(gqa, mha(lambda m: np.repeat(m, G, axis=1)), tol=1e-12,
                          what="GQA vs MHA with repeat_interleave-expanded group means")
    if np.allclose(mha(lambda m: np.tile(m, (1, G, 1))), gqa):
        raise AssertionError("np.tile (torch .repeat) should pair heads with the wrong KV heads")
    return detail + "; np.tile differs"


@exercise(5, "repeat vs repeat_interleave, and the mean-pool conversion",
          "03_attention_gqa_kv_cache", '''
    In GQA query head h reads KV head h // G (G = H / Hkv). (a) To run GQA as MHA, the Hkv KV
    heads are expanded to H: is that np.repeat(kv, G, axis=1) (torch repeat_interleave) or
    np.tile (torch .repeat)? (b) Ainslie et al. (arXiv 2305.13245) turn an MHA checkpoint
    into GQA by mean-pooling the K and V heads of each group. Write
    mha_to_gqa(w, n_heads, n_kv_heads): w (D, H·Dh) is wk or wv of the MHA; return the
    (D, Hkv·Dh) pooled weight, with the groups the library's gqa_forward uses.
''', '''
    Write the head index of query head h as h = j·G + i (KV head j, i-th in the group).
    Which expansion sends KV head j to the heads j·G .. j·G + G - 1?
''', '''
    (a) repeat_interleave: np.repeat(kv, G, axis=1) gives the heads [k0, k0, k1, k1, ...],
    so expanded head h is KV head h // G, the grouping of gqa_forward and repeat_kv_forward.
    np.tile / torch .repeat gives [k0, k1, k0, k1, ...] = KV head h % Hkv: a different
    model. (HF transformers' repeat_kv, an expand + reshape, is documented as the
    equivalent of torch.repeat_interleave(x, dim=1, repeats=n_rep).)
    (b) Group j is the consecutive query heads j·G .. j·G + G - 1, so its KV head is
    w_kv[:, j] = (1/G) Σ_i w[:, j·G + i]:  w.reshape(D, Hkv, G, Dh).mean(axis=2).
    Pooling heads j, j + Hkv, j + 2·Hkv, ... (the tile order) averages heads that are not
    in one group. The conversion is exact when the heads of each group are already equal and
    a starting point otherwise (the paper uptrains for 5% of the original steps).
''', '''
    def mha_to_gqa(w, n_heads, n_kv_heads):
        """w (D, H·Dh): an MHA's wk or wv, head h in columns h·Dh .. h·Dh + Dh - 1.
        Return (D, Hkv·Dh): the mean of each group's heads (query head h reads KV head
        h // (H / Hkv))."""
''', [
    ("equals the mean over each group's heads, by a loop", _pool_by_loop),
    ("lossless on an MHA whose group heads are equal (scratchllm gqa_forward)", _pool_lossless),
    ("GQA == MHA with repeat_interleave-expanded heads, not tiled ones", _repeat_not_tile),
])
def _mha_to_gqa(w, n_heads, n_kv_heads):
    D, HDh = w.shape
    Dh, G = HDh // n_heads, n_heads // n_kv_heads
    return w.reshape(D, n_kv_heads, G, Dh).mean(axis=2).reshape(D, n_kv_heads * Dh)


# ---------------------------------------------------------------------------- Ex. 1
class KVPerLayer(NamedTuple):
    gqa: int  # bytes of K and V per token per layer with n_kv_heads KV heads
    mha: int  # the same with one KV head per query head


def _kv_405b(fn):
    cfg = arch.get("llama-3.1-405b")
    spec = sizing.attention_spec(cfg)
    got = KVPerLayer(*fn(n_heads=spec.n_heads, n_kv_heads=spec.n_kv_heads,
                         head_dim=spec.dh(cfg.d_model), itemsize=2))
    want = KVPerLayer(sizing.kv_cache(cfg, 1).bytes_per_layer,
                      2 * sizing.kv_cache_elements("mha", n_heads=spec.n_heads,
                                                   head_dim=spec.dh(cfg.d_model)))
    if got != want or want.gqa != 4096:
        raise AssertionError(f"Llama 3.1 405B: got {got}, expected {want} (4 KiB with GQA)")
    return f"{got.gqa:,} B with GQA, {got.mha:,} B as MHA: {got.mha // got.gqa}x"


def _kv_library(fn):
    rng, (H, Dh, T) = _rng(60), (4, 4, 5)
    for Hkv in (1, 2, 4):
        att = attention.Attention(12, AttentionSpec(H, Hkv, head_dim=Dh), rng=rng,
                                  dtype=np.float64)
        state = att.init_state(1, T)
        for t in range(T):
            att.decode(rng.standard_normal((1, 12)), state, t)
        got = KVPerLayer(*fn(n_heads=H, n_kv_heads=Hkv, head_dim=Dh, itemsize=8))
        if got.gqa * T != state.nbytes:
            raise AssertionError(f"Hkv {Hkv}: a KVState holds {state.nbytes} B after {T} "
                                 f"tokens, you predict {got.gqa} per token")
        if got.mha != got.gqa * H // Hkv:
            raise AssertionError(f"Hkv {Hkv}: MHA keeps H / Hkv = {H // Hkv}x the GQA bytes, "
                                 f"you predict {got.mha} against {got.gqa}")
    return f"KVState bytes for Hkv 1, 2, 4 of H {H}"


@exercise(1, "Llama 3 405B's KV cache per token per layer, against MHA",
          "03_attention_gqa_kv_cache", '''
    Llama 3.1 405B has 128 query heads of dimension 128 and 8 KV heads, and caches in bf16.
    How many bytes of K and V does one token cost in one layer, and how many would it cost if
    every query head had its own K and V head (MHA)? Write kv_per_token_layer(*, n_heads,
    n_kv_heads, head_dim, itemsize) -> (gqa, mha) in bytes.
''', '''
    A token leaves one K vector and one V vector per KV head in every layer; the query heads
    only read them.
''', '''
    GQA: 2·Hkv·Dh numbers = 2·8·128 = 2,048, times 2 B = 4,096 B = 4 KiB per token per layer.
    MHA: 2·H·Dh = 2·128·128 = 32,768 numbers = 64 KiB: H / Hkv = 16x more. Over 126 layers
    that is 504 KiB against 7.9 MiB per token, so at 128k tokens one sequence holds 63 GiB of
    GQA cache where MHA would need 1 TiB. The library's KVState holds exactly
    2·Hkv·Dh·itemsize bytes per token and layer.
''', '''
    def kv_per_token_layer(*, n_heads, n_kv_heads, head_dim, itemsize):
        """Return (gqa, mha): bytes of K and V per token per layer with n_kv_heads KV heads,
        and with one KV head per query head."""
''', [
    ("Llama 3.1 405B: 4 KiB, 16x against MHA (scratchllm.teach.sizing)", _kv_405b),
    ("the library's KVState holds those bytes", _kv_library),
])
def _kv_per_token_layer(*, n_heads, n_kv_heads, head_dim, itemsize):
    return KVPerLayer(2 * n_kv_heads * head_dim * itemsize, 2 * n_heads * head_dim * itemsize)
