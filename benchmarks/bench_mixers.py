"""Benchmarks of the recurrent sequence mixers (float32, medians, side by side).

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_mixers.py [NAME ...]

B = 4, T = 1024, d = 256 (H = 4 heads of Dh = 64; SSD: N = 16, one group; RWKV: D = 256
channels). For every mixer: scratchllm's training pair (chunked form; RWKV's WKV: the Numba
scan and its adjoint), fwd + bwd; its NumPy reference (the recurrent form with the
reverse-time adjoint, fwd + bwd); and a torch autograd loop of the same recurrence (fwd + bwd,
the faster of 1 and 2 threads). Target: scratchllm >= 5x the torch loop.
`bench_threads` reruns the scratchllm pairs in subprocesses at 1 and 2 BLAS/Numba threads
(target >= 1.6x), beside a calibration row of what the machine gives two threads right now.
"""
import os
import subprocess
import sys

THREADS = os.environ.get("SCRATCHLLM_BENCH_THREADS", "2")
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = THREADS

import numpy as np  # noqa: E402
from bench_ssm import median_time  # noqa: E402  (benchmarks/ is on sys.path)
from runner import run_named  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH, T, H, DH, N = 4, 1024, 4, 64, 16


def _inputs(rng):
    f = np.float32
    q, k, v = (rng.standard_normal((BATCH, H, T, DH)).astype(f) for _ in range(3))
    k_unit = (k / np.linalg.norm(k, axis=-1, keepdims=True)).astype(f)
    return dict(
        linear=dict(q=q, k=k, v=v),
        retnet=dict(q=q, k=k, v=v, gamma=(1 - 2.0 ** (-5 - np.arange(H))).astype(f)),
        gla=dict(q=q, k=k, v=v, g=np.log(rng.uniform(0.9, 1.0, (BATCH, H, T, DH))).astype(f)),
        delta=dict(q=q, k=k_unit, v=v, beta=rng.uniform(0.1, 0.9, (BATCH, H, T)).astype(f),
                   g=np.log(rng.uniform(0.9, 1.0, (BATCH, H, T))).astype(f)),
        ssd=dict(x=rng.standard_normal((BATCH, T, H, DH)).astype(f),
                 dt=rng.uniform(0.01, 0.1, (BATCH, T, H)).astype(f),
                 A=-rng.uniform(0.5, 2.0, H).astype(f),
                 B=rng.standard_normal((BATCH, T, 1, N)).astype(f),
                 C=rng.standard_normal((BATCH, T, 1, N)).astype(f), D=np.ones(H, f)),
        rwkv=dict(w=rng.uniform(0.1, 2.0, H * DH).astype(f),
                  u=rng.standard_normal(H * DH).astype(f),
                  k=rng.standard_normal((BATCH, T, H * DH)).astype(f),
                  v=rng.standard_normal((BATCH, T, H * DH)).astype(f)))


def _pairs():
    """{mixer: (ours, its NumPy reference)}, each a (forward, backward, options) triple: ours is
    the training form (chunked; RWKV's Numba scan), the reference the recurrent form."""
    from scratchllm import linear_attention as la
    from scratchllm import ssm
    rows = {}
    for name, fwd, bwd, chunk in (
            ("linear", la.linear_attention_forward, la.linear_attention_backward, 64),
            ("retnet", la.retnet_attention_forward, la.retnet_attention_backward, 64),
            ("gla", la.gla_attention_forward, la.gla_attention_backward, 32),
            ("delta", la.delta_rule_forward, la.delta_rule_backward, 64),
            ("ssd", ssm.ssd_forward, ssm.ssd_backward, 64)):
        rows[name] = ((fwd, bwd, dict(form="chunked", chunk=chunk)),
                      (fwd, bwd, dict(form="recurrent")))
    rows["rwkv"] = ((la.rwkv4_wkv_scan_forward, la.rwkv4_wkv_scan_backward, {}),
                    (la.rwkv4_wkv_scan_forward_ref, la.rwkv4_wkv_scan_backward_ref, {}))
    return rows


