"""The report `python -m scratchllm size MODEL` prints (scratchllm/cli/size.py parses the
arguments): parameters, the chapters' rules beside the exact counts, FLOPs per token, the KV
cache layer by layer and serving memory, each row with its formula under --explain. Pure
Python over scratchllm/teach/sizing.py and scratchllm/teach/rules.py."""
from scratchllm.specs import FFNSpec, MambaSpec, MLASpec, MoESpec
from scratchllm.specs.unflat import mixer_letter
from scratchllm.teach.arch import get
from scratchllm.teach.rules import (CONTEXTS, SWIGLU_RULE, attention_crossover, block_pieces,
                                    cache_at, embedding_share, ffn_ratio, flop_rules, int4_weights,
                                    kv_cut, kv_overhead, mamba_state_numbers, receptive_field,
                                    twelve_l_d2)
from scratchllm.teach.sizing import (attention_spec, attention_width, dtype_bytes, ffns,
                                     flops_per_token, human, human_bytes, kv_cache, mixers,
                                     n_attention_layers, n_global_layers, parameters,
                                     serving_memory, sliding_window)


def describe(cfg):
    """One line of the sizes that matter, e.g. "V 128256, D 4096, L 32, H 32, Hkv 8, ..."."""
    s = f"V {cfg.vocab_size}, D {cfg.d_model}, L {cfg.n_layers}" + _attention(cfg)
    dense, moe = ffns(cfg, FFNSpec), ffns(cfg, MoESpec)
    width = dense[0].d_ff if dense else moe[0].experts.d_ff if moe else None
    s += f", F {width}" if width else ""  # all-MoE (Mixtral): the experts' width
    window = sliding_window(cfg)
    if window:
        s += f", window {window} + {attention_spec(cfg).mask.n_sink} sinks"
        n_global = n_global_layers(cfg)
        s += f" ({n_global} of {n_attention_layers(cfg)} layers global)" if n_global else ""
    if moe:
        s += _moe(cfg, moe[0])
    mamba = mixers(cfg, MambaSpec)
    if mamba:
        m = mamba[0]
        s += (f", layers {_pattern(cfg)} (M = Mamba N {m.d_state} expand {m.expand} conv "
              f"{m.d_conv})")
    return s + (", tied head" if cfg.tie_embeddings else ", untied head")


def _attention(cfg):
    a = attention_spec(cfg)
    if a is None:
        return ""
    if isinstance(a, MLASpec):
        return (f", H {a.n_heads}, MLA Dq {a.q_lora_rank}, Dc {a.kv_lora_rank}, Dn "
                f"{a.qk_nope_head_dim}, Dr {a.qk_rope_head_dim}, Dv {a.v_head_dim}")
    return f", H {a.n_heads}, Hkv {a.n_kv_heads}, Dh {a.dh(cfg.d_model)}"


def _moe(cfg, moe):
    """E, K, S shared experts of the routed width, Fe, and the dense layers before the first
    MoE layer."""
    first = next(i for i, layer in enumerate(cfg.layers) if isinstance(layer.ffn, MoESpec))
    s = (f", MoE E {moe.router.n_experts} K {moe.router.top_k} S "
         f"{moe.d_shared // moe.experts.d_ff} Fe {moe.experts.d_ff}")
    return s + (f" after {first} dense layers" if first else "")


