"""Multi-token prediction (DeepSeek-AI 2024, DeepSeek-V3, arXiv 2412.19437, sec. 2.2): D modules
after the trunk, module k predicting the token k + 1 places ahead, each keeping the causal chain
(module k reads module k - 1's hidden states).

With tokens t_1 .. t_T (ids) and t_2 .. t_{T+1} (targets), h^0 the trunk's last hidden states
(before its final norm), for k = 1 .. D and positions i = 1 .. T - k:
    h'_i^k = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h_i^{k-1})]     M_k (2D -> D); the embedding
                                                                 first, as DeepSeek-V3's own
                                                                 code concatenates (the paper
                                                                 writes h first)
    h^k_{1:T-k} = TRM_k(h'^k_{1:T-k})                            one Block (the trunk's last
                                                                 LayerSpec), causal over i
    P^k_{i+k+1} = OutHead(RMSNorm_k(h_i^k))                      the trunk's head, shared; a
                                                                 norm of its own per module
    L^k = CE(P^k, t_{k+2 .. T+1}),   L_MTP = (lambda / D) sum_k L^k   (cfg.mtp: an MTPSpec
                                                                      of depth D, weight lambda)
Emb and OutHead are the LM's own (their gradients add to the trunk's); Emb is the token
embedding alone (times sqrt(D) with embed_scale), positions are the Block's (RoPE from 0).

Backward, module by module from k = D down to 1 (the chain reversed):
    dh^k   = RMSNorm_k^T(OutHead^T(dP^k)) (+ dh^k from module k + 1 on its first T-k-1 rows)
    dh'^k  = TRM_k^T(dh^k);   [de; dh] = M_k^T dh'^k
    dEmb  += enorm^T(de) scattered at t_{k+1 .. T};   dh^{k-1}_{1:T-k} += hnorm^T(dh)
and dh^0 joins the trunk's gradient at its last hidden states (LM.backward's dlast). Each
step is a smaller Module's backward; nothing is copied.

Glossary: B batch, T time, D model width (and depth count where the text says "D modules"),
V vocabulary, n = T - k the positions module k predicts.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused
from scratchllm.core.nn import Linear, Module
from scratchllm.lm.block import Block
from scratchllm.lm.mixers import make_norm


class DepthCache(NamedTuple):
    emb: tuple     # the token embedding's lookup of t_{k+1 .. T}
    enorm: tuple
    hnorm: tuple
    proj: tuple    # M_k's
    block: tuple   # TRM_k's BlockCache
    norm: tuple    # RMSNorm_k's
    head: tuple    # LM.output_forward's
    ce: tuple      # the cross-entropy's cache


class MTPCache(NamedTuple):
    depths: list   # DepthCache per module, k = 1 .. D
    T: int
    losses: list   # L^k per module (floats)


class MTPModule(Module):
    """Module k: enorm, hnorm, proj (2D -> D), block (one Block of `layer`), norm."""

    def __init__(self, d_model, layer, norm, *, rng, dtype=np.float32):
        self.enorm = make_norm(d_model, norm, dtype)
        self.hnorm = make_norm(d_model, norm, dtype)
        self.proj = Linear(2 * d_model, d_model, rng=rng, dtype=dtype)
        self.block = Block(d_model, layer, rng=rng, dtype=dtype)
        self.norm = make_norm(d_model, norm, dtype)


class MTP(Module):
    """The D modules of a ModelConfig's MTPSpec of depth D (Params: depths.{k-1}.*)."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        self.cfg = cfg
        self.depths = [MTPModule(cfg.d_model, cfg.layers[-1], cfg.norm, rng=rng, dtype=dtype)
                        for _ in range(cfg.mtp.depth)]

    def step(self, lm, k, h_prev, ids_ahead, run_block=None):
        """Module k (1-based) on h^{k-1} (B, n, D) and the tokens one place ahead (B, n) ->
        (h^k (B, n, D), logits (B, n, V), DepthCache without ce). run_block(block, a) ->
        (h, cache): how to run the module's Block (default its forward from position 0; a
        serving cache's call when drafting)."""
        mod = self.depths[k - 1]
        e, c_emb = lm.embed.forward(ids_ahead)  # (B, n, D)
        if self.cfg.embed_scale:
            e = e * np.asarray(self.cfg.d_model ** 0.5, e.dtype)
        en, c_en = mod.enorm.forward(e)  # (B, n, D)
        hn, c_hn = mod.hnorm.forward(h_prev)  # (B, n, D)
        a, c_proj = mod.proj.forward(np.concatenate([en, hn], axis=-1))  # (B, n, D)
        h, c_block = mod.block.forward(a) if run_block is None else run_block(mod.block, a)
        z, c_norm = mod.norm.forward(h)  # (B, n, D)
        logits, c_head = lm.output_forward(z)  # (B, n, V)
        return h, logits, DepthCache(c_emb, c_en, c_hn, c_proj, c_block, c_norm, c_head, None)

    def loss(self, lm, h0, ids, targets):
        """L_MTP = (weight / D) sum_k CE(P^k, targets[:, k:]) on the trunk's last hidden
        states h0 (B, T, D) -> (L_MTP float, MTPCache). Needs T > D."""
        T, D = ids.shape[1], len(self.depths)
        if T <= D:
            raise ValueError(f"MTP: {D} modules predict up to {D + 1} tokens ahead; the "
                             f"sequence has T={T} (need T > {D})")
        h, caches, losses = h0, [], []
        for k in range(1, D + 1):
            n = T - k
            h, logits, c = self.step(lm, k, h[:, :n], ids[:, k:])  # (B, n, D), (B, n, V)
            ce, c_ce = fused.CROSS_ENTROPY.forward(logits, targets[:, k:])
            caches.append(c._replace(ce=c_ce))
            losses.append(float(ce))
        return self.cfg.mtp.weight / D * sum(losses), MTPCache(caches, T, losses)

    def loss_backward(self, lm, dloss, cache):
        """The gradient of dloss * L_MTP: Params (+=, the LM's embedding and head included) ->
        dh0 (B, T, D), the gradient on the trunk's last hidden states."""
        D = len(self.depths)
        dh_next = None  # dh^k from module k + 1, (B, T-k-1, D)
        for k in range(D, 0, -1):
            mod, c = self.depths[k - 1], cache.depths[k - 1]
            w = np.asarray(dloss * self.cfg.mtp.weight / D, lm.dtype)
            dlogits = fused.CROSS_ENTROPY.backward(w, c.ce)["logits"]  # fwd: L^k = CE(P^k)
            dz = lm.output_backward(dlogits, c.head)  # fwd: P^k = OutHead(z)
            dh = mod.norm.backward(dz, c.norm)  # (B, n, D)   fwd: z = RMSNorm_k(h^k)
            if dh_next is not None:  # fwd: module k + 1 reads h^k[:, :n-1]
                dh = dh.copy()
                dh[:, :dh_next.shape[1]] += dh_next
            da = mod.block.backward(dh, c.block, 0.0)  # fwd: h^k = TRM_k(h'^k) (no aux term)
            dcat = mod.proj.backward(da, c.proj)  # (B, n, 2D)   fwd: h' = M_k [en; hn]
            Dm = dcat.shape[-1] // 2
            de = mod.enorm.backward(dcat[..., :Dm], c.enorm)  # fwd: en = enorm(e)
            if self.cfg.embed_scale:
                de = de * np.asarray(self.cfg.d_model ** 0.5, de.dtype)  # fwd: e = E[t] sqrt(D)
            lm.embed.backward(de, c.emb)  # fwd: e = E[t_{k+1 .. T}]
            dh_next = mod.hnorm.backward(dcat[..., Dm:], c.hnorm)  # fwd: hn = hnorm(h^{k-1})
        B, n, Dm = dh_next.shape
        dh0 = np.zeros((B, cache.T, Dm), dh_next.dtype)
        dh0[:, :n] = dh_next  # fwd: module 1 reads h^0[:, :T-1]
        return dh0
