"""The recurrent token mixers' specs: Mamba, Mamba-2, the linear-attention family, RWKV-4,
Qwen3-Next's gated DeltaNet.

Glossary: D model width, Di inner width (expand * D), N state size, R dt rank, H heads.
"""
import math
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, one_of, positive_int, real


@dataclass(frozen=True)
class MambaSpec:
    """A Mamba (S6) block (Gu & Dao 2023, arXiv 2312.00752): d_state N, d_conv K, expand
    (Di = expand D), dt_rank R (None = ceil(D / 16)); inner_norms: Jamba's RMSNorms on dt, B
    and C, with norm_eps; scan: how the selective scan runs, "sequential" (the time loop,
    ssm/scan.py) or "associative" (Blelloch's parallel scan, ssm/assoc_scan.py: the same
    outputs and gradients, O(log T) depth, the (B, T, Di, N) states held for the backward)."""
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    dt_rank: int = None
    inner_norms: bool = False
    norm_eps: float = 1e-6
    scan: str = "sequential"

    def __post_init__(self):
        for name in ("d_state", "d_conv", "expand"):
            positive_int(self, name)
        positive_int(self, "dt_rank", none_ok=True)
        flag(self, "inner_norms")
        real(self, "norm_eps", 0, open_low=True)
        one_of(self, "scan", ("sequential", "associative"))

    def rank(self, d_model):
        return self.dt_rank or math.ceil(d_model / 16)

    def n_params(self, d_model):
        """W_in, conv_w, conv_b, W_x, W_dt, b_dt, A_log, D, W_out (+ the inner norms)."""
        D, Di, N, K, R = d_model, self.expand * d_model, self.d_state, self.d_conv, \
            self.rank(d_model)
        n = D * 2 * Di + Di * K + Di + Di * (R + 2 * N) + R * Di + Di + Di * N + Di + Di * D
        return n + (R + 2 * N if self.inner_norms else 0)

    def state_per_sequence(self, d_model):
        """Numbers a decoding state holds: the conv window and the SSM state."""
        Di = self.expand * d_model
        return Di * (self.d_conv - 1) + Di * self.d_state


@dataclass(frozen=True)
class Mamba2Spec:
    """A Mamba-2 (SSD) block (Dao & Gu 2024, arXiv 2405.21060): H heads, d_state N, expand,
    d_conv K, chunk: the chunk length of the chunked scan; n_groups G: groups of B and C (each
    of N, shared by H / G heads) and of the gated RMSNorm."""
    n_heads: int = 4
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    chunk: int = 64
    n_groups: int = 1

    def __post_init__(self):
        for name in ("n_heads", "d_state", "expand", "d_conv", "chunk", "n_groups"):
            positive_int(self, name)
        if self.n_heads % self.n_groups:
            fail(self, f"n_heads={self.n_heads} must be a multiple of n_groups={self.n_groups}")

    def n_params(self, d_model):
        """Wz, Wx, WB, WC, Wdt, dt_bias, A_log, D, conv_w, conv_b, norm, Wout."""
        D, Di, H, K = d_model, self.expand * d_model, self.n_heads, self.d_conv
        N = self.n_groups * self.d_state  # the B and C widths
        return D * (2 * Di + 2 * N + H) + 3 * H + (Di + 2 * N) * (K + 1) + Di + Di * D

    def state_per_sequence(self, d_model):
        Di = self.expand * d_model
        return (Di + 2 * self.n_groups * self.d_state) * (self.d_conv - 1) + Di * self.d_state


@dataclass(frozen=True)
class RecurrentSpec:
    """A linear-attention-family mixer (linear_attention/layer.py): kind "linear" (Katharopoulos
    et al. 2020), "retnet" (Sun et al. 2023), "gla" (Yang et al. 2023) or "delta" (DeltaNet,
    Schlag et al. 2021); H heads, chunk length of the chunked form."""
    kind: str = "linear"
    n_heads: int = 4
    chunk: int = 64

    def __post_init__(self):
        one_of(self, "kind", ("linear", "retnet", "gla", "delta"))
        positive_int(self, "n_heads")
        positive_int(self, "chunk")

    def n_params(self, d_model):
        """Wq, Wk, Wv, Wo (D, D) and the gate Wa: (D, D) for gla, (D, H) for delta."""
        extra = {"gla": d_model, "delta": self.n_heads}.get(self.kind, 0)
        return 4 * d_model * d_model + d_model * extra

    def state_per_sequence(self, d_model):
        """H states S of Dh x Dh; "linear" also keeps its normaliser z, one more column."""
        Dh = d_model // self.n_heads
        return self.n_heads * Dh * (Dh + (self.kind == "linear"))


@dataclass(frozen=True)
class RWKVSpec:
    """RWKV-4's time mixing (Peng et al. 2023, arXiv 2305.13048): Wk, Wv, Wr, Wo and the
    per-channel mix_k, mix_v, mix_r, time_decay, time_first."""
    version: int = 4

    def __post_init__(self):
        one_of(self, "version", (4,))

    def n_params(self, d_model):
        return 4 * d_model * d_model + 5 * d_model

    def state_per_sequence(self, d_model):
        return 4 * d_model


@dataclass(frozen=True)
class GatedDeltaNetSpec:
    """Qwen3-Next's gated DeltaNet layer (Yang et al. 2024, arXiv 2412.06464;
    linear_attention/gated_deltanet.py): n_k_heads Hk query/key heads of k_head_dim dk and
    n_v_heads Hv value heads of v_head_dim dv (Hv a multiple of Hk: each query/key head
    serves Hv / Hk value heads), a causal convolution of width d_conv K over q, k and v,
    the gated output RMSNorm's norm_eps, and chunk: the chunk length of the chunked form."""
    n_k_heads: int = 2
    n_v_heads: int = 4
    k_head_dim: int = 16
    v_head_dim: int = 16
    d_conv: int = 4
    norm_eps: float = 1e-6
    chunk: int = 64

    def __post_init__(self):
        for name in ("n_k_heads", "n_v_heads", "k_head_dim", "v_head_dim", "d_conv", "chunk"):
            positive_int(self, name)
        real(self, "norm_eps", 0, open_low=True)
        if self.n_v_heads % self.n_k_heads:
            fail(self, f"n_v_heads={self.n_v_heads} must be a multiple of n_k_heads="
                       f"{self.n_k_heads} (each query/key head serves n_v_heads / n_k_heads "
                       f"value heads)")

    def widths(self):
        """(Hk dk, Hv dv, the conv's channels 2 Hk dk + Hv dv)."""
        kd, vd = self.n_k_heads * self.k_head_dim, self.n_v_heads * self.v_head_dim
        return kd, vd, 2 * kd + vd

    def n_params(self, d_model):
        """Wq, Wk (D, Hk dk), Wv, Wz (D, Hv dv), Wb, Wa (D, Hv), conv_w (C, K), dt_bias,
        A_log (Hv,), norm (dv,), Wout (Hv dv, D)."""
        kd, vd, C = self.widths()
        H = self.n_v_heads
        return d_model * (2 * kd + 2 * vd + 2 * H) + C * self.d_conv + 2 * H + \
            self.v_head_dim + vd * d_model

    def state_per_sequence(self, d_model):
        """The last K - 1 conv inputs and Hv states of dk x dv."""
        return (self.d_conv - 1) * self.widths()[2] + self.n_v_heads * self.k_head_dim * \
            self.v_head_dim
