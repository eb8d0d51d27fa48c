"""The feed-forward specs: a dense MLP and a mixture of experts (router + experts). Plain Python.

Glossary: D model width, F hidden width, E experts, K top-k, Fs shared-expert width.
"""
from dataclasses import dataclass

from scratchllm.specs._check import fail, flag, instance, one_of, positive_int, real


@dataclass(frozen=True)
class FFNSpec:
    """A dense MLP of hidden width d_ff: "swiglu" (W1, W3, W2: Llama), "gelu_mlp" (W1 + b1,
    W2 + b2: GPT-2), "geglu" (W1, W3, W2 with GELU: Gemma, T5 v1.1's gated-gelu) or
    "relu_mlp" (W1, W2 without biases: T5) or "channel_mix" (RWKV-4's channel mix: the
    token-shift lerps mix_k, mix_r, Wk (D, F), Wr (D, D), Wv (F, D)); gelu_approx "tanh" |
    "none" (erf) | "quick" (x sigmoid(1.702 x): CLIP) for the GELU kinds."""
    kind: str = "swiglu"
    d_ff: int = 384
    gelu_approx: str = "tanh"

    def __post_init__(self):
        one_of(self, "kind", ("swiglu", "gelu_mlp", "geglu", "relu_mlp", "channel_mix"))
        positive_int(self, "d_ff")
        one_of(self, "gelu_approx", ("tanh", "none", "quick"))

    def n_params(self, d_model):
        D, F = d_model, self.d_ff
        if self.kind == "relu_mlp":
            return 2 * D * F
        if self.kind == "channel_mix":
            return 2 * D * F + D * D + 2 * D
        return 2 * D * F + F + D if self.kind == "gelu_mlp" else 3 * D * F

    def n_biases(self, d_model):
        """The bias vectors among n_params: b1 (F) and b2 (D) of "gelu_mlp"."""
        return self.d_ff + d_model if self.kind == "gelu_mlp" else 0


