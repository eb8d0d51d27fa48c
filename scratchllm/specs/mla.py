"""The specs of DeepSeek's attentions: multi-head latent attention (MLA), the lightning
indexer of its sparse attention (DSA) and native sparse attention's sizes (NSA). Frozen, plain
Python, like specs/attention.py, whose RopeSpec and Mask they use.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, instance, positive_int, real
from scratchllm.specs.attention import Mask, RopeSpec


@dataclass(frozen=True)
class IndexerSpec:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2-Exp): n_heads HI small
    heads of head_dim DI score every (query, key) pair, I = sum_j w_j relu(q_j . k DI^-1/2),
    and each query attends only to its top_k causal keys by I. The indexer's key is a
    LayerNorm (eps norm_eps, gain and bias) of x Wk; RoPE (rotate-half) turns its first dr
    numbers and those of its queries, read from MLA's query latent."""
    n_heads: int = 4
    head_dim: int = 32
    top_k: int = 16
    norm_eps: float = 1e-6

    def __post_init__(self):
        for name in ("n_heads", "head_dim", "top_k"):
            positive_int(self, name)
        real(self, "norm_eps", 0, open_low=True)

    def n_params(self, d_model, q_lora_rank):
        """wq (Dq, HI*DI), wk (D, DI), the key norm's gain and bias, the head weights (D, HI)."""
        HI, DI = self.n_heads, self.head_dim
        return q_lora_rank * HI * DI + d_model * DI + 2 * DI + d_model * HI


@dataclass(frozen=True)
class MLASpec:
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434), DeepSeek-V3's names.

    q_lora_rank Dq (0 = a plain wq), kv_lora_rank Dc (the cached latent), qk_nope_head_dim dn,
    qk_rope_head_dim dr (one shared rope key per token), v_head_dim dv; norm_eps of the latent
    RMSNorms; rope: its RoPE (YaRN's mscale enters the softmax scale); mask: causal only;
    indexer: an IndexerSpec (DeepSeek-V3.2's sparse attention: each query attends to the
    top_k keys its lightning indexer picks; needs q_lora_rank > 0), or None."""
    n_heads: int = 4
    q_lora_rank: int = 0
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    norm_eps: float = 1e-6
    rope: RopeSpec = RopeSpec()
    mask: Mask = Mask()
    indexer: IndexerSpec = None

    def __post_init__(self):
        instance(self, "indexer", IndexerSpec, none_ok=True)
        if self.indexer is not None and (not self.q_lora_rank or self.indexer.head_dim
                                         < self.qk_rope_head_dim):
            fail(self, f"indexer reads the query latent and ropes its first qk_rope_head_dim="
                       f"{self.qk_rope_head_dim} numbers: it needs q_lora_rank > 0 (got "
                       f"{self.q_lora_rank}) and head_dim >= qk_rope_head_dim (got "
                       f"{self.indexer.head_dim})", "indexer")
        for name in ("n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                     "v_head_dim"):
            positive_int(self, name)
        positive_int(self, "q_lora_rank", low=0)
        real(self, "norm_eps", 0, open_low=True)
        instance(self, "rope", RopeSpec)
        instance(self, "mask", Mask)
        if self.qk_rope_head_dim % 2:
            fail(self, f"RoPE rotates pairs: qk_rope_head_dim={self.qk_rope_head_dim} must be "
                       f"even")
        if not self.mask.is_plain_causal:
            fail(self, f"MLA attends with the plain causal mask, got {self.mask!r}")
        if self.rope.partial != 1:
            fail(self, f"MLA turns all qk_rope_head_dim numbers; rope.partial="
                       f"{self.rope.partial}", "rope")

    def n_params(self, d_model):
        """wq (or wq_a, q_norm, wq_b), wkv_a, kv_norm, wkv_b, wo."""
        D, H = d_model, self.n_heads
        Dq, Dc, dn, dr, dv = (self.q_lora_rank, self.kv_lora_rank, self.qk_nope_head_dim,
                              self.qk_rope_head_dim, self.v_head_dim)
        q = D * H * (dn + dr) if Dq == 0 else D * Dq + Dq + Dq * H * (dn + dr)
        indexer = 0 if self.indexer is None else self.indexer.n_params(D, Dq)
        return q + D * (Dc + dr) + Dc + Dc * H * (dn + dv) + H * dv * D + indexer

    def kv_per_token(self, d_model):
        """The absorbed form caches the latent and the shared rope key: Dc + dr numbers."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class NSASpec:
    """Native sparse attention's sizes (Yuan et al. 2025, arXiv 2502.11089 §3): block l (the
    compression and the selection blocks), stride d of the compression blocks (d divides l;
    None = l, no overlap; the paper uses l = 32, d = 16), n_select blocks per query (its own
    included), window w of the sliding branch."""
    block: int = 32
    stride: int = None
    n_select: int = 16
    window: int = 512

    def __post_init__(self):
        positive_int(self, "block")
        positive_int(self, "stride", none_ok=True)
        positive_int(self, "n_select")
        positive_int(self, "window")
        if self.stride is not None and self.stride > self.block:
            fail(self, f"stride={self.stride} must be at most block={self.block} (overlapping "
                       f"or adjacent compression blocks)", "stride")
        if self.stride is not None and self.block % self.stride:
            fail(self, f"stride={self.stride} must divide block={self.block} (the selection's "
                       f"eq. 9 sums block / stride compressed blocks)", "stride")
