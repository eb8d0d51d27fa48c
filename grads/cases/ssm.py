"""Gradient-check cases of scratchllm.ssm: the LTI pieces (zoh, kernel, FFT convolution),
S4D, the selective scan, SSD, Mamba (on either scan, with Jamba's inner norms), Mamba-2, the associative
scan (Blelloch) with the selective scan on it, and S4's Cauchy kernel."""
import numpy as np

from grads.cases._common import case
from grads.check import check


@case
def zoh(rng):
    from scratchllm.ssm import zoh_backward, zoh_forward
    near_zero = np.array([[0.0, 1e-12, -1e-7, 3e-3, -0.05],    # A = 0 and the series region
                          [0.1001, -0.0999, -3.0, -40.0, 2.0]])  # both sides of |ΔA| = 0.1
    return [check(zoh_forward, zoh_backward, rng=rng, label="A near 0", A=near_zero,
                  B=rng.standard_normal((2, 5)), delta=np.array([1.0, 1.0])),
            check(zoh_forward, zoh_backward, rng=rng, label="S4D-like",
                  A=-rng.uniform(0.5, 9, (3, 7)), B=rng.standard_normal((3, 7)),
                  delta=rng.uniform(1e-3, 0.5, 3))]


@case
def ssm_kernel(rng):
    from scratchllm.ssm import ssm_kernel_backward, ssm_kernel_forward
    from scratchllm.ssm import ssm_kernel_forward_ref
    inputs = dict(L=11, A_bar=rng.uniform(-0.95, 0.95, (3, 5)),  # odd L, |A_bar| < 1
                  B_bar=rng.standard_normal((3, 5)), C=rng.standard_normal((3, 5)))
    return [check(ssm_kernel_forward, ssm_kernel_backward, rng=rng, label="blocked", **inputs),
            check(ssm_kernel_forward_ref, ssm_kernel_backward, rng=rng, label="dense ref",
                  **inputs)]


@case
def fft_conv(rng):
    from scratchllm.ssm import (fft_conv_backward, fft_conv_backward_ref, fft_conv_forward,
                                fft_conv_forward_ref)
    shared = dict(x=rng.standard_normal((2, 3, 7)), K=rng.standard_normal((3, 7)))
    same = dict(x=rng.standard_normal((3, 13)), K=rng.standard_normal((3, 13)))
    return [check(fft_conv_forward, fft_conv_backward, rng=rng, label="K shared over batch",
                  **shared),
            check(fft_conv_forward, fft_conv_backward, rng=rng, label="T = 13, same shapes",
                  **same),
            check(fft_conv_forward_ref, fft_conv_backward_ref, rng=rng,
                  label="direct ref, K shared", **shared)]


@case
def s4d(rng):
    from scratchllm.ssm import s4d_backward, s4d_forward
    width, N = 3, 5
    return check(s4d_forward, s4d_backward, rng=rng, x=rng.standard_normal((2, 7, width)),
                 A_log=rng.normal(0, 0.7, (width, N)), B=rng.standard_normal((width, N)),
                 C=rng.standard_normal((width, N)), log_dt=rng.uniform(-4, 0, width),
                 D=rng.standard_normal(width))


@case
def s4d_complex(rng):
    from scratchllm.ssm import (S4DComplexWeights, s4d_complex_backward, s4d_complex_forward,
                                s4d_init)
    width, N = 3, 5
    reports = []
    for init in ("lin", "inv", "legs"):  # the init's values, then perturbed off the special points
        p = S4DComplexWeights(*(v + rng.normal(0, 0.1, v.shape)
                                for v in s4d_init(width, N, init, rng=rng)))
        p = p._replace(log_dt=rng.uniform(-3, -1, width))
        reports.append(check(s4d_complex_forward, s4d_complex_backward, rng=rng,
                             label=f"S4D-{init.capitalize()}",
                             x=rng.standard_normal((2, 7, width)), w=p))
    return reports


