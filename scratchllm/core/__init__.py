"""The foundation every other package stands on: input checks (validate), the element-wise and
dense ops as forward/backward pairs (ops), Param/Module and the thin Modules (nn), and the
optimizer (optim). Imports nothing else of scratchllm."""
from .nn import Embedding, Linear, Module, Param, RMSNorm, SwiGLU, detect_anomaly, normal_init
from .ops import (cross_entropy_backward, cross_entropy_forward, embedding_backward,
                  embedding_forward, linear_backward, linear_forward, log_softmax_backward,
                  log_softmax_forward, rmsnorm_backward, rmsnorm_forward, sigmoid_backward,
                  sigmoid_forward, silu_backward, silu_forward, softmax_backward,
                  softmax_forward, softplus_backward, softplus_forward, swiglu_backward,
                  swiglu_forward)
from .optim import AdamW, NonFiniteError, clip_grad_norm, cosine_schedule

__all__ = [
    "AdamW", "Embedding", "Linear", "Module", "NonFiniteError", "Param", "RMSNorm", "SwiGLU",
    "clip_grad_norm", "detect_anomaly",
    "cosine_schedule", "cross_entropy_backward", "cross_entropy_forward", "embedding_backward",
    "embedding_forward", "linear_backward", "linear_forward", "log_softmax_backward",
    "log_softmax_forward", "normal_init", "rmsnorm_backward", "rmsnorm_forward",
    "sigmoid_backward", "sigmoid_forward", "silu_backward", "silu_forward", "softmax_backward",
    "softmax_forward", "softplus_backward", "softplus_forward", "swiglu_backward",
    "swiglu_forward",
]
