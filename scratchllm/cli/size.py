"""python -m scratchllm size MODEL [--explain]: parameters (total and active per token), FLOPs
per token, KV cache and serving memory of a real model, exact integers beside rounded units,
and the chapters' rules beside them (12·L·D², 2N / 6N, the attention/MLP crossover context,
L·W, KV against Mamba state at 1k / 32k / 1M, F ≈ 8/3·D, the embedding's share, an MLA cache
against DeepSeek 67B's); --explain prints each line's formula. The arithmetic is scratchllm/teach/sizing.py and the rules scratchllm/teach/rules.py (pure Python:
this command loads no numpy).

--parallel dp=8,tp=8,pp=4 [--zero S] prints the per-GPU memory (weights, gradients, AdamW) and
the bytes each GPU sends per step per axis of training on that grid (scratchllm/teach/sharding.py).

--serve prints the roofline of one decode step per batch size instead (--hw a100 | h100 | h200
| laptop | this, --batch 1,8,64, --json, --plot PNG: scratchllm/cli/size_serve.py over
scratchllm/teach/serving.py); only --hw this (measured here) loads numpy.
"""
import argparse
import sys

from scratchllm.cli.common import Parser, run
from scratchllm.cli.size_serve import save_serve_plot, serve_json, serve_table
from scratchllm.specs import PRESETS, FFNSpec, MambaSpec, MLASpec, MoESpec, preset
from scratchllm.specs.unflat import mixer_letter
from scratchllm.teach.arch import MODELS, get
from scratchllm.teach.rules import (CONTEXTS, SWIGLU_RULE, attention_crossover, block_pieces,
                                    cache_at, embedding_share, ffn_ratio, flop_rules, kv_cut,
                                    mamba_state_numbers, receptive_field, twelve_l_d2)
from scratchllm.teach.serving import HARDWARE, hardware
from scratchllm.teach.sharding import parse_grid, per_gpu
from scratchllm.teach.sizing import (DTYPE_BYTES, attention_spec, attention_width, ffns,
                                     flops_per_token, human, human_bytes, kv_cache, mixers,
                                     n_attention_layers, parameters, serving_memory,
                                     sliding_window)


def describe(cfg):
    """One line of the sizes that matter, e.g. "V 128256, D 4096, L 32, H 32, Hkv 8, ..."."""
    s = f"V {cfg.vocab_size}, D {cfg.d_model}, L {cfg.n_layers}" + _attention(cfg)
    dense, moe = ffns(cfg, FFNSpec), ffns(cfg, MoESpec)
    width = dense[0].d_ff if dense else moe[0].experts.d_ff if moe else None
    s += f", F {width}" if width else ""  # all-MoE (Mixtral): the experts' width
    window = sliding_window(cfg)
    s += f", window {window} + {attention_spec(cfg).mask.n_sink} sinks" if window else ""
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
    out.row("weights", s.weights, human_bytes(s.weights), f"total params · {DTYPE_BYTES[dtype]} B")
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


def _flops(out, cfg, context):
    two_n, six_n = flop_rules(cfg)
    units = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")
    width = "H·(Dn+Dr)" if isinstance(attention_spec(cfg), MLASpec) else "H·Dh"
    out.text("", f"FLOPs per token at context {context:,}")
    for name, training, rule, k in (("forward", False, two_n, 2), ("training", True, six_n, 6)):
        f = flops_per_token(cfg, context, training)
        out.row(f"{name} (exact)", f, human(f, units),
                f"{'3·(' if training else ''}2·N_matmul + 2·L·T·{width}{')' if training else ''}"
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
    window = sliding_window(cfg)
    if window:
        rf = receptive_field(cfg)
        out.row("receptive field L·W", rf, f"≈ {rf / 1000:.0f}k tokens",
                f"{n_attention_layers(cfg)} · {window}: each layer sees W further back")



def _cache(out, cfg, context, batch, kv_dtype):
    c = kv_cache(cfg, context, batch, kv_dtype)
    mla = isinstance(attention_spec(cfg), MLASpec)
    n_attn, per_layer = n_attention_layers(cfg), "Dc + Dr" if mla else "2·Hkv·Dh"
    size = DTYPE_BYTES[kv_dtype]
    out.text("", f"cache in {kv_dtype} ({n_attn} attention layers)")
    if n_attn:
        out.row("elements per token per layer", c.elements_per_layer, f"({per_layer})",
                per_layer + (" (absorbed MLA: one latent + one shared rope key)" if mla
                             else " (K and V)"))
        out.row("bytes per token per layer", c.bytes_per_layer, human_bytes(c.bytes_per_layer),
                f"elements · {size} B")
        out.row("bytes per token", c.bytes_per_token, human_bytes(c.bytes_per_token),
                f"{n_attn} layers · bytes per token per layer")
        out.row("tokens kept per sequence", c.tokens, "",
                "min(T, W + sinks)" if sliding_window(cfg) else "T")
    if c.state_bytes:
        _mamba_state(out, cfg)
        out.row("Mamba states per sequence", c.state_bytes, human_bytes(c.state_bytes),
                f"Lm · full · {size} B")
    out.row(f"context {context:,} × batch {batch}", c.bytes, human_bytes(c.bytes),
            "batch · (tokens kept · bytes per token + Mamba states)")
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


def build_parser():
    parser = Parser("size", __doc__)
    parser.add_argument("model", nargs="?", help="a model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the known models")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=batch_list, default=[1],
                        help="sequences served at once (--serve: a list, e.g. 1,8,64)")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES),
                        help="dtype of the weights (and of the cache unless --kv-dtype)")
    parser.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), help="dtype of the cache")
    parser.add_argument("--explain", action="store_true",
                        help="print the formula behind each line")
    serve = parser.add_argument_group("serving (the roofline of a decode step)")
    serve.add_argument("--serve", action="store_true",
                       help="bytes read, FLOPs, intensity and time per decode step per batch")
    serve.add_argument("--hw", choices=[*HARDWARE, "this"],
                       help="the device (default h100; this: measured here with numpy)")
    serve.add_argument("--json", action="store_true", help="print only a JSON list")
    serve.add_argument("--plot", metavar="PNG", help="tokens/s against batch, to this file")
    serve.add_argument("--measure", action="store_true",
                       help="with --hw this: also time the library's own decode of MODEL (a "
                            "preset: dense, moe, mla, ...) at each batch size")
    par = parser.add_argument_group("training on a grid of GPUs")
    par.add_argument("--parallel", metavar="GRID", help="per-GPU memory and bytes sent per "
                     "step on a grid, e.g. dp=8,tp=8,pp=4 (--batch: the micro-batch)")
    par.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                     help="with --parallel: the ZeRO stage over the dp ranks")
    return parser