@case
def selective_scan(rng):
    from scratchllm.ssm import (selective_scan_backward, selective_scan_backward_ref,
                                selective_scan_forward, selective_scan_forward_ref)
    batch, T, d, N = 2, 7, 5, 3  # Δ > 0 as after softplus; A < 0 as -exp(A_log)
    inputs = dict(x=rng.standard_normal((batch, T, d)), delta=rng.uniform(0.05, 1.0, (batch, T, d)),
                  A=-rng.uniform(0.2, 2.0, (d, N)), B=rng.standard_normal((batch, T, N)),
                  C=rng.standard_normal((batch, T, N)), D=rng.standard_normal(d))
    return [check(selective_scan_forward, selective_scan_backward, rng=rng, label="numba",
                  **inputs),
            check(selective_scan_forward_ref, selective_scan_backward_ref, rng=rng, label="ref",
                  **inputs)]


@case
def ssd(rng):
    from scratchllm.ssm import ssd_backward, ssd_forward
    batch, T, H, Dh, G, N = 2, 7, 4, 3, 2, 5  # Δ > 0 as after softplus; A < 0
    return [check(ssd_forward, ssd_backward, rng=rng, label=form, form=form, chunk=3,
                  x=rng.standard_normal((batch, T, H, Dh)),
                  dt=rng.uniform(0.05, 1.0, (batch, T, H)), A=-rng.uniform(0.2, 2.0, H),
                  B=rng.standard_normal((batch, T, G, N)), C=rng.standard_normal((batch, T, G, N)),
                  D=rng.standard_normal(H))
            for form in ("parallel", "chunked", "recurrent")]


