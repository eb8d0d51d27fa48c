"""Token eviction under a fixed KV budget: after each decoding step every attention layer keeps
at most `budget` of its cached tokens, chosen by a policy:

    window     the last `budget` tokens (a plain sliding window: the first tokens go too)
    streaming  the first n_sink tokens plus the last budget - n_sink (StreamingLLM, Xiao et al.
               2023, arXiv 2309.17453: the sink tokens soak up attention no other token wants)
    h2o        the last budget // 2 tokens plus the heavy hitters: the tokens with the largest
               attention accumulated over every query so far, summed over the query heads
               of each KV head (H2O, Zhang et al. 2023, arXiv 2306.14048)
    snapkv     as h2o, but each token's votes come only from the last `window` queries (an
               observation window; SnapKV, Li et al. 2024, arXiv 2404.14469, votes once over
               the prompt; here the votes slide with decoding)
RoPE positions are the tokens' own, or (cache_positions, as StreamingLLM does) their indices
within the cache, keys held unrotated and rotated at each step. The next query attends the
kept tokens and itself: streaming with budget b is exactly attention_sink_mask(window =
b - n_sink + 1, n_sink) attention (a swa model's forward). kv_budget_cross_entropy feeds
held-out text token by token through such caches (teacher forcing) and returns the mean
next-token cross-entropy.

Glossary: B rows (in step), H heads, Hkv KV heads, G = H / Hkv, Dh head dim, n kept tokens.
"""
from dataclasses import replace

import numpy as np

from scratchllm.attention import make_rope, merge_heads, project_qkv_forward, rope_forward
from scratchllm.core.ops import linear_forward
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.serve.pool import attention_layers
from scratchllm.serve.rows import attention_weights

POLICIES = ("window", "streaming", "h2o", "snapkv")


class EvictingKV:
    """One layer's kept keys and values (B, Hkv, n, Dh), their positions (n,) and the
    attention each received (B, Hkv, n): all it has, or the last `window` queries' votes."""

    def __init__(self, policy, budget, n_sink=4, window=8, cache_positions=False):
        if policy not in POLICIES or budget < 2 or not 0 <= n_sink < budget:
            raise ValueError(f"EvictingKV: policy one of {POLICIES}, budget >= 2, 0 <= n_sink "
                             f"< budget; got {policy!r}, {budget}, {n_sink}")
        self.policy, self.budget, self.n_sink, self.window = policy, budget, n_sink, window
        self.cache_positions = cache_positions  # keys held unrotated, rotated by cache index
        self.k = self.v = self.pos = self.score = None
        self.votes = []  # snapkv: the last `window` steps' attention, each (B, Hkv, n_then)

    def append(self, k, v, position):
        """Add one token's k, v (B, Hkv, 1, Dh) at `position`."""
        if self.k is None:
            self.k, self.v, self.pos = k, v, np.array([position])
            self.score = np.zeros(k.shape[:2] + (1,))
            return
        self.k = np.concatenate([self.k, k], axis=2)  # (B, Hkv, n, Dh)
        self.v = np.concatenate([self.v, v], axis=2)
        self.pos = np.append(self.pos, position)  # (n,)
        self.score = np.concatenate([self.score, np.zeros(k.shape[:2] + (1,))], axis=2)

    def observe(self, p):
        """p (B, Hkv, G, n): this step's attention over the kept tokens."""
        got = p.sum(axis=2)  # (B, Hkv, n)
        if self.policy == "h2o":
            self.score += got
        elif self.policy == "snapkv":
            self.votes = (self.votes + [got])[-self.window:]
            n = got.shape[2]
            self.score = sum(np.pad(g, ((0, 0), (0, 0), (0, n - g.shape[2]))) for g in self.votes)

    def evict(self):
        """Drop tokens beyond the budget, by the policy (the same tokens for every row and
        head: the keep set is chosen on the attention summed over rows and heads)."""
        n, b = len(self.pos), self.budget
        if n <= b:
            return
        idx = np.arange(n)
        if self.policy == "window":
            keep = idx[n - b:]
        elif self.policy == "streaming":
            keep = np.concatenate([idx[:self.n_sink], idx[n - (b - self.n_sink):]])
        else:
            recent = b // 2
            mass = self.score.sum(axis=(0, 1))[:n - recent]  # (n - recent,) older tokens
            heavy = np.sort(np.argsort(-mass, kind="stable")[:b - recent])
            keep = np.concatenate([heavy, idx[n - recent:]])
        self.k, self.v = self.k[:, :, keep], self.v[:, :, keep]
        self.pos, self.score = self.pos[keep], self.score[:, :, keep]
        self.votes = [g[:, :, keep[keep < g.shape[2]]] for g in self.votes]


