"""`python -m scratchllm size MODEL --serve --hw NAME --batch 1,8,64 --context T`: the
roofline of one decode step per batch size (scratchllm/teach/serving.py), as a table, as JSON
(--json: one object per batch size) or as a figure of tokens/s against batch (--plot PNG)."""
import json

from scratchllm.specs import MoESpec
from scratchllm.teach.serving import (batch_sweep, decode_step, expected_experts, knee,
                                      kv_cache_bytes, max_batch, peak_flops, prefill,
                                      sequence_intensity)
from scratchllm.teach.sizing import human, human_bytes, nbytes, parameters

FLOP_UNITS = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")


def serve_json(cfg, hw, batches, context, dtypes):
    """The pinned JSON text: a list of decode_step(...).as_dict(), one per batch size, whether
    or not it fits. dtypes = (weights, cache)."""
    return json.dumps([decode_step(cfg, hw, b, context, *dtypes).as_dict() for b in batches],
                      indent=1)


def serve_table(cfg, hw, batches, context, dtypes, measured=None, experts=None):
    """The text table: the device, then one row per batch size (and the measured tokens/s,
    [(batch, tokens/s)], beside the bound when given), then prefill at batch 1, then the
    measured distinct experts [(batch, experts)] beside the expected ones when given."""
    dtype, kv_dtype = dtypes
    peak, top = peak_flops(hw, dtype), max_batch(cfg, hw, context, dtype, kv_dtype)
    k = knee(cfg, hw, context, dtype, kv_dtype)
    lines = [f"{cfg.name} on {hw.name} ({hw.source}), weights {dtype}, cache {kv_dtype}, "
             f"context {context:,}",
             f"  bandwidth {hw.bandwidth / 1e9:,.0f} GB/s, peak {human(peak, FLOP_UNITS)}/s, "
             f"memory {hw.memory / 1e9:,.0f} GB; ridge point {peak / hw.bandwidth:,.3g} FLOP/B",
             f"  largest batch that fits: {top:,}" + (_at(cfg, hw, top, context, dtypes) if top
                                                      else " (not even the weights and one "
                                                      "sequence)"),
             "  compute-bound from batch " + _knee(cfg, hw, k, context, dtypes),
             "",
             f"  {'batch':>6} {'weights read':>13} {'KV read':>12} {'FLOPs':>13} "
             f"{'FLOP/B':>8} {'ms/step':>9} {'tokens/s':>11}  bound    fits"
             + ("   measured tokens/s" if measured else "")]
    got = dict(measured or ())
    for b in batches:
        s = decode_step(cfg, hw, b, context, dtype, kv_dtype)
        lines.append(f"  {b:>6} {human_bytes(s.weight_bytes):>13} {human_bytes(s.kv_bytes):>12}"
                     f" {human(s.flops, FLOP_UNITS):>13} {s.intensity:>8.1f}"
                     f" {s.seconds * 1e3:>9.3f} {s.tokens_per_second:>11,.0f}  {s.bound:<8} "
                     f"{'yes' if s.fits else 'no '}"
                     + (f"  {got[b]:>18,.0f}" if b in got else ""))
    router = next((layer.ffn.router for layer in cfg.layers if isinstance(layer.ffn, MoESpec)),
                  None)
    if router:
        E, K = router.n_experts, router.top_k
        lines += ["", f"  routed experts read per MoE layer, E·(1 − (1 − K/E)^b) of E {E} "
                      f"(K {K}):" + ",".join(f" {expected_experts(E, K, b):.1f} at {b}"
                                             for b in batches)]
    p = prefill(cfg, hw, 1, context, dtype, kv_dtype)
    lines += ["", f"  prefill of {context:,} tokens (batch 1): {human(p.flops, FLOP_UNITS)}, "
                  f"{human_bytes(p.weight_bytes + p.kv_bytes)} moved, {p.intensity:,.0f} "
                  f"FLOP/B, {p.seconds * 1e3:,.1f} ms, {p.bound}-bound"]
    return "\n".join(line.rstrip() for line in lines + _experts_lines(cfg, experts))


def _knee(cfg, hw, k, context, dtypes):
    """"K (a sequence's FLOP/B; the memory there)", or "never (...)" when k is None."""
    per_sequence = sequence_intensity(cfg, context, *dtypes)
    if k is None:
        return (f"never (intensity tends to FLOPs / KV bytes per sequence, "
                f"{per_sequence:,.0f}, below the ridge)")
    need = nbytes(parameters(cfg).total, dtypes[0]) + kv_cache_bytes(cfg, context, k, dtypes[1])
    return (f"{k:,} (a sequence's FLOPs per byte of its cache {per_sequence:,.0f}; weights "
            f"and cache there {need / 1e9:,.0f} GB, {need / hw.memory:,.1f}× the device's "
            f"memory)")


def _at(cfg, hw, batch, context, dtypes):
    """", at most N tokens/s, M ms per token": the bound at the KV-memory limit."""
    s = decode_step(cfg, hw, batch, context, *dtypes)
    return (f", at most {s.tokens_per_second:,.0f} tokens/s there ({s.seconds * 1e3:,.2f} ms "
            f"per step, {s.bound}-bound)")


def _experts_lines(cfg, experts):
    """Measured distinct experts per MoE layer beside E·(1 − (1 − K/E)^b)."""
    if not experts:
        return []
    r = next(layer.ffn.router for layer in cfg.layers if isinstance(layer.ffn, MoESpec))
    lines = ["", f"  distinct experts a batch touches per MoE layer (E {r.n_experts}, K "
                 f"{r.top_k}): measured from this model's routers (random weights, random "
                 f"tokens) against uniform routing E·(1 − (1 − K/E)^b)"]
    lines += [f"  {b:>6}  measured {got:6.2f}   expected "
              f"{expected_experts(r.n_experts, r.top_k, b):6.2f}" for b, got in experts]
    return lines


def save_serve_plot(path, cfg, hw, context, dtypes, measured=None):
    """Decode tokens/s against batch (1 .. the largest that fits, log-log), the memory roof
    (b / memory time) and the compute roof (peak / FLOPs per token) beside it, the knee
    marked, and the measured [(batch, tokens/s)] when given; False (nothing written) without
    matplotlib or when nothing fits."""
    try:
        from matplotlib.figure import Figure  # an optional dependency: only for --plot
    except ImportError:
        return False
    steps = batch_sweep(cfg, hw, context, *dtypes)
    if not steps:
        return False
    b = [s.batch for s in steps]
    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    ax.plot(b, [s.tokens_per_second for s in steps], "o-", label="roofline bound")
    ax.plot(b, [s.batch / s.memory_seconds for s in steps], "--", c="gray",
            label="memory roof: b / (bytes / bandwidth)")
    ax.plot(b, [s.batch / s.compute_seconds for s in steps], ":", c="gray",
            label="compute roof: peak / FLOPs per token")
    k = knee(cfg, hw, context, *dtypes)
    if k and k <= b[-1]:
        s = decode_step(cfg, hw, k, context, *dtypes)
        ax.axvline(k, c="red", lw=0.8, label=f"knee: batch {k:,}")
        ax.plot([k], [s.tokens_per_second], "o", c="red")
    if measured:
        ax.plot(*zip(*measured), "s-", c="green", label="measured: this library's decode")
    ax.set(xscale="log", yscale="log", xlabel="batch (sequences decoded together)",
           ylabel="tokens / s",
           title=f"{cfg.name} on {hw.name}, context {context:,}, {dtypes[0]}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