def _pattern(cfg):
    """The layers' letters (scratchllm.specs.LAYER_KINDS), the shortest unit that tiles them:
    "M" for 24 Mamba layers."""
    letters = "".join(mixer_letter(layer.mixer) for layer in cfg.layers)
    return next(letters[:n] for n in range(1, len(letters) + 1)
                if letters == letters[:n] * (len(letters) // n))


PARTS_FORMULA = {
    "embedding": "V·D", "positions": "P·D learned positions", "head": "V·D (untied)",
    "attention": "L·(D·H·Dh + 2·D·Hkv·Dh + H·Dh·D)  (MLA: the sizing module docstring)",
    "mamba": "Lm·(D·2Di + Di·(d_conv+1) + Di·(R+2N) + R·Di + 2·Di + Di·N + Di·D)",
    "mlp": "L·3·D·F (SwiGLU) or L·2·D·F (GELU)", "biases": "L·(3·D + D + 4·D + D) (GPT-2/3)",
    "routed experts": "L_moe·E·3·D·Fe  (active: K of the E)", "shared experts": "L_moe·S·3·D·Fe",
    "router": "L_moe·D·E (+ E selection bias)", "norms": "2 per layer + 1 final, D (RMS) or 2·D",
}


class Lines:
    """The report's lines; with explain=True each row is followed by `= formula`."""

    def __init__(self, explain):
        self.explain, self.lines = explain, []

    def text(self, *lines):
        self.lines += lines

    def row(self, label, value, note="", formula=""):
        if isinstance(value, int):
            self.lines.append("  {:<34}{:>26,}  {}".format(label, value, note))
        else:
            self.lines.append("  {:<34}{:>26}  {}".format(label, value, note))
        if self.explain and formula:
            self.lines.append(f"  {'':<6}= {formula}")

    def __str__(self):
        return "\n".join(line.rstrip() for line in self.lines)


def _ratio(rule, exact):
    return f"rule / exact = {rule / exact:.4f}" if exact else ""


def report(cfg, context, batch, dtype="bf16", kv_dtype=None, explain=False):
    """The text `python -m scratchllm size` prints: exact integers beside rounded units, the
    chapters' rules beside the exact counts, and (explain) the formula under each line."""
    kv_dtype = kv_dtype or dtype
    p = parameters(cfg)
    out = Lines(explain)
    out.text(f"{cfg.name}: {describe(cfg)}", "", "parameters (exact, rounded)")
    for name, (t, act) in p.parts.items():
        out.row(name, t, human(t) + (f"  ({act:,} active)" if act != t else ""),
                PARTS_FORMULA.get(name, ""))
    out.row("total", p.total, human(p.total), "the sum of the parts")
    out.row("active per token", p.active, human(p.active),
            "the total with K of the E routed experts")
    _rules(out, cfg, p)
    _chapter_numbers(out, cfg)
    _flops(out, cfg, context)
    _cache(out, cfg, context, batch, kv_dtype)
    s = serving_memory(cfg, context, batch, dtype, kv_dtype)
    out.text("", f"serving memory (weights {dtype}, cache {kv_dtype}; activations not counted)")
    out.row("weights", s.weights, human_bytes(s.weights),
            f"total params · {dtype_bytes(dtype):g} B")
    out.row("cache", s.cache, human_bytes(s.cache), "the cache line above")
    out.row("total", s.total, human_bytes(s.total), "weights + cache")
    return str(out)


def _rules(out, cfg, p):
    if not n_attention_layers(cfg):
        return  # no attention blocks: the rule does not apply (a pure Mamba stack)
    rule = twelve_l_d2(cfg)
    exact = sum(exact for _, _, exact in block_pieces(cfg)) * cfg.n_layers
    out.text("", "the 12·L·D² rule (MHA, MLP of 4·D; embeddings, biases, norms left out)")
    out.row("12·L·D²", rule, f"{human(rule)}  exact total {p.total:,}",
            f"12 · {cfg.n_layers} · {cfg.d_model}²")
    for piece, per_block, own in block_pieces(cfg):
        k = 4 if piece == "attention" else 8
        out.row(f"  per block {piece} {k}·D²", per_block, f"this model's own: {own:,}",
                f"{k} · {cfg.d_model}²" + ("  (wq, wk, wv, wo)" if k == 4
                                          else "  (D·4D up, 4D·D down)"))
    out.row("  blocks' own matrices", exact, _ratio(rule, exact),
            "L · (attention + MLP) of this model (MoE: active experts)")


def _chapter_numbers(out, cfg):
    """F ≈ 8/3·D (Llama 3.5·D), the embedding's share, an MLA cache against DeepSeek 67B's."""
    out.text("", "the chapters' other rules")
    ratio = ffn_ratio(cfg)
    if ratio is not None:
        out.row("FFN width F / D", f"{ratio:.3f}", f"rule 8/3 = {SWIGLU_RULE:.3f} (SwiGLU at "
                f"8·D²), Llama 3: 3.5", "d_ff / d_model; 3·D·F = 8·D² at F = 8/3·D")
    e = embedding_share(cfg)
    out.row("embedding parameters", e.params, f"{human(e.params)} = "
            f"{100 * e.params / e.total:.1f}% of {human(e.total)}",
            "V·D (tied head) or 2·V·D (untied)")
    if isinstance(attention_spec(cfg), MLASpec):
        c = kv_cut(cfg, get("deepseek-67b"))
        out.row("KV cut vs DeepSeek 67B (dense)", f"{100 * c.cut:.1f}%",
                f"{c.elements:,} vs {c.reference:,} numbers per token; "
                f"{100 * c.cut_quantised:.1f}% at 6 bits vs bf16",
                "1 − L·(Dc + Dr) / (L'·2·Hkv'·Dh'); DeepSeek-V2's 93.3% is the 6-bit one")
    q = int4_weights(cfg)
    out.row("int4 weights, rule ½ B/param", q.rule, f"{human_bytes(q.rule)}; with a bf16 scale "
            f"per 128: {q.exact:,} (+{100 * (q.exact / q.rule - 1):.1f}%)",
            "params / 2; exact params · (½ + 2/128) B (size --dtype int4 or int4-gN)")
    if sliding_window(cfg) and n_global_layers(cfg):
        o = kv_overhead(cfg)
        out.row("KV cache / weights at 32K", f"{100 * o.ratio:.1f}%",
                f"{100 * o.global_ratio:.1f}% with every layer global (bf16, one sequence)",
                "Σ_layers T_l·2·Hkv·Dh·2 B / (params·2 B); Gemma 3: ~60% → under 15%")


def _flops(out, cfg, context):
    two_n, six_n = flop_rules(cfg)
    units = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")
    width = "H·(Dn+Dr)" if isinstance(attention_spec(cfg), MLASpec) else "H·Dh"
    mixed = sliding_window(cfg) and n_global_layers(cfg)  # T_l: T or min(T, W + sinks)
    attended = "Σ_layers T_l" if mixed else "L·T"
    out.text("", f"FLOPs per token at context {context:,}")
    for name, training, rule, k in (("forward", False, two_n, 2), ("training", True, six_n, 6)):
        f = flops_per_token(cfg, context, training)
        out.row(f"{name} (exact)", f, human(f, units),
                f"{'3·(' if training else ''}2·N_matmul + 2·{attended}·{width}"
                f"{')' if training else ''}"
                "  (Kaplan et al. 2020: N_matmul counts the head, not the embedding lookup)")
        out.row(f"{name} rule {k}N", rule, human(rule, units), f"{k} · {parameters(cfg).active:,}"
                " (N = active parameters, no attention term)")
    if n_attention_layers(cfg):
        out.text("", "context where attention FLOPs overtake the weight matmuls (per layer)")
        for conv, note, formula in (
                ("4n2d", "4·n²·d (the chapter)", "P / (2·Dattn)"),
                ("2Td", "2·T·d (Kaplan; FLOPs above)", "P / Dattn")):
            n = attention_crossover(cfg, conv)
            out.row(f"n, {note}", f"{n:,.0f}", f"= {n / cfg.d_model:.2f}·D",
                    f"{formula}, P = block's attention + MLP weights, Dattn = "
                    f"{attention_width(cfg):,} ({width})")
    window, rf = sliding_window(cfg), receptive_field(cfg)
    if rf:
        out.row("receptive field L·W", rf, f"≈ {rf / 1000:.0f}k tokens",
                f"{n_attention_layers(cfg)} · {window}: each layer sees W further back")
    elif window:
        out.row("receptive field", "every token", f"{n_global_layers(cfg)} global layers",
                "a global layer attends to the whole context")


def _cache(out, cfg, context, batch, kv_dtype):
    c = kv_cache(cfg, context, batch, kv_dtype)
    mla = isinstance(attention_spec(cfg), MLASpec)
    n_attn, per_layer = n_attention_layers(cfg), "Dc + Dr" if mla else "2·Hkv·Dh"
    size = f"{dtype_bytes(kv_dtype):g}"
    out.text("", f"cache in {kv_dtype} ({n_attn} attention layers)")
    if n_attn:
        out.row("elements per token per layer", c.elements_per_layer, f"({per_layer})",
                per_layer + (" (absorbed MLA: one latent + one shared rope key)" if mla
                             else " (K and V)"))
        out.row("bytes per token per layer", c.bytes_per_layer, human_bytes(c.bytes_per_layer),
                f"elements · {size} B")
        out.row("bytes per token", c.bytes_per_token, human_bytes(c.bytes_per_token),
                f"{n_attn} layers · bytes per token per layer")
        n_global = n_global_layers(cfg)
        if sliding_window(cfg) and n_global:
            local = min(c.layer_tokens)
            out.row("tokens kept per sequence", f"{c.tokens:,} / {local:,}",
                    f"in {n_global} global / {n_attn - n_global} local layers",
                    "T in a global layer, min(T, W + sinks) in a local one")
        else:
            out.row("tokens kept per sequence", c.tokens, "",
                    "min(T, W + sinks)" if sliding_window(cfg) else "T")
    if c.state_bytes:
        _mamba_state(out, cfg)
        out.row("Mamba states per sequence", c.state_bytes, human_bytes(c.state_bytes),
                f"Lm · full · {size} B")
    out.row(f"context {context:,} × batch {batch}", c.bytes, human_bytes(c.bytes),
            "batch · (Σ layers tokens kept · bytes per token per layer + Mamba states)")
    out.text("", f"one sequence in {kv_dtype}:      context          KV cache       Mamba state")
    for T, kv, state in cache_at(cfg, CONTEXTS, kv_dtype):
        out.text(f"  {T:>30,}  {human_bytes(kv):>16}  {human_bytes(state):>16}")


def _mamba_state(out, cfg):
    """A Mamba layer's state as the chapter counts it and in full (nothing without Mamba)."""
    mamba = mixers(cfg, MambaSpec)
    if not mamba:
        return
    m, spec, D = mamba_state_numbers(cfg), mamba[0], cfg.d_model
    out.row("Mamba state per layer (chapter)", m.chapter, "numbers", f"D·N = {D}·{spec.d_state}")
    out.row("Mamba state per layer (full)", m.full,
            f"numbers: + expand ×{spec.expand} and the conv state",
            f"Di·N + (d_conv−1)·Di, Di = {spec.expand}·D = {spec.expand * D}")
