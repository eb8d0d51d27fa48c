"""Activation patching and attribution patching between two prompts (any pre-norm or sandwich
LM, a loaded Hugging Face checkpoint included).

Two prompts of the same shape, `clean` and `corrupt`, differ where it matters (a name, a
fact); the metric reads the last position's logits, averaged over the batch:
    M(logits) = mean_b (logits[b, -1, target] - logits[b, -1, foil])   (foil None: the target
                                                                        logit alone)
Sites: the arrays the residual stream is a sum of (tools.py's module docstring),
    "embed"      x_0
    "L{l}.mixer" the mixer sub-layer's output m_l (after its out-norm in a sandwich block)
    "L{l}.ffn"   the FFN sub-layer's output f_l (blocks with an FFN)
    "L{l}.resid" the stream after block l, x_{l+1} = x_l + m_l + f_l
Activation patching (Vig et al. 2020, arXiv 2004.12265; Meng et al. 2022, ROME, arXiv
2202.05262): run the corrupt prompt with one site at one position replaced by its value in
the clean run, everything downstream recomputed; the effect is M(patched) - M(corrupt).
Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial
Scale", neelnanda.io; Syed et al. 2023, arXiv 2310.10348): the first-order estimate of every
patch from one forward and one backward of the corrupt run,
    M(patched at site s, position t) - M(corrupt) ~ (a_clean - a_corrupt)[:, t] . dM/da[:, t]
summed over the batch and D (M being the batch mean, dM/da carries the 1/B). dM/da comes from
the hand-written backward: the head's (LM.head_backward) and each sub-layer's Modules in
reverse,
    dM/dx_{l+1} = g;   dM/df_l = g;   dM/dm_l = g + N2^T(ffn^T(g))  (the stream before the FFN);
    dM/dx_l = dM/dm_l + N1^T(mixer^T(dM/dm_l))
Where M is linear in a site (the last block's sites without a final norm) the estimate is exact.

Glossary: B batch, T time, D model width, V vocabulary.
"""
import numpy as np

from scratchllm.core.validate import expect_int, expect_ndim


def _check_ids(fn, ids):
    expect_int(fn, "ids", ids)
    expect_ndim(fn, "ids", ids, 2, "(B, T)")


def _check_model(fn, model):
    for i, layer in enumerate(model.layers):
        if layer.spec.placement not in ("pre", "sandwich") or layer.cross is not None:
            raise ValueError(f"{fn}: layer {i} is a {layer.spec.placement}-norm block"
                             f"{' with cross-attention' if layer.cross is not None else ''}; "
                             f"patching reads pre-norm and sandwich blocks (x + m + f)")


def _sub_forward(norm, call, out_norm, x):
    """One pre-norm / sandwich branch: m = out_norm(call(norm(x))) -> (m, caches)."""
    a, c_norm = norm.forward(x)  # (B, T, D)
    m, c_inner = call(a)  # (B, T, D)
    m, c_out = (m, None) if out_norm is None else out_norm.forward(m)
    return m, (c_norm, c_inner, c_out)


def _sub_backward(norm, back, out_norm, dm, caches):
    """The branch's backward: dm -> its gradient on x (without the skip)."""
    c_norm, c_inner, c_out = caches
    dm = dm if c_out is None else out_norm.backward(dm, c_out)  # fwd: m = out_norm(m)
    return norm.backward(back(dm, c_inner), c_norm)  # fwd: m = call(norm(x))


def _trace(model, x0, patch=None):
    """Run the blocks from x0 (B, T, D), each site replaced where patch says.
    patch: {site: (values (B, T, D), positions (T,) bool)}.
    Returns (acts {site: (B, T, D)}, logits (B, T, V), caches for _site_grads)."""
    patch = patch or {}

    def put(name, a):
        if name in patch:
            values, where = patch[name]
            a = np.where(where[None, :, None], values, a).astype(a.dtype, copy=False)
        acts[name] = a
        return a

    acts, caches = {}, []
    x = put("embed", x0)
    for i, layer in enumerate(model.layers):
        m, c_m = _sub_forward(layer.norm1, layer.mixer.forward, layer.post_mixer_norm, x)
        s = x + put(f"L{i}.mixer", m)  # (B, T, D)
        c_f = None
        if layer.ffn is not None:
            f, c_f = _sub_forward(layer.norm2, layer.ffn.forward, layer.post_ffn_norm, s)
            s = s + put(f"L{i}.ffn", f)
        x = put(f"L{i}.resid", s)
        caches.append((c_m, c_f))
    logits, c_out = model.head_forward(x)
    return acts, logits, (caches, c_out)


def _metric(logits, target, foil):
    """M and dM/dlogits (module docstring)."""
    B, V = logits.shape[0], logits.shape[-1]
    d = np.zeros_like(logits)
    d[:, -1, target] = 1.0 / B
    if foil is not None:
        d[:, -1, foil] -= 1.0 / B
    return float((logits * d).sum()), d


def _check_tokens(fn, model, **tokens):
    V = model.cfg.vocab_size
    for name, t in tokens.items():
        if t is not None and not 0 <= int(t) < V:
            raise ValueError(f"{fn}: {name} {t} is not a token id (vocabulary {V})")