def _fwd_bwd(forward, backward, inputs, **opts):
    def run():
        out, cache = forward(**inputs, **opts)
        backward(np.ones_like(out), cache)
    return run


def _torch_loop(torch, name, a):
    """The recurrence as a plain torch loop over T (autograd records every step)."""
    if name == "rwkv":  # the stabilised WKV recurrence, as upstream's kernel
        num, den = torch.zeros(BATCH, H * DH), torch.zeros(BATCH, H * DH)
        p, ys = torch.full((BATCH, H * DH), -1e38), []
        for t in range(T):
            kt, vt = a["k"][:, t], a["v"][:, t]
            q = torch.maximum(p, a["u"] + kt)
            e1, e2 = torch.exp(p - q), torch.exp(a["u"] + kt - q)
            ys.append((e1 * num + e2 * vt) / (e1 * den + e2))
            q = torch.maximum(p - a["w"], kt)
            e1, e2 = torch.exp(p - a["w"] - q), torch.exp(kt - q)
            num, den, p = e1 * num + e2 * vt, e1 * den + e2, q
        return torch.stack(ys, 1)
    if name == "ssd":
        x, dt, A, B, C, D = (a[n] for n in ("x", "dt", "A", "B", "C", "D"))
        S, ys = torch.zeros(BATCH, H, N, DH), []
        for t in range(T):
            S = (torch.exp(dt[:, t] * A)[..., None, None] * S
                 + B[:, t, 0, None, :, None] * (dt[:, t, :, None] * x[:, t])[:, :, None, :])
            ys.append(torch.einsum("bhnp,bn->bhp", S, C[:, t, 0]) + D[:, None] * x[:, t])
        return torch.stack(ys, 1)
    q, k, v = a["q"], a["k"], a["v"]
    if name == "linear":
        q, k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    S, z, outs = torch.zeros(BATCH, H, DH, DH), torch.zeros(BATCH, H, DH), []
    for t in range(T):
        kt, vt, qt = k[:, :, t], v[:, :, t], q[:, :, t]
        if name == "delta":
            alpha = torch.exp(a["g"][:, :, t])[..., None]
            e = vt - alpha * torch.einsum("bhij,bhi->bhj", S, kt)
            S = alpha[..., None] * S + (a["beta"][:, :, t, None] * kt)[..., None] * e[..., None, :]
        else:
            decay = 1.0
            if name == "gla":
                decay = torch.exp(a["g"][:, :, t])[..., None]
            elif name == "retnet":
                decay = a["gamma"][None, :, None, None]
            S = decay * S + kt[..., None] * vt[..., None, :]
        o = torch.einsum("bhi,bhij->bhj", qt, S)
        if name == "linear":
            z = z + kt
            o = o / (torch.einsum("bhi,bhi->bh", qt, z)[..., None] + 1e-6)
        outs.append(o)
    return torch.stack(outs, 2)


