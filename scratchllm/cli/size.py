"""python -m scratchllm size MODEL [--explain]: parameters (total and active per token), FLOPs
per token, KV cache and serving memory of a real model, exact integers beside rounded units,
and the chapters' rules beside them (12·L·D², 2N / 6N, the attention/MLP crossover context,
L·W, KV against Mamba state at 1k / 32k / 1M); --explain prints each line's formula. The
arithmetic is scratchllm/teach/sizing.py (pure Python: this command loads no numpy).
"""
from scratchllm.cli.common import Parser, run
from scratchllm.teach.arch import MODELS
from scratchllm.teach.sizing import (CONTEXTS, DTYPE_BYTES, attention_crossover,
                                     attention_width, block_pieces, cache_at, flop_rules,
                                     flops_per_token, human, human_bytes, kv_cache,
                                     mamba_state_numbers, n_attention_layers, parameters,
                                     receptive_field, serving_memory, twelve_l_d2)


def describe(a):
    """One line of the sizes that matter, e.g. "V 128256, D 4096, L 32, H 32, Hkv 8, ..."."""
    s = f"V {a.vocab}, D {a.d_model}, L {a.n_layers}"
    if n_attention_layers(a):
        s += (f", H {a.n_heads}, MLA Dq {a.q_lora_rank}, Dc {a.kv_lora_rank}, Dn {a.qk_nope}, "
              f"Dr {a.qk_rope}, Dv {a.v_head_dim}" if a.mla
              else f", H {a.n_heads}, Hkv {a.n_kv_heads}, Dh {a.dh}")
    s += f", F {a.d_ff}" if a.d_ff else ""
    s += f", window {a.window} + {a.n_sink} sinks" if a.window else ""
    if a.n_experts:
        s += f", MoE E {a.n_experts} K {a.top_k} S {a.n_shared} Fe {a.moe_d_ff or a.d_ff}"
        s += f" after {a.n_dense_layers} dense layers" if a.n_dense_layers else ""
    if "M" in a.pattern:
        s += f", layers {a.pattern} (M = Mamba N {a.d_state} expand {a.expand} conv {a.d_conv})"
    return s + (", tied head" if a.tied else ", untied head")


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


def report(a, context, batch, dtype="bf16", kv_dtype=None, explain=False):
    """The text `python -m scratchllm size` prints: exact integers beside rounded units, the
    chapters' rules beside the exact counts, and (explain) the formula under each line."""
    kv_dtype = kv_dtype or dtype
    p = parameters(a)
    out = Lines(explain)
    out.text(f"{a.name}: {describe(a)}", "", "parameters (exact, rounded)")
    for name, (t, act) in p.parts.items():
        out.row(name, t, human(t) + (f"  ({act:,} active)" if act != t else ""),
                PARTS_FORMULA.get(name, ""))
    out.row("total", p.total, human(p.total), "the sum of the parts")
    out.row("active per token", p.active, human(p.active),
            "the total with K of the E routed experts")
    _rules(out, a, p)
    _flops(out, a, context)
    _cache(out, a, context, batch, kv_dtype)
    s = serving_memory(a, context, batch, dtype, kv_dtype)
    out.text("", f"serving memory (weights {dtype}, cache {kv_dtype}; activations not counted)")
    out.row("weights", s.weights, human_bytes(s.weights), f"total params · {DTYPE_BYTES[dtype]} B")
    out.row("cache", s.cache, human_bytes(s.cache), "the cache line above")
    out.row("total", s.total, human_bytes(s.total), "weights + cache")
    return str(out)


def _rules(out, a, p):
    if not n_attention_layers(a):
        return  # no attention blocks: the rule does not apply (a pure Mamba stack)
    rule = twelve_l_d2(a)
    exact = sum(exact for _, _, exact in block_pieces(a)) * a.n_layers
    out.text("", "the 12·L·D² rule (MHA, MLP of 4·D; embeddings, biases, norms left out)")
    out.row("12·L·D²", rule, f"{human(rule)}  exact total {p.total:,}",
            f"12 · {a.n_layers} · {a.d_model}²")
    for piece, per_block, own in block_pieces(a):
        k = 4 if piece == "attention" else 8
        out.row(f"  per block {piece} {k}·D²", per_block, f"this model's own: {own:,}",
                f"{k} · {a.d_model}²" + ("  (wq, wk, wv, wo)" if k == 4
                                          else "  (D·4D up, 4D·D down)"))
    out.row("  blocks' own matrices", exact, _ratio(rule, exact),
            "L · (attention + MLP) of this model (MoE: active experts)")


