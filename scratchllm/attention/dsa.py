"""DeepSeek Sparse Attention inside MLA (DeepSeek-V3.2): the lightning indexer's projections
and its top-k choice for a whole sequence and for one decoded token, and the decoding state
that keeps the indexer's keys beside MLA's latents. indexer.py scores (query, key) pairs and
sparse.py attends to the chosen keys; mla.py calls both when its MLASpec has an indexer.

Per token x (D,), with the query latent qn = rmsnorm(x wq_a, q_norm) MLA already has:
    q_I = split_heads(qn @ idx_wq)           (HI, DI), its first dr numbers roped
    k_I = layernorm(x @ idx_wk; idx_k_norm, idx_k_norm_b)   (DI,), first dr roped
    w_I = (x @ idx_w) HI^-1/2 DI^-1/2        (HI,)  (transformers' weights_proj times
                                             n_heads^-1/2, and the softmax_scale DI^-1/2
                                             moved out of the relu: relu(a s) = s relu(a))
    I[t, s] = sum_j w_I[t, j] relu(q_I[t, j] . k_I[s]);   S_t = top_k keys s <= t by I
RoPE here is rotate-half over the first dr numbers, with MLA's frequencies and attention
factor (DeepSeek-V3.2's indexer uses the non-interleaved form even where MLA interleaves).
No backward: the choice is discrete, so the loss of the LM has no gradient in the indexer's
weights (transformers runs it under no_grad); the indexer trains by its own KL loss
(indexer.py's indexer_kl_loss pair), which a model would add beside its loss.

Reference: deepseek-ai/DeepSeek-V3.2-Exp inference/model.py class Indexer;
huggingface/transformers src/transformers/models/deepseek_v32/modeling_deepseek_v32.py
(DeepseekV32Indexer).
Glossary: B batch, T time, D model, HI indexer heads, DI indexer head dim, dr
qk_rope_head_dim, K top_k, t cached tokens.
"""
import numpy as np

from scratchllm.attention.indexer import lightning_indexer_forward
from scratchllm.attention.kv_state import LatentKVState
from scratchllm.attention.rope import rope_forward
from scratchllm.attention.sparse import topk_select
from scratchllm.core import ops
from scratchllm.core.norms import layernorm_forward
from scratchllm.core.validate import expect_shape

INDEXER_FIELDS = ("idx_wq", "idx_wk", "idx_k_norm", "idx_k_norm_b", "idx_w")


def check_indexer_weights(fn, D, w, spec):
    """w's indexer arrays are given exactly when spec.indexer is set, each of its shape."""
    given = [getattr(w, n) is not None for n in INDEXER_FIELDS]
    if given != [spec.indexer is not None] * len(INDEXER_FIELDS):
        raise ValueError(f"{fn}: give all of {list(INDEXER_FIELDS)} exactly when spec.indexer "
                         f"is set; spec.indexer={spec.indexer}, got "
                         f"{[n for n, g in zip(INDEXER_FIELDS, given) if g]}")
    if spec.indexer is None:
        return
    HI, DI, Dq = spec.indexer.n_heads, spec.indexer.head_dim, spec.q_lora_rank
    for name, shape, says in (("idx_wq", (Dq, HI * DI), "(Dq, HI*DI)"),
                              ("idx_wk", (D, DI), "(D, DI)"), ("idx_k_norm", (DI,), "(DI,)"),
                              ("idx_k_norm_b", (DI,), "(DI,)"), ("idx_w", (D, HI), "(D, HI)")):
        expect_shape(fn, name, getattr(w, name), shape, says)


