"""State-space models: the parallel (associative) scan of a linear recurrence (assoc_scan:
Blelloch's up-sweep/down-sweep, and the selective scan on it), S4's HiPPO-LegS, DPLR form and
Cauchy kernel (s4), linear time-invariant pieces (lti: ZOH, the SSM kernel, causal FFT
convolution, the recurrence), the S4D layer (s4d) and its complex form (s4d_complex), the
selective scan (scan, with its Numba kernels in scan_kernels and the vectorised exp in vexp),
the Mamba block (mamba: MambaWeights, MambaSpec), and Mamba-2's SSD (ssd, on the
linear-attention engine) and block (mamba2: Mamba2Weights, Mamba2Spec). Stands on core, specs,
attention (the group sharing) and linear_attention."""
from .assoc_scan import (associative_scan_backward, associative_scan_forward,
                         associative_scan_forward_ref, blelloch, selective_scan_assoc_backward,
                         selective_scan_assoc_forward)
from .lti import (fft_conv_backward, fft_conv_backward_ref, fft_conv_forward,
                  fft_conv_forward_ref, fft_len, ssm_kernel_backward, ssm_kernel_forward,
                  ssm_kernel_forward_ref, ssm_recurrence, ssm_step, ZohOut, zoh_backward,
                  zoh_forward)
from .mamba import (Mamba, MambaState, MambaWeights, causal_conv1d_backward,
                    causal_conv1d_forward, mamba_backward, mamba_forward, mamba_step)
from .mamba2 import (Mamba2, Mamba2State, Mamba2Weights, mamba2_backward, mamba2_forward,
                     mamba2_step)
from .s4 import (DPLR, CauchyWeights, cauchy_kernel_backward, cauchy_kernel_forward,
                 dplr_legs, hippo_legs)
from .s4d import S4D, s4d_backward, s4d_forward, s4d_step
from .s4d_complex import (S4DComplex, S4DComplexWeights, s4d_complex_backward,
                          s4d_complex_forward, s4d_complex_step, s4d_init)
from .ssd import ssd_backward, ssd_forward, ssd_recurrent, ssd_recurrent_ref, ssd_step
from .scan import (selective_scan_backward, selective_scan_backward_ref,
                   selective_scan_forward, selective_scan_forward_ref, selective_scan_step)

__all__ = [
    "CauchyWeights", "DPLR", "cauchy_kernel_backward", "cauchy_kernel_forward", "dplr_legs",
    "hippo_legs",
    "associative_scan_backward", "associative_scan_forward", "associative_scan_forward_ref",
    "blelloch", "selective_scan_assoc_backward", "selective_scan_assoc_forward",
    "causal_conv1d_backward", "causal_conv1d_forward", "fft_conv_backward",
    "fft_conv_backward_ref", "fft_conv_forward", "fft_conv_forward_ref", "fft_len", "Mamba",
    "Mamba2", "mamba2_backward", "mamba2_forward", "mamba2_step", "Mamba2State", "Mamba2Weights",
    "mamba_backward", "mamba_forward", "mamba_step", "MambaState", "MambaWeights", "S4D",
    "s4d_backward", "s4d_complex_backward", "s4d_complex_forward", "s4d_complex_step",
    "s4d_forward", "s4d_init", "s4d_step", "S4DComplex", "S4DComplexWeights",
    "selective_scan_backward", "selective_scan_backward_ref", "selective_scan_forward",
    "selective_scan_forward_ref", "selective_scan_step", "ssd_backward", "ssd_forward",
    "ssd_recurrent", "ssd_recurrent_ref", "ssd_step", "ssm_kernel_backward", "ssm_kernel_forward",
    "ssm_kernel_forward_ref", "ssm_recurrence", "ssm_step", "zoh_backward", "zoh_forward",
    "ZohOut",
]
