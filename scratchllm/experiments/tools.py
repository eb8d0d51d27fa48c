"""Tools to look inside a language model (any scratchllm.lm.LM, a loaded Hugging Face
checkpoint included): the logit lens, direct logit attribution, attention patterns, head
scores, steering vectors added to the residual stream, and the state propagation of an early
exit (propagate_state). Forward only; nothing here changes a weight.

The residual stream of a pre-norm model is a sum (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits", transformer-circuits.pub/2021/framework):
    x_L = x_0 + sum_l (attn_l + ffn_l),   attn_l = sum_h o_lh @ Wo[h rows] (+ bo)
    logits = norm(x_L) @ W_U
Logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens"): read every x_l through
the final norm and the unembedding, logits_l = W_U^T norm(x_l); at l = L these are the logits.
Direct logit attribution: freeze the final norm's per-position scale (RMSNorm: r = 1/rms(x_L);
LayerNorm: its centring is linear, rstd frozen), so that
    logit_t = sum_c (center(c) * r * gain) @ W_U[:, t]  (+ norm bias @ W_U[:, t] + head bias)
over the components c of x_L: the embedding, each head of each attention layer, the output
bias, each FFN (each non-attention mixer as one component).
Attention patterns: softmax(q k^T scale + mask/ALiBi/T5 bias (+ sinks), soft-capped) per head,
read as sdpa's output with the identity as values (o = P @ I = P): the forward's own pattern.
Head scores per head, averaged over query positions (Olsson et al. 2022, "In-context Learning
and Induction Heads", arXiv 2209.11895):
    previous_token  P[t, t-1]                      (t >= 1)
    induction       sum of P[t, j] over j < t with ids[j-1] == ids[t]  (queries with such j)
    sink            P[t, 0]                        (t >= 1; Xiao et al. 2023, arXiv 2309.17453)

Glossary: B batch, T time, D model width, V vocabulary, L layers, H heads.
"""
import numpy as np

from scratchllm.attention import (Attention, AttentionWeights, alibi_bias, alibi_slopes,
                                  make_rope, merge_heads, output_gate_forward,
                                  project_qkv_forward, relative_bias_forward, sdpa_forward,
                                  split_heads)
from scratchllm.core import RMSNorm
from scratchllm.core.validate import expect_int, expect_ndim


def _check_ids(fn, ids):
    expect_int(fn, "ids", ids)
    expect_ndim(fn, "ids", ids, 2, "(B, T)")


def logit_lens(model, ids):
    """The residual stream after every layer read through the final norm and the head.

    Inputs:  model an LM; ids (B, T) ints.
    Returns: logits (L + 1, B, T, V): row 0 reads the embedding, row l the output of block l;
             row L is the model's own logits.
    """
    _check_ids("logit_lens", ids)
    return np.stack([model.unembed(x) for x in model.residual_stream(ids)])


# ---------------------------------------------------------------------------- attention
def _weights(mixer):
    params = (getattr(mixer, name) for name in AttentionWeights._fields)
    return AttentionWeights(*(None if p is None else p.data for p in params))


def _attend(mixer, a, values):
    """The attention of an Attention mixer on its input a (B, T, D) with the given values:
    (B, H, T, Dv). values None: the layer's own v; else an array (B, Hkv, T, Dv)."""
    spec, w = mixer.spec, _weights(mixer)
    (q, k, v), _ = project_qkv_forward(a, w, spec=spec)  # (B, H|Hkv, T, Dh)
    T = a.shape[1]
    bias = None
    if spec.alibi:
        bias = alibi_bias(alibi_slopes(spec.n_heads).astype(a.dtype), T, T)  # (H, T, T)
    if spec.relative is not None:  # T5's bucketed relative bias (1, H, T, T)
        bias = relative_bias_forward(w.rel_table, spec=spec.relative, Tq=T, Tk=T)[0]
    v = v if values is None else values.astype(q.dtype)
    o = sdpa_forward(q, k, v, spec.mask, spec.scale, bias=bias, sinks=w.sinks,
                     softcap=spec.softcap)[0]  # (B, H, T, Dv)
    if spec.output_gate:  # gated attention: each head's output times its gate
        o = split_heads(output_gate_forward(a, merge_heads(o), w.wg, w.bg)[0], spec.n_heads)
    return o


def _head_parts(mixer, a):
    """Per head h the residual contribution o_h @ Wo[h rows] (H, B, T, D), and bo or None."""
    o = _attend(mixer, a, None)  # (B, H, T, Dv)
    H, Dv = o.shape[1], o.shape[3]
    wo = mixer.wo.data.reshape(H, Dv, -1)  # (H, Dv, D)
    parts = np.einsum("bhtv,hvd->hbtd", o, wo)  # (H, B, T, D)
    return parts, (None if mixer.bo is None else mixer.bo.data)