def bench_mixers():
    """Each mixer: scratchllm chunked fwd+bwd vs its NumPy recurrent reference vs torch loop."""
    rng = np.random.default_rng(0)
    inputs, pairs, rows = _inputs(rng), _pairs(), {}
    for name, ((fwd, bwd, opts), (rfwd, rbwd, ropts)) in pairs.items():  # Numba before torch
        ours = median_time(_fwd_bwd(fwd, bwd, inputs[name], **opts), repeats=3)
        ref = median_time(_fwd_bwd(rfwd, rbwd, inputs[name], **ropts), repeats=1, warmup=0)
        rows[name] = [ours, ref]
    import torch
    for name in pairs:
        best = None
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ta = {n: torch.tensor(v, requires_grad=n not in ("gamma",))
                  for n, v in inputs[name].items()}

            def theirs():
                out = _torch_loop(torch, name, ta)
                out.backward(torch.ones_like(out))
            t = median_time(theirs, repeats=1, warmup=0)  # one run: a loop has no warm-up
            best = t if best is None else min(best, t)
        rows[name].append(best)
    print(f"B={BATCH} T={T} H={H} Dh={DH} (d={H * DH}) N={N} float32, {THREADS} threads")
    print(f"{'mixer':<8}{'ours ms':>10}{'numpy ref ms':>14}{'torch loop ms':>15}"
          f"{'ref/ours':>10}{'torch/ours':>12}  target >= 5x")
    for name, (ours, ref, tl) in rows.items():
        print(f"{name:<8}{ours * 1e3:>10.1f}{ref * 1e3:>14.1f}{tl * 1e3:>15.1f}"
              f"{ref / ours:>10.1f}{tl / ours:>12.1f}  {'met' if tl / ours >= 5 else 'NOT met'}")


def bench_ssd_vs_scan():
    """SSD chunked (H = 4 heads of 64 channels, scalar A per head, N = 16) against Mamba-1's
    Numba selective scan over the same d = 256 channels and N = 16 states; fwd + bwd."""
    from scratchllm.ssm import selective_scan_backward, selective_scan_forward
    a = _inputs(np.random.default_rng(1))["ssd"]
    fwd, bwd, opts = _pairs()["ssd"][0]
    t_ssd = median_time(_fwd_bwd(fwd, bwd, a, **opts))
    f = np.float32
    scan = dict(x=a["x"].reshape(BATCH, T, H * DH), delta=np.repeat(a["dt"], DH, axis=2),
                A=np.repeat(np.repeat(a["A"][:, None], N, 1), DH, 0).astype(f),
                B=a["B"][:, :, 0], C=a["C"][:, :, 0], D=np.ones(H * DH, f))
    t_scan = median_time(_fwd_bwd(selective_scan_forward, selective_scan_backward, scan))
    from scratchllm.ssm import ssd_recurrent, ssd_recurrent_ref
    t_numba = median_time(lambda: ssd_recurrent(**a))
    t_ref = median_time(lambda: ssd_recurrent_ref(**a), repeats=1)
    print(f"fwd+bwd: SSD chunked {t_ssd * 1e3:.1f} ms, selective scan (Numba) "
          f"{t_scan * 1e3:.1f} ms, scan/ssd {t_scan / t_ssd:.2f} ({THREADS} threads)")
    print(f"forward scan: ssd_recurrent (Numba) {t_numba * 1e3:.1f} ms, ssd_recurrent_ref "
          f"{t_ref * 1e3:.1f} ms, ref/numba {t_ref / t_numba:.1f}x")


def bench_threads():
    """The scratchllm pairs at 1 and 2 threads (BLAS and Numba; the chunked forms' lane
    groups, linear_attention/lanes.py, follow Numba's count), each in a fresh process,
    alternating 1 and 2 for SCRATCHLLM_BENCH_ROUNDS rounds (default 3), medians. The row
    "machine" is the calibration: two independent loops of batched 64 x 64 matmuls (too small
    for BLAS threads) in a pool of 1 or 2 threads, what the machine gives right now."""
    rounds = int(os.environ.get("SCRATCHLLM_BENCH_ROUNDS", "3"))
    times = {"1": [], "2": []}
    for _ in range(rounds):
        for threads in ("1", "2"):
            env = dict(os.environ, SCRATCHLLM_BENCH_THREADS=threads)
            out = subprocess.run([sys.executable, __file__, "ours"], env=env, check=True,
                                 capture_output=True, text=True).stdout
            times[threads].append(dict(line.split() for line in out.splitlines()
                                       if line.count(" ") == 1 and not line.startswith("#")))
    print(f"load average {os.getloadavg()[0]:.1f}; {rounds} rounds, medians")
    print(f"{'mixer':<8}{'1 thread ms':>12}{'2 threads ms':>14}{'speed-up':>10}  target >= 1.6")
    for name in times["1"][0]:
        t1, t2 = (float(np.median([float(r[name]) for r in times[n]])) for n in ("1", "2"))
        print(f"{name:<8}{t1:>12.1f}{t2:>14.1f}{t1 / t2:>10.2f}")