def indexer_project(x, w, *, spec, rope):
    """The indexer's queries, keys and head weights of the tokens x.

    Inputs:  x (B, T, D); w an MLAWeights with wq_a, q_norm and the idx_* arrays; spec an
             MLASpec with an indexer; rope MLA's Rope over dr at the tokens' positions.
    Returns: q_I (B, T, HI, DI), k_I (B, T, DI), w_I (B, T, HI) (scales folded in).
    """
    B, T, _ = x.shape
    HI, DI, dr = spec.indexer.n_heads, spec.indexer.head_dim, spec.qk_rope_head_dim
    half = rope._replace(style="half")  # the indexer rotates halves, whatever MLA does
    qn = ops.rmsnorm_forward(x @ w.wq_a, w.q_norm, spec.norm_eps)[0]  # (B, T, Dq)
    q = (qn @ w.idx_wq).reshape(B, T, HI, DI)  # (B, T, HI, DI)
    q_rot = rope_forward(q[..., :dr].transpose(0, 2, 1, 3), half)[0]  # (B, HI, T, dr)
    q = np.concatenate([q_rot.transpose(0, 2, 1, 3), q[..., dr:]], axis=-1)  # (B, T, HI, DI)
    k = layernorm_forward(x @ w.idx_wk, w.idx_k_norm, w.idx_k_norm_b,
                          spec.indexer.norm_eps)[0]  # (B, T, DI)
    k_rot = rope_forward(k[:, None, :, :dr], half)[0][:, 0]  # (B, T, dr)
    k = np.concatenate([k_rot, k[..., dr:]], axis=-1)  # (B, T, DI)
    weights = (x @ w.idx_w) * np.asarray((HI * DI) ** -0.5, x.dtype)  # (B, T, HI)
    return q, k, weights


def indexer_select(x, w, *, spec, rope):
    """(indices (B, T, K) of each query's top_k causal keys, -1 padding: topk_select of the
    lightning indexer's scores; the indexer keys k_I (B, T, DI), which a decoding state
    keeps)."""
    q, k, weights = indexer_project(x, w, spec=spec, rope=rope)
    scores, _ = lightning_indexer_forward(q, k, weights)  # (B, T, T)
    return topk_select(scores, spec.indexer.top_k), k


def indexer_keep(x_t, w, state, *, spec, rope):
    """One decoded token: append its indexer key to `state` (an IndexedLatentState; call
    after the latent's append, so both hold the token) and return keep (B, t) bool, the
    top_k cached keys by the token's indexer scores (all of them while t <= top_k).
    x_t (B, 1, D); rope at the token's position."""
    q, k, weights = indexer_project(x_t, w, spec=spec, rope=rope)  # (B,1,HI,DI), (B,1,DI)
    state.append_index_key(k[:, 0])
    keys = state.index_keys[:, :state.length]  # (B, t, DI)
    scores = lightning_indexer_forward(q, keys, weights)[0][:, 0]  # (B, t)
    valid = np.arange(state.length)[None, :] < state.lengths[:, None]  # (B, t) own tokens
    scores = np.where(valid, scores, -np.inf)
    K = min(spec.indexer.top_k, state.length)
    top = np.argpartition(-scores, K - 1, axis=-1)[:, :K]  # (B, K)
    keep = np.zeros(scores.shape, bool)  # (B, t)
    np.put_along_axis(keep, top, True, axis=-1)
    return keep & valid


class IndexedLatentState(LatentKVState):
    """A LatentKVState that also keeps each token's indexer key k_I (DI numbers): the
    decoding state of an MLA layer with DeepSeek-V3.2's indexer."""

    def __init__(self, batch, max_len, kv_lora_rank, qk_rope_head_dim, index_head_dim,
                 dtype=np.float32):
        super().__init__(batch, max_len, kv_lora_rank, qk_rope_head_dim, dtype)
        self.index_keys = np.zeros((batch, max_len, index_head_dim), dtype)  # (B, L, DI)

    @property
    def nbytes(self):
        return self.latents.nbytes + self.index_keys.nbytes

    def append_index_key(self, k):
        """Store the indexer key k (B, DI) of the token the latents received last."""
        expect_shape("IndexedLatentState.append_index_key", "k", k,
                     (self.index_keys.shape[0], self.index_keys.shape[2]), "(B, DI)")
        rows = np.arange(k.shape[0])
        self.index_keys[rows, self.lengths - 1] = k