def _attend_evicting(a, attn, state, position):
    """a (B, D) at `position` -> the attention output (B, D) over the kept keys, then evict."""
    spec, w = attn.spec, attention_weights(attn)
    if state.cache_positions:  # StreamingLLM: positions within the cache, keys rotated late
        (q, k, v), _ = project_qkv_forward(a[:, None], w, spec=replace(spec, rope=None))
        state.append(k, v, position)
        n = len(state.pos)
        q = rope_forward(q, make_rope(spec.rope, attn.head_dim, np.array([n - 1]), n))[0]
        keys = rope_forward(state.k, make_rope(spec.rope, attn.head_dim, np.arange(n), n))[0]
    else:  # keys at their own positions
        rope = make_rope(spec.rope, attn.head_dim, np.array([position]), position + 1)
        (q, k, v), _ = project_qkv_forward(a[:, None], w, spec=spec, rope=rope)  # (B,H|Hkv,1,Dh)
        state.append(k, v, position)
        keys = state.k  # (B, Hkv, n, Dh)
    B, H, _, Dh = q.shape
    Hkv = state.k.shape[1]
    scale = Dh ** -0.5 if spec.scale is None else spec.scale
    qg = q.reshape(B, Hkv, H // Hkv, Dh)  # (B, Hkv, G, Dh)
    s = qg @ keys.swapaxes(-1, -2) * scale  # (B, Hkv, G, n)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)  # (B, Hkv, G, n)
    o = (p @ state.v).reshape(B, H, 1, Dh)  # (B, H, 1, Dh)
    state.observe(p)
    state.evict()
    y, _ = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, 1, D)
    return y[:, 0]


def kv_budget_cross_entropy(model, windows, policy, budget, *, n_sink=4, window=8,
                            cache_positions=False):
    """Mean next-token cross-entropy (nats/token) of windows (B, T + 1) ids fed token by token
    through caches that keep at most `budget` tokens per layer by `policy` (POLICIES); with
    cache_positions, RoPE positions are indices within the cache (StreamingLLM's), so
    positions stay below budget + 1 however long the text."""
    expect_int("kv_budget_cross_entropy", "windows", windows)
    expect_ndim("kv_budget_cross_entropy", "windows", windows, 2, "(B, T + 1)")
    attention_layers(model)
    if any(layer.mixer.spec.alibi or layer.mixer.spec.sinks or layer.mixer.spec.softcap
           or layer.mixer.spec.rope is None for layer in model.layers) or \
            model.cfg.positions != "none" or model.cfg.logit_softcap is not None:
        raise ValueError("kv_budget_cross_entropy: RoPE models without sink logits or caps")
    states = [EvictingKV(policy, budget, n_sink, window, cache_positions)
              for _ in model.layers]
    B, T = windows.shape[0], windows.shape[1] - 1
    total = 0.0
    for t in range(T):
        x, _ = model.embed.forward(windows[:, t:t + 1])  # (B, 1, D)
        if model.cfg.embed_scale:
            x = x * np.asarray(model.cfg.d_model ** 0.5, x.dtype)
        x = x[:, 0]  # (B, D)
        for layer, st in zip(model.layers, states):
            def attend(a, layer=layer, st=st):
                return _attend_evicting(a, layer.mixer, st, t), None
            x = layer.body(x, attend)[0]  # the Block's own residual body
        h, _ = model.norm.forward(x)
        z = (model.embed.attend(h) if model.head is None else model.head.forward(h))[0]
        z = z.astype(np.float64) - z.max(axis=1, keepdims=True)  # (B, V)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        total -= logp[np.arange(B), windows[:, t + 1]].sum()
    return total / (B * T)