def bench_share():
    """Load-proof evidence for bench_threads: in one thread, the share of each chunked pair's
    CPU time (time.thread_time) spent in work that runs in parallel on two threads: inside
    gla_chunks' lane kernels (spans of batch x head lanes; linear attention, RetNet, GLA, SSD)
    and inside lanes.map_lanes / for_lanes (the delta rule's lane groups, the elementwise steps
    of linear attention and SSD), and the Amdahl bound 1 / ((1 - p) + p / 2) it allows two
    threads."""
    import time
    import numba
    import scratchllm.linear_attention.delta as delta
    import scratchllm.linear_attention.gla as gla
    import scratchllm.linear_attention.lanes as lanes
    import scratchllm.linear_attention.linear as linear
    import scratchllm.ssm.ssd as ssd
    inside = [0.0]

    def timed(fn):
        def run(*args):
            t = time.thread_time()
            out = fn(*args)
            inside[0] += time.thread_time() - t
            return out
        return run
    for module in (delta, linear, ssd):
        for name in ("map_lanes", "for_lanes"):   # lane groups, results copied or in place
            if hasattr(module, name):
                setattr(module, name, timed(getattr(lanes, name)))
    gla.chunked_kernel = timed(gla.chunked_kernel)
    gla.chunked_backward_kernel_call = timed(gla.chunked_backward_kernel_call)
    lanes._threads = lambda: 1
    numba.set_num_threads(1)
    inputs = _inputs(np.random.default_rng(0))
    print(f"one thread; load average {os.getloadavg()[0]:.1f}")
    for name, ((fwd, bwd, opts), _) in _pairs().items():
        if name == "rwkv":
            continue                          # a span kernel end to end
        run = _fwd_bwd(fwd, bwd, inputs[name], **opts)
        run()
        shares, cpu = [], []
        for _ in range(3):
            inside[0], t = 0.0, time.thread_time()
            run()
            cpu.append(time.thread_time() - t)
            shares.append(inside[0] / cpu[-1])
        p = float(np.median(shares))
        print(f"{name:<8} CPU {np.median(cpu) * 1e3:6.1f} ms  parallel share {p:.3f}  "
              f"Amdahl bound at 2 threads {1 / ((1 - p) + p / 2):.2f}x")


def _machine():
    """Two independent batched-matmul loops in a pool of THREADS threads."""
    from concurrent.futures import ThreadPoolExecutor
    a = np.random.default_rng(0).standard_normal((256, 64, 64)).astype(np.float32)

    def job(_):
        for _ in range(10):
            a @ a
    with ThreadPoolExecutor(int(THREADS)) as pool:
        return median_time(lambda: list(pool.map(job, range(2))), repeats=3)


def bench_ours():
    """Only scratchllm's chunked fwd+bwd per mixer, as 'name ms' lines (for bench_threads),
    and the machine's calibration row."""
    inputs = _inputs(np.random.default_rng(0))
    for name, ((fwd, bwd, opts), _) in _pairs().items():
        t = median_time(_fwd_bwd(fwd, bwd, inputs[name], **opts), repeats=3)
        print(f"{name} {t * 1e3:.1f}")
    print(f"machine {_machine() * 1e3:.1f}")


def bench_ours_cpu():
    """Each chunked pair's process CPU ms per fwd+bwd (all threads; median of 5), as
    'name ms' lines (for bench_cpu)."""
    import time
    inputs = _inputs(np.random.default_rng(0))
    for name, ((fwd, bwd, opts), _) in _pairs().items():
        run = _fwd_bwd(fwd, bwd, inputs[name], **opts)
        run()
        cpu = []
        for _ in range(5):
            t = time.process_time()
            run()
            cpu.append(time.process_time() - t)
        print(f"{name} {np.median(cpu) * 1e3:.1f}")