def batch_list(text):
    """An argparse `type`: "1,8,64" -> [1, 8, 64], each an integer >= 1."""
    try:
        batches = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got "
                                         f"{text!r}") from None
    if min(batches) < 1:
        raise argparse.ArgumentTypeError(f"every batch must be >= 1, got {text}")
    return batches


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is not None and args.model not in MODELS and args.model not in PRESETS:
        parser.error(f"unknown model {args.model!r}; known: {', '.join(MODELS)} and the "
                     f"presets {', '.join(PRESETS)}")
    if args.context < 1:
        parser.error(f"--context must be >= 1, got {args.context}")
    given = [f for f in ("hw", "json", "plot", "measure") if getattr(args, f)]
    if not args.serve and given:
        parser.error(f"--{given[0]} belongs to --serve")
    if not args.serve and len(args.batch) > 1:
        parser.error(f"one --batch without --serve, got {len(args.batch)}")
    if args.serve and args.model is None:
        parser.error("--serve needs a MODEL")
    if args.measure and (args.hw != "this" or args.json):
        parser.error("--measure times this machine: it needs --hw this, and prints a table "
                     "(not --json)")
    return run("size", _size, args)


def _size(args):
    if args.list or args.model is None:
        print("\n".join(f"{name:<16} {describe(cfg)}" for name, cfg in MODELS.items()))
        print(f"\npresets (the models this library trains): {', '.join(PRESETS)}")
        return 0
    if args.serve:
        return _serve(args)
    if args.parallel:
        print(parallel_report(_model(args.model), parse_grid(args.parallel), args.zero,
                              args.batch[0], args.context))
        return 0
    print(report(_model(args.model), args.context, args.batch[0], args.dtype, args.kv_dtype,
                 args.explain))
    return 0


def parallel_report(cfg, grid, zero, micro_batch, context):
    """The lines of `size MODEL --parallel dp=A,tp=B,pp=C` (teach/sharding.py)."""
    g = per_gpu(cfg, grid, zero=zero, micro_batch=micro_batch, context=context)
    n = grid.dp * grid.tp * grid.pp
    lines = [f"{cfg.name} on dp={grid.dp} x tp={grid.tp} x pp={grid.pp} = {n:,} GPUs, ZeRO-"
             f"{zero}, micro-batch {micro_batch} x {context:,} tokens, {grid.pp} micro-batches"
             f" per step", f"  parameters per GPU   {g['params']:>16,}  ({human(g['params'])})"]
    for name in ("weights", "gradients", "adamw", "total"):
        lines.append(f"  {name + ' (bytes)':<20} {g[name]:>16,}  ({human_bytes(g[name])})")
    for axis, what in (("dp", "gradient all-reduce"), ("tp", "f/g all-reduces"),
                       ("pp", "activations and their gradients")):
        lines.append(f"  sent per step, {axis}   {g[axis]:>16,}  ({human_bytes(g[axis])}: "
                     f"{what})")
    lines.append(f"  pipeline bubble      {g['bubble']:>16.1%}  ((pp-1)/(m+pp-1))")
    return "\n".join(lines)


def _model(name):
    """A published config (teach/arch.py) or a preset (scratchllm.specs.PRESETS)."""
    return MODELS[name] if name in MODELS else preset(name)


def _serve(args):
    cfg, dtypes = _model(args.model), (args.dtype, args.kv_dtype or args.dtype)
    measured = experts = None
    if args.hw == "this":
        # numpy measures this machine: imported only here, so `size` otherwise loads no numpy
        from scratchllm.cli.hardware import measure_decode, measure_experts, measure_this
        hw = measure_this()
        if args.measure:
            measured = measure_decode(cfg, args.batch, args.context)
            experts = measure_experts(cfg, args.batch)
    else:
        hw = hardware(args.hw or "h100")
    if args.json:
        print(serve_json(cfg, hw, args.batch, args.context, dtypes))
    else:
        print(serve_table(cfg, hw, args.batch, args.context, dtypes, measured, experts))
    if args.plot and not save_serve_plot(args.plot, cfg, hw, args.context, dtypes, measured):
        print(f"scratchllm size: no plot written (matplotlib missing, or not even one "
              f"sequence fits {hw.name})", file=sys.stderr)
    return 0