def attention_patterns(model, ids):
    """The attention probabilities of every attention (GQA/MHA/MQA) layer on ids.

    Inputs:  model an LM; ids (B, T) ints.
    Returns: {layer index: P (B, H, T, T)}, P[b, h, t, j] the weight of query t on key j
             (rows sum to 1, or less with sink logits); other mixers are left out.
    """
    _check_ids("attention_patterns", ids)
    xs = model.residual_stream(ids)
    B, T = ids.shape
    out = {}
    for i, layer in enumerate(model.layers):
        if isinstance(layer.mixer, Attention):
            Hkv = layer.mixer.spec.n_kv_heads
            eye = np.broadcast_to(np.eye(T), (B, Hkv, T, T))  # values = I, so o = P
            out[i] = _attend(layer.mixer, layer.norm1.forward(xs[i])[0], eye)
    return out


def head_scores(model, ids, patterns=None):
    """Previous-token, induction and sink scores of every attention head (module docstring).

    Inputs:  model an LM; ids (B, T) ints; patterns attention_patterns(model, ids) if
             already computed.
    Returns: {"previous_token" | "induction" | "sink": {layer index: scores (H,)}}
             (induction NaN when no query has an earlier matching token).
    """
    _check_ids("head_scores", ids)
    patterns = attention_patterns(model, ids) if patterns is None else patterns
    T = ids.shape[1]
    # match[b, t, j]: key j follows an earlier copy of query t's token (j < t)
    match = (ids[:, None, :-1] == ids[:, :, None]) & np.tri(T, T - 1, -2, dtype=bool)  # (B,T,T-1)
    match = np.concatenate([np.zeros((*match.shape[:2], 1), bool), match], axis=2)  # (B,T,T)
    has = match.any(axis=2)  # (B, T)
    scores = {"previous_token": {}, "induction": {}, "sink": {}}
    for i, P in patterns.items():
        t = np.arange(1, T)
        scores["previous_token"][i] = P[:, :, t, t - 1].mean(axis=(0, 2))  # (H,)
        scores["sink"][i] = P[:, :, 1:, 0].mean(axis=(0, 2))  # (H,)
        mass = (P * match[:, None]).sum(axis=3)  # (B, H, T)
        n = has.sum()
        scores["induction"][i] = ((mass * has[:, None]).sum(axis=(0, 2)) / n if n else
                                  np.full(P.shape[1], np.nan))
    return scores


# ---------------------------------------------------------------------------- attribution
def _components(model, ids):
    """[(name, c (B, T, D))] whose sum is x_L (pre-norm and sandwich blocks)."""
    x = model.residual_stream(ids)[0]
    parts = [("embed", x)]
    for i, layer in enumerate(model.layers):
        if layer.spec.placement == "post":
            raise ValueError(f"direct_logit_attribution: layer {i} is post-norm; its output "
                             f"is norm(x + f(x)), not a sum of its parts")
        if layer.mixer is None:  # an MLP-only layer: its FFN below is all of it
            m = np.zeros_like(x)  # (B, T, D)
        elif isinstance(layer.mixer, Attention) and layer.post_mixer_norm is None:
            a = layer.norm1.forward(x)[0]  # (B, T, D)
            heads, bo = _head_parts(layer.mixer, a)  # (H, B, T, D)
            parts += [(f"L{i}.H{h}", heads[h]) for h in range(len(heads))]
            m = heads.sum(axis=0)
            if bo is not None:
                parts.append((f"L{i}.attn_bias", np.broadcast_to(bo, m.shape)))
                m = m + bo
        else:
            m = layer.mixer.forward(layer.norm1.forward(x)[0])[0]  # (B, T, D)
            if layer.post_mixer_norm is not None:
                m = layer.post_mixer_norm.forward(m)[0]
            parts.append((f"L{i}.mixer", m))
        x = x + m
        if layer.ffn is not None:
            f = layer.ffn.forward(layer.norm2.forward(x)[0])[0]
            if layer.post_ffn_norm is not None:
                f = layer.post_ffn_norm.forward(f)[0]
            parts.append((f"L{i}.ffn", f))
            x = x + f
    return parts, x


