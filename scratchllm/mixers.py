"""Which Module a ModelConfig puts in each block: the token mixer (GQA / sliding-window GQA /
MLA attention, or a Mamba block) and the FFN (SwiGLU or MoE). No math here: the Modules come
from attention.py, mla.py, scan.py, moe.py and nn.py; this file only maps config fields to
their constructor arguments.

Every mixer offers forward(x) -> (y, cache), backward(dy, cache) -> dx, and for decoding
new_cache(batch, max_len) -> state and decode(x_t, state, position) -> y_t.
"""
from scratchllm.attention import Attention, attention_sink_mask
from scratchllm.kv_cache import KVCache, RollingKVCache
from scratchllm.mla import MLA
from scratchllm.moe import MoE
from scratchllm.nn import SwiGLU


class GQA(Attention):
    """attention.Attention plus what a model needs: attention sinks beside the sliding window
    (the mask is built per length) and new_cache for decoding (KVCache or RollingKVCache)."""

    def __init__(self, d_model, n_heads, n_kv_heads, *, window=None, n_sink=0, rng, **kwargs):
        super().__init__(d_model, n_heads, n_kv_heads, rng=rng, window=window,
                         mask="causal" if window is None else "sliding", **kwargs)
        self.n_sink = n_sink

    def forward(self, x, positions=None):
        if self.n_sink:
            self.mask = attention_sink_mask(x.shape[1], self.window, self.n_sink)  # (T, T)
        return super().forward(x, positions)

    def new_cache(self, batch, max_len):
        dt = self.wq.data.dtype
        if self.window is None:
            return KVCache(batch, self.n_kv_heads, self.head_dim, max_len, dt)
        return RollingKVCache(self.window, self.n_sink, batch, self.n_kv_heads, self.head_dim,
                              dt)


def make_mixer(cfg, kind, *, rng, dtype):
    """The token mixer of a layer of kind "A" (attention) or "M" (Mamba)."""
    rope = dict(rope_base=cfg.rope_base, rope_scaling=cfg.rope_scaling,
                rope_style=cfg.rope_style, rng=rng, dtype=dtype)
    if kind == "M":
        from scratchllm.scan import Mamba
        return Mamba(cfg.d_model, d_state=cfg.d_state, d_conv=cfg.d_conv, expand=cfg.expand,
                     rng=rng, dtype=dtype)
    if cfg.attention == "mla":
        return MLA(cfg.d_model, cfg.n_heads, kv_lora_rank=cfg.kv_lora_rank,
                   qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
                   v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank, eps=cfg.norm_eps,
                   **rope)
    return GQA(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, window=cfg.window, n_sink=cfg.n_sink,
               **rope)


def make_ffn(cfg, moe, *, rng, dtype):
    """SwiGLU, or (moe=True) the MoE layer with its router options."""
    if not moe:
        return SwiGLU(cfg.d_model, cfg.d_ff, rng=rng, dtype=dtype)
    return MoE(cfg.d_model, cfg.d_ff, cfg.n_experts, cfg.top_k,
               capacity_factor=cfg.capacity_factor, d_shared=cfg.n_shared * cfg.d_ff,
               score=cfg.score, rng=rng, dtype=dtype)
