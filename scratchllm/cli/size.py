"""python -m scratchllm size MODEL: parameters (total and active per token), FLOPs per token,
KV cache and serving memory of a real model, exact integers beside rounded units. The
arithmetic is scratchllm/teach/sizing.py (pure Python: this command loads no numpy).
"""
from scratchllm.cli.common import Parser, run
from scratchllm.teach.arch import MODELS
from scratchllm.teach.sizing import (DTYPE_BYTES, flops_per_token, human, human_bytes, kv_cache,
                                     n_attention_layers, parameters, serving_memory)


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


def report(a, context, batch, dtype="bf16", kv_dtype=None):
    """The text `python -m scratchllm size` prints: exact integers beside rounded units."""
    kv_dtype = kv_dtype or dtype
    p, c = parameters(a), kv_cache(a, context, batch, kv_dtype)
    s = serving_memory(a, context, batch, dtype, kv_dtype)
    flops = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")
    row = "  {:<30}{:>26,}  {}".format
    lines = [f"{a.name}: {describe(a)}", "", "parameters (exact, rounded)"]
    lines += [row(name, t, human(t) + (f"  ({act:,} active)" if act != t else ""))
              for name, (t, act) in p.parts.items()]
    lines += [row("total", p.total, human(p.total)),
              row("active per token", p.active, human(p.active))]
    width = "H·(Dn+Dr)" if a.mla else "H·Dh"
    lines += ["", f"FLOPs per token at context {context:,} "
                  f"(2·N_active + 2·L·T·{width}; training 3×)"]
    for name, training in (("forward", False), ("training", True)):
        f = flops_per_token(a, context, training)
        lines.append(row(name, f, human(f, flops)))
    n_attn, per_layer = n_attention_layers(a), "Dc + Dr" if a.mla else "2·Hkv·Dh"
    lines += ["", f"cache in {kv_dtype} ({n_attn} attention layers)"]
    if n_attn:
        lines += [row("elements per token per layer", c.elements_per_layer, f"({per_layer})"),
                  row("bytes per token per layer", c.bytes_per_layer,
                      human_bytes(c.bytes_per_layer)),
                  row("bytes per token", c.bytes_per_token, human_bytes(c.bytes_per_token)),
                  row("tokens kept per sequence", c.tokens, "")]
    if c.state_bytes:
        lines.append(row("Mamba states per sequence", c.state_bytes, human_bytes(c.state_bytes)))
    lines += [row(f"context {context:,} × batch {batch}", c.bytes, human_bytes(c.bytes)),
              "", f"serving memory (weights {dtype}, cache {kv_dtype}; activations not counted)"]
    lines += [row(name, v, human_bytes(v)) for name, v in s._asdict().items()]
    return "\n".join(line.rstrip() for line in lines)


def build_parser():
    parser = Parser("size", __doc__)
    parser.add_argument("model", nargs="?", help="a model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the known models")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences served at once")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES),
                        help="dtype of the weights (and of the cache unless --kv-dtype)")
    parser.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), help="dtype of the cache")
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
    print(report(MODELS[args.model], args.context, args.batch, args.dtype, args.kv_dtype))
    return 0