def _flops(out, a, context):
    two_n, six_n = flop_rules(a)
    units = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")
    width = "H·(Dn+Dr)" if a.mla else "H·Dh"
    out.text("", f"FLOPs per token at context {context:,}")
    for name, training, rule, k in (("forward", False, two_n, 2), ("training", True, six_n, 6)):
        f = flops_per_token(a, context, training)
        out.row(f"{name} (exact)", f, human(f, units),
                f"{'3·(' if training else ''}2·N_matmul + 2·L·T·{width}{')' if training else ''}"
                "  (Kaplan et al. 2020: N_matmul counts the head, not the embedding lookup)")
        out.row(f"{name} rule {k}N", rule, human(rule, units), f"{k} · {parameters(a).active:,}"
                " (N = active parameters, no attention term)")
    if n_attention_layers(a):
        out.text("", "context where attention FLOPs overtake the weight matmuls (per layer)")
        for conv, note, formula in (
                ("4n2d", "4·n²·d (the chapter)", "P / (2·Dattn)"),
                ("2Td", "2·T·d (Kaplan; FLOPs above)", "P / Dattn")):
            n = attention_crossover(a, conv)
            out.row(f"n, {note}", f"{n:,.0f}", f"= {n / a.d_model:.2f}·D",
                    f"{formula}, P = block's attention + MLP weights, Dattn = "
                    f"{attention_width(a):,} ({width})")
    if a.window:
        rf = receptive_field(a)
        out.row("receptive field L·W", rf, f"≈ {rf / 1000:.0f}k tokens",
                f"{n_attention_layers(a)} · {a.window}: each layer sees W further back")


def _cache(out, a, context, batch, kv_dtype):
    c = kv_cache(a, context, batch, kv_dtype)
    n_attn, per_layer = n_attention_layers(a), "Dc + Dr" if a.mla else "2·Hkv·Dh"
    size = DTYPE_BYTES[kv_dtype]
    out.text("", f"cache in {kv_dtype} ({n_attn} attention layers)")
    if n_attn:
        out.row("elements per token per layer", c.elements_per_layer, f"({per_layer})",
                per_layer + (" (absorbed MLA: one latent + one shared rope key)" if a.mla
                             else " (K and V)"))
        out.row("bytes per token per layer", c.bytes_per_layer, human_bytes(c.bytes_per_layer),
                f"elements · {size} B")
        out.row("bytes per token", c.bytes_per_token, human_bytes(c.bytes_per_token),
                f"{n_attn} layers · bytes per token per layer")
        out.row("tokens kept per sequence", c.tokens, "",
                "min(T, W + sinks)" if a.window else "T")
    if c.state_bytes:
        m = mamba_state_numbers(a)
        out.row("Mamba state per layer (chapter)", m.chapter, "numbers",
                f"D·N = {a.d_model}·{a.d_state}")
        out.row("Mamba state per layer (full)", m.full,
                f"numbers: + expand ×{a.expand} and the conv state",
                f"Di·N + (d_conv−1)·Di, Di = {a.expand}·D = {a.expand * a.d_model}")
        out.row("Mamba states per sequence", c.state_bytes, human_bytes(c.state_bytes),
                f"Lm · full · {size} B")
    out.row(f"context {context:,} × batch {batch}", c.bytes, human_bytes(c.bytes),
            "batch · (tokens kept · bytes per token + Mamba states)")
    out.text("", f"one sequence in {kv_dtype}:      context          KV cache       Mamba state")
    for T, kv, state in cache_at(a, CONTEXTS, kv_dtype):
        out.text(f"  {T:>30,}  {human_bytes(kv):>16}  {human_bytes(state):>16}")


def build_parser():
    parser = Parser("size", __doc__)
    parser.add_argument("model", nargs="?", help="a model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the known models")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences served at once")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES),
                        help="dtype of the weights (and of the cache unless --kv-dtype)")
    parser.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), help="dtype of the cache")
    parser.add_argument("--explain", action="store_true",
                        help="print the formula behind each line")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is not None and args.model not in MODELS:
        parser.error(f"unknown model {args.model!r}; known: {', '.join(MODELS)}")
    if args.context < 1 or args.batch < 1:
        parser.error(f"--context and --batch must be >= 1, got {args.context} and {args.batch}")
    return run("size", _size, args)


def _size(args):
    if args.list or args.model is None:
        print("\n".join(f"{name:<16} {describe(a)}" for name, a in MODELS.items()))
        return 0
    print(report(MODELS[args.model], args.context, args.batch, args.dtype, args.kv_dtype,
                 args.explain))
    return 0