def bench_cpu():
    """Load-proof companion of bench_threads: process CPU per fwd+bwd (all threads) at 1 and 2
    threads, each in a fresh process. Work that two threads share adds no CPU; threads that
    spin while waiting (Numba's OpenMP workers after a prange kernel) add CPU that a busy
    machine hides in wall time and a quiet one pays. With bench_share's parallel share p, the
    two-thread speed-up on two free cores is about (1 / ((1 - p) + p / 2)) / (CPU 2 / CPU 1)."""
    rows = {}
    for threads in ("1", "2"):
        env = dict(os.environ, SCRATCHLLM_BENCH_THREADS=threads)
        out = subprocess.run([sys.executable, __file__, "ours_cpu"], env=env, check=True,
                             capture_output=True, text=True).stdout
        rows[threads] = dict(line.split() for line in out.splitlines()
                             if line.count(" ") == 1 and not line.startswith("#"))
    print(f"load average {os.getloadavg()[0]:.1f}; process CPU per fwd+bwd, medians of 5")
    print(f"{'mixer':<8}{'1 thread ms':>12}{'2 threads ms':>14}{'CPU 2 / 1':>11}")
    for name in rows["1"]:
        c1, c2 = float(rows["1"][name]), float(rows["2"][name])
        print(f"{name:<8}{c1:>12.1f}{c2:>14.1f}{c2 / c1:>11.2f}")


def bench_alternate():
    """1 against 2 threads in ONE process, alternating every repetition
    (numba.set_num_threads: the lanes' thread count; OpenBLAS at one thread), so a change of
    load hits both columns alike: medians and the median of the per-pair ratios, over
    SCRATCHLLM_BENCH_ROUNDS repetitions (default 15), and the calibration row. Run it at
    real-time priority (`chrt -f 10`) for what two free cores give on a shared machine."""
    import time
    import numba
    from concurrent.futures import ThreadPoolExecutor
    from scratchllm.core.blas import set_blas_threads
    reps = int(os.environ.get("SCRATCHLLM_BENCH_ROUNDS", "15"))
    inputs, a = _inputs(np.random.default_rng(0)), np.ones((256, 64, 64), np.float32)
    pools = {1: ThreadPoolExecutor(1), 2: ThreadPoolExecutor(2)}

    def machine(threads):
        return lambda: list(pools[threads].map(lambda _: [a @ a for _ in range(10)], range(2)))
    runs = {n: (lambda t, r=_fwd_bwd(f, b, inputs[n], **o): r)
            for n, ((f, b, o), _) in _pairs().items()}
    runs["machine"] = machine
    set_blas_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f}; {reps} repetitions, 1 and 2 threads alternating")
    print(f"{'mixer':<8}{'1 thread ms':>12}{'2 threads ms':>14}{'speed-up':>10}{'per pair':>10}")
    for name, make in runs.items():
        times = {1: [], 2: []}
        for r in range(reps + 1):              # the first pair is a warm-up
            for threads in ((1, 2) if r % 2 else (2, 1)):
                numba.set_num_threads(threads)
                run, t = make(threads), time.perf_counter()
                run()
                if r:
                    times[threads].append(time.perf_counter() - t)
        t1, t2 = (float(np.median(times[n])) * 1e3 for n in (1, 2))
        pair = float(np.median(np.array(times[1]) / np.array(times[2])))
        print(f"{name:<8}{t1:>12.1f}{t2:>14.1f}{t1 / t2:>10.2f}{pair:>10.2f}")
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


if __name__ == "__main__":
    sys.exit(run_named([bench_mixers, bench_ssd_vs_scan, bench_threads, bench_alternate,
                        bench_ours, bench_share, bench_ours_cpu, bench_cpu]))