def site_gradients(model, ids, target, foil=None):
    """The sites of a forward on ids and the metric's gradient on each.

    Inputs:  model an LM (pre-norm or sandwich blocks); ids (B, T) ints; target, foil token
             ids (foil None: the metric is the target's logit).
    Returns: (M float, acts {site: (B, T, D)}, grads {site: dM/d site (B, T, D)}). The
             Params' .grad are left as they were.
    """
    fn = "site_gradients"
    _check_ids(fn, ids)
    _check_model(fn, model)
    _check_tokens(fn, model, target=target, foil=foil)
    saved = [p.grad.copy() for p in model.parameters()]
    acts, logits, (caches, c_out) = _trace(model, _embed(model, ids))
    M, dlogits = _metric(logits, int(target), None if foil is None else int(foil))
    g = model.head_backward(dlogits.astype(logits.dtype), c_out)  # (B, T, D)
    grads = {}
    for i in reversed(range(len(model.layers))):
        layer, (c_m, c_f) = model.layers[i], caches[i]
        grads[f"L{i}.resid"] = g
        if c_f is not None:  # fwd: x_{i+1} = s + ffn(s)
            grads[f"L{i}.ffn"] = g
            g = g + _sub_backward(layer.norm2, lambda d, c: layer.ffn.backward(d, c, 0.0),
                                  layer.post_ffn_norm, g, c_f)
        grads[f"L{i}.mixer"] = g  # fwd: s = x_i + m
        g = g + _sub_backward(layer.norm1, layer.mixer.backward, layer.post_mixer_norm, g, c_m)
    grads["embed"] = g
    for p, s in zip(model.parameters(), saved):
        p.grad[...] = s
    return M, acts, {k: grads[k] for k in acts}


def _embed(model, ids):
    """x_0 of ids (B, T): the embedding (the residual stream's first entry)."""
    return model.residual_stream(ids)[0]


def site_activations(model, ids):
    """Every site (module docstring) of a forward on ids (B, T): ({site: (B, T, D)}, logits
    (B, T, V))."""
    _check_ids("site_activations", ids)
    _check_model("site_activations", model)
    return _trace(model, _embed(model, ids))[:2]


def patched_logits(model, ids, patch):
    """The logits of ids with sites replaced: patch {site: (values (B, T, D), positions (T,)
    bool)} (a site's values where positions is True, its own elsewhere)."""
    _check_ids("patched_logits", ids)
    _check_model("patched_logits", model)
    return _trace(model, _embed(model, ids), patch)[1]


def activation_patching(model, clean_ids, corrupt_ids, target, foil=None):
    """The exact effect of patching each site at each position from the clean run into the
    corrupt one.

    Inputs:  model an LM (pre-norm or sandwich blocks); clean_ids, corrupt_ids (B, T) ints of
             one shape; target, foil token ids (the metric: module docstring).
    Returns: {"clean": M(clean), "corrupt": M(corrupt), "effect": {site: (T,)
             M(patched at t) - M(corrupt)}}. Cost: one run of the blocks per site and
             position. (Patching "L{last}.resid" at every position gives the clean logits.)
    """
    fn = "activation_patching"
    _pair(fn, model, clean_ids, corrupt_ids, target, foil)
    clean, _, _ = _trace(model, _embed(model, clean_ids))
    corrupt, logits, _ = _trace(model, _embed(model, corrupt_ids))
    foil = None if foil is None else int(foil)
    M = lambda lg: _metric(lg, int(target), foil)[0]  # noqa: E731
    T = clean_ids.shape[1]
    effect = {}
    for site in corrupt:
        row = np.empty(T)
        for t in range(T):
            where = np.arange(T) == t
            row[t] = M(_trace(model, corrupt["embed"], {site: (clean[site], where)})[1])
        effect[site] = row - M(logits)
    return {"clean": M(_trace(model, clean["embed"])[1]), "corrupt": M(logits),
            "effect": effect}


def attribution_patching(model, clean_ids, corrupt_ids, target, foil=None):
    """Attribution patching's linear estimate of activation_patching's "effect": one forward
    of each prompt and one backward of the corrupt run.

    Returns: {site: (T,)}, (a_clean - a_corrupt) . dM/da summed over batch and D (dM/da:
             site_gradients on the corrupt prompt; M is already the batch mean).
    """
    _pair("attribution_patching", model, clean_ids, corrupt_ids, target, foil)
    clean, _, _ = _trace(model, _embed(model, clean_ids))
    _, corrupt, grads = site_gradients(model, corrupt_ids, target, foil)
    return {s: ((clean[s] - corrupt[s]) * grads[s]).sum(axis=(0, 2)) for s in corrupt}


def _pair(fn, model, clean_ids, corrupt_ids, target, foil):
    _check_ids(fn, clean_ids)
    _check_ids(fn, corrupt_ids)
    if np.shape(clean_ids) != np.shape(corrupt_ids):
        raise ValueError(f"{fn}: clean_ids {np.shape(clean_ids)} and corrupt_ids "
                         f"{np.shape(corrupt_ids)} must have one shape (position t of one is "
                         f"patched into position t of the other)")
    _check_model(fn, model)
    _check_tokens(fn, model, target=target, foil=foil)