@case
def mamba(rng):
    from scratchllm.specs import MambaSpec
    from scratchllm.ssm import (MambaWeights, causal_conv1d_backward, causal_conv1d_forward,
                                mamba_backward, mamba_forward)
    batch, T, width, Di, N, R, K = 2, 7, 5, 10, 3, 2, 4

    def weights():
        return MambaWeights(W_in=rng.normal(0, 0.5, (width, 2 * Di)),
                            conv_w=rng.normal(0, 0.5, (Di, K)), conv_b=rng.normal(0, 0.1, Di),
                            W_x=rng.normal(0, 0.5, (Di, R + 2 * N)),
                            W_dt=rng.normal(0, 0.5, (R, Di)), b_dt=rng.normal(-1, 0.5, Di),
                            A_log=rng.normal(0, 0.5, (Di, N)), D=rng.standard_normal(Di),
                            W_out=rng.normal(0, 0.5, (Di, width)))
    blocks = [check(mamba_forward, mamba_backward, rng=rng, label=f"block, {scan} scan",
                    spec=MambaSpec(N, K, Di // width, R, scan=scan),
                    x=rng.standard_normal((batch, T, width)), w=weights())
              for scan in ("sequential", "associative")]
    conv = check(causal_conv1d_forward, causal_conv1d_backward, rng=rng, label="causal conv1d",
                 x=rng.standard_normal((batch, T, 3)), w=rng.standard_normal((3, K)),
                 b=rng.standard_normal(3))
    return blocks + [conv]


@case
def mamba_inner_norms(rng):
    from scratchllm.specs import MambaSpec
    from scratchllm.ssm import MambaWeights, mamba_backward, mamba_forward
    batch, T, width, Di, N, R, K = 2, 7, 5, 10, 3, 2, 4  # Jamba: rmsnorm on dt_low, B, C
    spec = MambaSpec(N, K, Di // width, R, inner_norms=True, norm_eps=1e-6)
    return check(mamba_forward, mamba_backward, rng=rng, label="jamba inner norms",
                 max_full=30, spec=spec, x=rng.standard_normal((batch, T, width)),
                 w=MambaWeights(W_in=rng.normal(0, 0.5, (width, 2 * Di)),
                                conv_w=rng.normal(0, 0.5, (Di, K)), conv_b=rng.normal(0, 0.1, Di),
                                W_x=rng.normal(0, 0.5, (Di, R + 2 * N)),
                                W_dt=rng.normal(0, 0.5, (R, Di)), b_dt=rng.normal(-1, 0.5, Di),
                                A_log=rng.normal(0, 0.5, (Di, N)), D=rng.standard_normal(Di),
                                W_out=rng.normal(0, 0.5, (Di, width)),
                                dt_norm=1 + 0.3 * rng.standard_normal(R),
                                B_norm=1 + 0.3 * rng.standard_normal(N),
                                C_norm=1 + 0.3 * rng.standard_normal(N)))


@case
def mamba2(rng):
    from scratchllm.specs import Mamba2Spec
    from scratchllm.ssm import Mamba2Weights, mamba2_backward, mamba2_forward
    D, Di, H, N, K = 4, 12, 2, 3, 3
    shapes = dict(Wz=(D, Di), Wx=(D, Di), WB=(D, N), WC=(D, N), Wdt=(D, H),
                  conv_w=(Di + 2 * N, K), conv_b=(Di + 2 * N,))
    W = {n: rng.normal(0, 0.5, s) for n, s in shapes.items()}
    one = check(mamba2_forward, mamba2_backward, rng=rng, x=rng.standard_normal((2, 7, D)),
                w=Mamba2Weights(dt_bias=rng.normal(-1, 0.5, H), A_log=rng.normal(0, 0.5, H),
                                D=rng.standard_normal(H), norm=1 + rng.random(Di),
                                Wout=rng.normal(0, 0.5, (Di, D)), **W),
                spec=Mamba2Spec(H, N, Di // D, K, chunk=3), label="one group")
    G = 2  # two groups of B and C (one head each) and of the gated RMSNorm
    shapes.update(WB=(D, G * N), WC=(D, G * N), conv_w=(Di + 2 * G * N, K),
                  conv_b=(Di + 2 * G * N,))
    W = {n: rng.normal(0, 0.5, s) for n, s in shapes.items()}
    two = check(mamba2_forward, mamba2_backward, rng=rng, x=rng.standard_normal((2, 7, D)),
                w=Mamba2Weights(dt_bias=rng.normal(-1, 0.5, H), A_log=rng.normal(0, 0.5, H),
                                D=rng.standard_normal(H), norm=1 + rng.random(Di),
                                Wout=rng.normal(0, 0.5, (Di, D)), **W),
                spec=Mamba2Spec(H, N, Di // D, K, chunk=3, n_groups=G), label="two groups")
    return [one, two]


@case
def associative_scan(rng):
    from scratchllm.ssm import (associative_scan_backward, associative_scan_forward,
                                associative_scan_forward_ref)
    inputs = dict(a=rng.uniform(-0.95, 0.95, (2, 11, 3)), b=rng.standard_normal((2, 11, 3)))
    return [check(associative_scan_forward, associative_scan_backward, rng=rng,
                  label="Blelloch, T = 11", **inputs),
            check(associative_scan_forward_ref, associative_scan_backward, rng=rng,
                  label="sequential ref", **inputs)]


@case
def selective_scan_assoc(rng):
    from scratchllm.ssm import selective_scan_assoc_backward, selective_scan_assoc_forward
    batch, T, d, N = 2, 7, 5, 3
    return check(selective_scan_assoc_forward, selective_scan_assoc_backward, rng=rng,
                 x=rng.standard_normal((batch, T, d)), delta=rng.uniform(0.05, 1.0, (batch, T, d)),
                 A=-rng.uniform(0.2, 2.0, (d, N)), B=rng.standard_normal((batch, T, N)),
                 C=rng.standard_normal((batch, T, N)), D=rng.standard_normal(d))


@case
def cauchy_kernel(rng):
    from scratchllm.ssm import CauchyWeights, cauchy_kernel_backward, cauchy_kernel_forward
    H, N = 2, 5

    def weights():
        return CauchyWeights(-rng.uniform(0.2, 1.0, (H, N)), rng.normal(0, 3, (H, N)),
                             *(rng.standard_normal((H, N)) for _ in range(6)))  # Re Λ < 0
    diagonal = weights()._replace(p_re=None, p_im=None)  # Ã = Λ (S4D)
    return [check(cauchy_kernel_forward, cauchy_kernel_backward, rng=rng, label=f"L = {L}",
                  w=weights(), log_dt=rng.uniform(-3, -1, H), L=L)
            for L in (7, 8)] + [  # L = 8 has the root ω = −1
        check(cauchy_kernel_forward, cauchy_kernel_backward, rng=rng, label=f"diagonal, {disc}",
              w=diagonal, log_dt=rng.uniform(-3, -1, H), L=9, discretization=disc)
        for disc in ("bilinear", "zoh")]
