"""Benchmarks for issue 6: state-space models (float32, medians, side by side in one run).

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_ssm.py [NAME ...]

Each benchmark is a function `bench_NAME() -> None` that prints its own table; `BENCHMARKS`
lists them in order. With no arguments every benchmark runs; otherwise only the named ones.

Sections:
- LTI (ssm.py): fft_conv vs causal_conv_ref over T; S4D fwd+bwd vs a PyTorch autograd twin.
- selective scan (scan.py): added by the scan.py helper below its marker.
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import scipy.fft  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def median_time(fn, repeats=5, warmup=1):
    """Median wall time in seconds of `fn()` over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# --- LTI state-space (ssm.py) ---
def bench_fft_conv():
    """fft_conv_forward vs causal_conv_ref (direct sum), x and K (4, T) float32, 1 FFT worker.

    The FFT's time over T·log2(T) should stay flat (T log T growth); the direct sum's over T²."""
    from scratchllm.ssm import causal_conv_ref, fft_conv_forward, fft_len
    rng = np.random.default_rng(0)
    print(f"{'T':>6} {'n':>6} {'fft ms':>9} {'direct ms':>10} {'direct/fft':>10} "
          f"{'fft ns/(T log2 T)':>18} {'direct ns/T^2':>14}")
    crossover = None
    for T in [4, 8, 16, 32, 64, 128, 256, 1024, 4096, 16384, 65536]:
        x = rng.standard_normal((4, T)).astype(np.float32)  # (C, T)
        K = rng.standard_normal((4, T)).astype(np.float32)  # (C, T)
        t_fft = median_time(lambda: fft_conv_forward(x, K), repeats=7 if T < 16384 else 5)
        t_dir = median_time(lambda: causal_conv_ref(x, K), repeats=5 if T < 16384 else 1,
                            warmup=1 if T < 16384 else 0)
        if crossover is None and t_dir > t_fft:
            crossover = T
        print(f"{T:>6} {fft_len(T):>6} {t_fft * 1e3:>9.3f} {t_dir * 1e3:>10.2f} "
              f"{t_dir / t_fft:>10.1f} {t_fft * 1e9 / (T * np.log2(T)):>18.2f} "
              f"{t_dir * 1e9 / T ** 2:>14.3f}")
    print(f"crossover: the FFT is faster from T = {crossover} on (first size where it wins)")


def _torch_s4d(torch, x, A_log, B, C, log_dt, D):
    """The same S4D layer in PyTorch, written like state-spaces/s4 S4DKernel (dense exp
    Vandermonde) + FFT convolution of length 2T (REFERENCE §5)."""
    T = x.shape[1]
    A, dt = -torch.exp(A_log), torch.exp(log_dt)  # (Dm, N), (Dm,)
    dtA = dt[:, None] * A  # (Dm, N)
    Cp = C * B * torch.expm1(dtA) / A  # (Dm, N)
    V = torch.exp(dtA[..., None] * torch.arange(T, dtype=x.dtype))  # (Dm, N, T)
    K = torch.einsum("dn,dnl->dl", Cp, V)  # (Dm, T)
    u = x.transpose(1, 2)  # (B, Dm, T)
    yc = torch.fft.irfft(torch.fft.rfft(u, n=2 * T) * torch.fft.rfft(K, n=2 * T), n=2 * T)
    return yc[..., :T].transpose(1, 2) + D * x  # (B, T, Dm)


def bench_s4d():
    """S4D fwd+bwd, float32, B=4, T=2048, Dm=256, N=64: scratchllm vs a PyTorch autograd twin.

    Target: scratchllm (2 FFT workers) <= 1.5x torch (2 threads)."""
    import torch

    from scratchllm.ssm import S4D, s4d_backward, s4d_forward
    Bsz, T, Dm, N = 4, 2048, 256, 64
    rng = np.random.default_rng(0)
    params = {n: p.data for n, p in S4D(Dm, N, rng=rng).named_parameters()}
    x = rng.standard_normal((Bsz, T, Dm)).astype(np.float32)  # (B, T, Dm)
    dy = rng.standard_normal((Bsz, T, Dm)).astype(np.float32)  # (B, T, Dm)

    def ours():
        return s4d_backward(dy, s4d_forward(x, **params)[1])

    tp = {n: torch.tensor(v, requires_grad=True) for n, v in params.items()}
    tx, tdy = torch.tensor(x, requires_grad=True), torch.tensor(dy)

    def theirs():
        _torch_s4d(torch, tx, **tp).backward(tdy)
        grads = [tx.grad, *(p.grad for p in tp.values())]
        tx.grad = None
        for p in tp.values():
            p.grad = None
        return grads

    check = ours()
    torch.set_num_threads(2)
    ref = dict(zip(["x", *tp], theirs()))
    err = max(float(np.abs(check[k] - ref[k].numpy()).max() / np.abs(ref[k].numpy()).max())
              for k in ref)
    rows = [("scratchllm, 1 FFT worker", median_time(ours))]
    with scipy.fft.set_workers(2):
        rows.append(("scratchllm, 2 FFT workers", median_time(ours)))
    torch.set_num_threads(1)
    rows.append(("torch autograd, 1 thread", median_time(theirs)))
    torch.set_num_threads(2)
    rows.append(("torch autograd, 2 threads", median_time(theirs)))
    t_torch = rows[-1][1]
    tK = torch.tensor(rng.standard_normal((Dm, T)).astype(np.float32), requires_grad=True)

    def theirs_conv_only():  # the FFT convolution part of the twin alone, K given
        u = tx.transpose(1, 2)  # (B, Dm, T)
        yc = torch.fft.irfft(torch.fft.rfft(u, n=2 * T) * torch.fft.rfft(tK, n=2 * T), n=2 * T)
        yc[..., :T].transpose(1, 2).backward(tdy)
        tx.grad = tK.grad = None

    rows.append(("torch, FFT conv part only", median_time(theirs_conv_only)))
    print(f"B={Bsz} T={T} Dm={Dm} N={N}; max rel grad difference vs torch: {err:.1e}")
    for name, t in rows:
        print(f"{name:<28} {t * 1e3:>9.1f} ms   {t / t_torch:>5.2f}x torch(2 threads)")
    verdict = "met" if rows[1][1] <= 1.5 * t_torch else "NOT met"
    print(f"target scratchllm(2 workers) <= 1.5x torch(2 threads): {verdict}")



# --- selective scan (scan.py) ---


BENCHMARKS = [
    # LTI (ssm.py)
    bench_fft_conv,
    bench_s4d,
    # selective scan (scan.py)
]


def main(argv=None):
    names = sys.argv[1:] if argv is None else argv
    todo = [b for b in BENCHMARKS if not names or b.__name__.removeprefix("bench_") in names]
    for bench in todo:
        print(f"\n## {bench.__name__}")
        bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