def direct_logit_attribution(model, ids, target):
    """Each component's direct contribution to the logit of token `target` at every position.

    Inputs:  model an LM; ids (B, T) ints; target a token id.
    Returns: {component name: (B, T)}: "embed", "L{l}.H{h}" per attention head (or
             "L{l}.mixer" for another mixer), "L{l}.attn_bias", "L{l}.ffn", and the constant
             terms "norm_bias", "head_bias" when the model has them. They sum to
             model logits[..., target] (to rounding: 1e-10 in float64); with
             cfg.logit_softcap c, to the logit before the cap, z = c atanh(logit / c).
    """
    _check_ids("direct_logit_attribution", ids)
    V = model.cfg.vocab_size
    if not 0 <= int(target) < V:
        raise ValueError(f"direct_logit_attribution: target {target} is not a token id "
                         f"(vocabulary {V})")
    if getattr(model, "transform", None) is not None:
        raise ValueError("direct_logit_attribution: the head has a non-linear transform "
                         "(a masked LM's); the logit is not a sum of the stream's parts")
    parts, x_L = _components(model, ids)
    norm = model.norm
    head = model.embed.E.data.T if model.head is None else model.head.W.data  # (D, V)
    u = head[:, int(target)]  # (D,)
    if norm is None:  # no final norm: the head reads x_L itself
        r, gain, center = 1.0, 1.0, (lambda c: c)
    elif isinstance(norm, RMSNorm):
        r = 1.0 / np.sqrt(np.mean(x_L * x_L, axis=-1, keepdims=True) + norm.eps)  # (B, T, 1)
        gain, center = norm.g.data + norm.offset, (lambda c: c)
    else:  # LayerNorm: (x - mean) rstd g + b, the centring linear in x
        xc = x_L - x_L.mean(axis=-1, keepdims=True)
        r = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + norm.eps)
        gain, center = norm.g.data, (lambda c: c - c.mean(axis=-1, keepdims=True))
    out = {name: (center(c) * r) @ (gain * u) for name, c in parts}  # each (B, T)
    shape = ids.shape
    if getattr(norm, "b", None) is not None:
        out["norm_bias"] = np.full(shape, norm.b.data @ u)
    biases = [b.data[int(target)] for b in (getattr(model.head, "b", None),
                                            getattr(model, "head_bias", None)) if b is not None]
    if biases:  # the head's bias (a Linear's b, or the LM's head_bias)
        out["head_bias"] = np.full(shape, sum(biases))
    return out


# ---------------------------------------------------------------------------- steering
def steering_vector(model, ids_plus, ids_minus, layer):
    """The mean residual difference after block `layer` between two prompts (Turner et al.
    2023, "Activation Addition", arXiv 2308.10248): v = mean_t x_layer(plus) -
    mean_t x_layer(minus), averaged over batch and positions. layer -1 reads the embedding.

    Inputs:  model an LM; ids_plus (B, T), ids_minus (B', T') ints; layer in -1..L-1.
    Returns: v (D,).
    """
    _check_ids("steering_vector", ids_plus)
    _check_ids("steering_vector", ids_minus)
    _check_layer("steering_vector", model, layer)
    plus = model.residual_stream(ids_plus)[layer + 1]  # (B, T, D)
    minus = model.residual_stream(ids_minus)[layer + 1]  # (B', T', D)
    return plus.mean(axis=(0, 1)) - minus.mean(axis=(0, 1))


def steered_logits(model, ids, layer, vector, scale=1.0):
    """The logits with scale * vector added to the residual stream after block `layer` (at
    every position), the later blocks run on the steered stream.

    Inputs:  model an LM; ids (B, T) ints; layer in -1..L-1 (-1: added to the embedding);
             vector (D,) or (B, T, D); scale a number.
    Returns: logits (B, T, V); scale 0 gives the model's own logits.
    """
    _check_ids("steered_logits", ids)
    _check_layer("steered_logits", model, layer)
    x = model.residual_stream(ids)[layer + 1]  # (B, T, D)
    x = x + np.asarray(scale * np.asarray(vector), x.dtype)  # (B, T, D)
    for block in model.layers[layer + 1:]:
        x = block.forward(x)[0]  # (B, T, D)
    return model.unembed(x)


def _check_layer(fn, model, layer):
    L = len(model.layers)
    if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or \
            not -1 <= layer < L:
        raise ValueError(f"{fn}: layer must be an integer in -1..{L - 1} (-1: the embedding), "
                         f"got {layer!r}")


def propagate_state(layer, h, state, position):
    """Put one token into the decoding state of a block that did not run for it, from the
    hidden state h (B, D) where the stream stopped (CALM's state propagation, Schuster et al.
    2022): an Attention layer of a pre-norm (or sandwich) block appends the k, v of
    norm1(h) (no query, no attention, no FFN); any other block runs in full on h (a
    recurrence must see every token), its output dropped."""
    mixer = layer.mixer
    fast = (isinstance(mixer, Attention) and layer.spec.placement in ("pre", "sandwich")
            and layer.cross is None and not hasattr(layer.ffn, "init_state"))
    if fast:
        a, _ = layer.norm1.forward(h[:, None])  # (B, 1, D)
        rope = None if mixer.spec.rope is None else make_rope(
            mixer.spec.rope, mixer.spec.dh(h.shape[-1]), np.array([position]), position + 1)
        (_, k, v), _ = project_qkv_forward(a, _weights(mixer), spec=mixer.spec,
                                           rope=rope)  # (B, Hkv, 1, Dh) each
        state.append(k, v)
    elif mixer is not None:
        layer.decode(h, state, position)