@dataclass(frozen=True)
class RouterSpec:
    """A top-k router (moe/router.py). score "softmax" (Mixtral) | "sigmoid" (DeepSeek-V3);
    bias: a trained logit bias b_router (gpt-oss); n_group, topk_group: group-limited choice;
    norm_topk_prob: gates renormalised over the chosen k; routed_scaling_factor: the gates'
    multiplier; bias_gamma: the speed of the aux-loss-free selection bias (0 = off);
    group_top: a group scores the sum of its top group_top values (DeepSeek-V3: 2;
    DeepSeek-V2's group_limited_greedy: 1, the max).
    selection_bias: the checkpoint stores that selection bias as E numbers without gradient
    (DeepSeek-V3's e_score_correction_bias), and n_params counts them as its published total
    does; scratchllm's MoE keeps a selection bias as a buffer in every MoE layer, outside
    LM.n_params(), so from_flat leaves this False."""
    n_experts: int = 8
    top_k: int = 2
    score: str = "softmax"
    bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    bias_gamma: float = 0.0
    selection_bias: bool = False
    group_top: int = 2

    def __post_init__(self):
        for name in ("n_experts", "top_k", "n_group", "topk_group", "group_top"):
            positive_int(self, name)
        one_of(self, "score", ("softmax", "sigmoid"))
        flag(self, "bias")
        flag(self, "selection_bias")
        flag(self, "norm_topk_prob")
        real(self, "routed_scaling_factor", 0, open_low=True)
        real(self, "bias_gamma", 0)
        if self.top_k > self.n_experts:
            fail(self, f"top_k={self.top_k} must be <= n_experts={self.n_experts}")
        E, G = self.n_experts, self.n_group
        least = max(2, self.group_top)  # a group scores its top group_top experts
        if E % G or (G > 1 and E // G < least):
            fail(self, f"n_group={G} must divide n_experts={E} into groups of >= {least} "
                       f"experts")
        if self.topk_group > G or (G > 1 and self.topk_group * (E // G) < self.top_k):
            fail(self, f"topk_group={self.topk_group} must be <= n_group={G}, and its groups "
                       f"must hold >= top_k={self.top_k} experts")

    def n_params(self, d_model):
        """w_router (D, E) (+ b_router) (+ the stored selection bias)."""
        E = self.n_experts
        return d_model * E + (E if self.bias else 0) + (E if self.selection_bias else 0)


@dataclass(frozen=True)
class ExpertsSpec:
    """The routed experts: "swiglu" (w1, w3, w2 stacked over E), "clamped" (gpt-oss:
    interleaved gate_up with biases, gate clamped at limit, sigma(alpha gate)), "mlp" (the
    plain two-layer MLP with biases, w1 + b1 -> GELU (erf, torch's nn.GELU) -> w2 + b2) or
    "relu" (w1 -> ReLU -> w2, no biases: Switch Transformers' experts); d_ff each."""
    kind: str = "swiglu"
    d_ff: int = 192
    alpha: float = 1.702
    limit: float = 7.0

    def __post_init__(self):
        one_of(self, "kind", ("swiglu", "clamped", "mlp", "relu"))
        positive_int(self, "d_ff")
        real(self, "alpha", 0, open_low=True)
        real(self, "limit", 0, open_low=True)

    def n_params(self, d_model):
        """One expert: w1, w3 (D, F) and w2 (F, D); clamped: gate_up (D, 2F) + its bias and
        down (F, D) + its bias; mlp: w1 (D, F) + b1 and w2 (F, D) + b2."""
        D, F = d_model, self.d_ff
        if self.kind in ("mlp", "relu"):
            return 2 * D * F + (F + D if self.kind == "mlp" else 0)
        return 3 * D * F if self.kind == "swiglu" else 3 * D * F + 2 * F + D


@dataclass(frozen=True)
class MoESpec:
    """A mixture-of-experts FFN (Shazeer et al. 2017; Switch; Mixtral; DeepSeek-V3).

    capacity_factor c: per-expert capacity ceil(c N K / E), overflow dropped (None = no drops);
    expert_capacity C: instead, C slots per expert in each sequence, taken in token order
    (Switch Transformers' top-1 router: moe/switch.py; a dropped token's FFN output is 0);
    d_shared Fs: one always-on SwiGLU of that width (DeepSeek's shared experts; 0 = none);
    balance_coef, z_coef: weights of the Switch balance loss and the ST-MoE z-loss;
    gate_input: the gate scales each routed expert's input, expert(g x), not its output,
    g expert(x) (Llama 4's Llama4TextMoe); shared_gate: the shared expert's output times
    sigmoid(x . w_gate), one learned gate per token (Qwen2-MoE's and Qwen3-Next's
    shared_expert_gate; needs d_shared > 0)."""
    router: RouterSpec = RouterSpec()
    experts: ExpertsSpec = ExpertsSpec()
    capacity_factor: float = None
    d_shared: int = 0
    balance_coef: float = 0.01
    z_coef: float = 0.001
    expert_capacity: int = None
    gate_input: bool = False
    shared_gate: bool = False

    def __post_init__(self):
        flag(self, "gate_input")
        flag(self, "shared_gate")
        if self.shared_gate and not self.d_shared:
            fail(self, "shared_gate gates the shared expert: it needs d_shared > 0",
                 "shared_gate")
        instance(self, "router", RouterSpec)
        instance(self, "experts", ExpertsSpec)
        real(self, "capacity_factor", 0, open_low=True, none_ok=True)
        positive_int(self, "d_shared", low=0)
        real(self, "balance_coef", 0)
        real(self, "z_coef", 0)
        positive_int(self, "expert_capacity", none_ok=True)
        if self.expert_capacity is not None and (
                self.capacity_factor is not None or self.d_shared or self.router.top_k != 1
                or self.router.score != "softmax" or self.router.n_group != 1
                or self.gate_input):
            fail(self, f"expert_capacity={self.expert_capacity} is Switch's top-1 softmax router "
                       f"without shared experts or groups: it excludes capacity_factor, "
                       f"d_shared and top_k > 1", "expert_capacity")

    @property
    def shared(self):
        """The shared experts as the one always-on SwiGLU they are (None without)."""
        return FFNSpec("swiglu", self.d_shared) if self.d_shared else None

    def n_params(self, d_model, active=False):
        """Router, the experts (all E of them, or the K a token uses), shared experts."""
        n_routed = self.router.top_k if active else self.router.n_experts
        shared = self.shared.n_params(d_model) if self.shared else 0
        shared += d_model if self.shared_gate else 0
        return (self.router.n_params(d_model) + n_routed * self.experts.n_params(d_model)
                + shared)
