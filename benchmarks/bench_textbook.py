"""Benchmarks of the textbook techniques (float32 unless said, medians, side by side in one run).

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_textbook.py [NAME ...]

- assoc_scan: the selective scan on Blelloch's parallel scan (ssm/assoc_scan.py, NumPy,
  2 log2 T vectorised rounds) against the sequential Numba selective scan, T = 4096.
- cauchy: S4's Cauchy kernel (ssm/s4.py, float64) against the dense-A kernel (bilinear Ā by
  scipy solves, then L matrix-vector products), N = 64, L = 1024.
- cauchy_zoh: the zero-order-hold Cauchy sum of S4D-LegS (diagonal Λ, float64) against the
  kernel of the dense A = V Λ V* by scipy.linalg.expm, N = 64, L = 1024.
- nsa: native sparse attention (attention/nsa.py) against the causal flash forward,
  T = 4k, 8k, 16k (one run each at 16k: flash takes minutes there).
"""
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402
from bench_ssm import median_time  # noqa: E402  (benchmarks/ is on sys.path: the script's folder)
from runner import run_named  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_assoc_scan():
    from scratchllm.ssm import selective_scan_assoc_forward, selective_scan_forward
    r = np.random.default_rng(0)
    batch, T, d, N = 1, 4096, 64, 16
    f = np.float32
    args = (r.standard_normal((batch, T, d)).astype(f), r.uniform(.05, 1, (batch, T, d)).astype(f),
            -r.uniform(.2, 2, (d, N)).astype(f), r.standard_normal((batch, T, N)).astype(f),
            r.standard_normal((batch, T, N)).astype(f), r.standard_normal(d).astype(f))
    seq = median_time(lambda: selective_scan_forward(*args))
    par = median_time(lambda: selective_scan_assoc_forward(*args))
    print(f"T={T} d={d} N={N}: Numba sequential {seq * 1e3:.1f} ms, Blelloch (NumPy) "
          f"{par * 1e3:.1f} ms, ratio {par / seq:.2f}")


def bench_cauchy():
    from scratchllm.ssm import CauchyWeights, cauchy_kernel_forward, dplr_legs, hippo_legs
    N, L, dt = 64, 1024, 0.01
    A, B = hippo_legs(N)
    d = dplr_legs(N)
    C = np.random.default_rng(0).standard_normal(N)

    def dense():
        eye = np.eye(N)
        a_bar = scipy.linalg.solve(eye - dt / 2 * A, eye + dt / 2 * A)
        h = scipy.linalg.solve(eye - dt / 2 * A, dt * B)
        K = np.empty(L)
        for l in range(L):
            K[l] = C @ h
            h = a_bar @ h
        return K
    w = CauchyWeights(*(a[None] for a in (d.Lambda.real, d.Lambda.imag, d.p.real, d.p.imag,
                                          d.B.real, d.B.imag, C, 0 * C)))
    t_dense = median_time(dense)
    t_cauchy = median_time(lambda: cauchy_kernel_forward(w, np.log([dt]), L=L))
    print(f"N={N} L={L}: dense A {t_dense * 1e3:.1f} ms, Cauchy {t_cauchy * 1e3:.2f} ms, "
          f"{t_dense / t_cauchy:.1f}x")


def bench_cauchy_zoh():
    from scratchllm.ssm import CauchyWeights, cauchy_kernel_forward, dplr_legs
    N, L, dt = 64, 1024, 0.01
    d = dplr_legs(N)
    A = d.V @ np.diag(d.Lambda) @ d.V.conj().T  # (N, N) dense, complex
    B, C = d.V @ d.B, np.random.default_rng(0).standard_normal(N) + 0j

    def dense():
        a_bar = scipy.linalg.expm(dt * A)
        h = scipy.linalg.solve(A, (a_bar - np.eye(N)) @ B)
        K = np.empty(L)
        for l in range(L):
            K[l] = (C @ h).real
            h = a_bar @ h
        return K
    w = CauchyWeights(d.Lambda.real[None], d.Lambda.imag[None], None, None, d.B.real[None],
                      d.B.imag[None], C.real[None], C.imag[None])
    t_dense = median_time(dense)
    t_cauchy = median_time(lambda: cauchy_kernel_forward(w, np.log([dt]), L=L,
                                                         discretization="zoh"))
    print(f"N={N} L={L} zoh: dense A (expm) {t_dense * 1e3:.1f} ms, Cauchy {t_cauchy * 1e3:.2f} "
          f"ms, {t_dense / t_cauchy:.1f}x")


def bench_nsa():
    from scratchllm.attention import flash_sdpa_forward, nsa_forward
    from scratchllm.specs import Mask
    r = np.random.default_rng(0)
    B, H, Hkv, Dh = 1, 4, 1, 64
    for T in (4096, 8192, 16384):
        q = r.standard_normal((B, H, T, Dh)).astype(np.float32)
        k, v = (r.standard_normal((B, Hkv, T, Dh)).astype(np.float32) for _ in range(2))
        phi, g = np.full(64, 1 / 64, np.float32), np.zeros((B, H, T, 3), np.float32)
        reps = 1 if T > 8192 else 3
        t_nsa = median_time(lambda: nsa_forward(q, k, v, phi, g, block=64, n_select=16,
                                                window=512), repeats=reps, warmup=0)
        t_flash = median_time(lambda: flash_sdpa_forward(q, k, v, mask=Mask()), repeats=reps,
                              warmup=0)
        print(f"T={T}: nsa {t_nsa:.2f} s, flash {t_flash:.2f} s, {t_flash / t_nsa:.1f}x")


BENCHMARKS = [bench_assoc_scan, bench_cauchy, bench_cauchy_zoh, bench_nsa]

if __name__ == "__main__":
    sys.exit(run_named(BENCHMARKS))
