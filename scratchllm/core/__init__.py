"""The foundation every other package stands on: input checks (validate), the element-wise and
dense ops as forward/backward pairs (ops; LayerNorm in norms, GELU and the GPT-2 MLP in
gelu), Param/Module and the thin Modules (nn), and the
optimizer (optim). Imports nothing else of scratchllm."""
from .gelu import (geglu_backward, geglu_forward, gelu_backward, gelu_forward,
                   gelu_mlp_backward, gelu_mlp_forward)
from .nn import (Embedding, GeGLU, GeluMLP, LayerNorm, Linear, Module, Param, RMSNorm, SwiGLU,
                 normal_init)
from .norms import layernorm_backward, layernorm_forward
from .ops import (cross_entropy_backward, cross_entropy_forward, embedding_backward,
                  embedding_forward, linear_backward, linear_forward, log_softmax_backward,
                  log_softmax_forward, rmsnorm_backward, rmsnorm_forward, sigmoid_backward,
                  sigmoid_forward, silu_backward, silu_forward, softmax_backward,
                  softmax_forward, softplus_backward, softplus_forward, swiglu_backward,
                  swiglu_forward)
from .optim import AdamW, clip_grad_norm, cosine_schedule

__all__ = [
    "GeGLU", "GeluMLP", "LayerNorm", "geglu_backward", "geglu_forward", "gelu_backward", "gelu_forward", "gelu_mlp_backward",
    "gelu_mlp_forward", "layernorm_backward", "layernorm_forward",
    "AdamW", "Embedding", "Linear", "Module", "Param", "RMSNorm", "SwiGLU", "clip_grad_norm",
    "cosine_schedule", "cross_entropy_backward", "cross_entropy_forward", "embedding_backward",
    "embedding_forward", "linear_backward", "linear_forward", "log_softmax_backward",
    "log_softmax_forward", "normal_init", "rmsnorm_backward", "rmsnorm_forward",
    "sigmoid_backward", "sigmoid_forward", "silu_backward", "silu_forward", "softmax_backward",
    "softmax_forward", "softplus_backward", "softplus_forward", "swiglu_backward",
    "swiglu_forward",
]
