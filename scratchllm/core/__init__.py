"""The foundation every other package stands on: input checks (validate), the element-wise and
dense ops as forward/backward pairs (ops; LayerNorm in norms, GELU and the GPT-2 MLP in
gelu; T5's ReLU MLP in relu), Param/Module and the thin Modules (nn), the optimizer (optim;
its fused kernels in fused_adamw), and the fused Numba twins of the training step's
element-wise ops (fused) with the Twin that picks one per forward
(twins), the contrastive InfoNCE loss (contrastive), the one atomic file writer (atomic),
logit soft-capping (softcap), LoRA adapters on a Linear (lora), FP8 matmuls for training
(fp8: the e4m3/e5m2 quantisers on fine-grained scales, the FP8 linear pair, the fp8_matmuls
switch), and mean/[CLS] pooling with the sequence heads on it (pooling). Imports nothing else
of scratchllm."""
from .atomic import atomic_write
from .fp8 import (FP8_FORMATS, FP8_MAX, FP8LinearCache, FP8Spec, FP8Tensor, fp8_active,
                  fp8_cast_backward, fp8_cast_forward, fp8_dequantize, fp8_linear_backward,
                  fp8_linear_forward, fp8_matmuls, fp8_quantize, fp8_round, full_precision)
from .contrastive import info_nce_backward, info_nce_forward
from .pooling import (HeadWeights, pool_backward, pool_forward, sequence_head_backward,
                      sequence_head_forward)
from .fused import (CROSS_ENTROPY, RMSNORM, SWIGLU, fused_cross_entropy_backward,
                    fused_cross_entropy_forward, fused_rmsnorm_backward, fused_rmsnorm_forward,
                    fused_swiglu_backward, fused_swiglu_forward)
from .fused_adamw import AdamWStep, adamw_update, adamw_update_ref, sum_squares, sum_squares_ref
from .gelu import (geglu_backward, geglu_forward, gelu_backward, gelu_forward,
                   gelu_mlp_backward, gelu_mlp_forward)
from .nn import (Embedding, FP8Linear, GeGLU, GeluMLP, LayerNorm, Linear, Module, Param, ReluMLP, RMSNorm,
                 SwiGLU, detect_anomaly, normal_init)
from .lora import (LoRAFactors, LoRALinear, LoRAWeights, lora_backward, lora_forward,
                   lora_merge_backward, lora_merge_forward)
from .norms import layernorm_backward, layernorm_forward
from .relu import relu_mlp_backward, relu_mlp_forward
from .ops import (cross_entropy_backward, cross_entropy_forward, embedding_backward,
                  embedding_forward, linear_backward, linear_forward, log_softmax_backward,
                  log_softmax_forward, rmsnorm_backward, rmsnorm_forward, sigmoid_backward,
                  sigmoid_forward, silu_backward, silu_forward, softmax_backward,
                  softmax_forward, softplus_backward, softplus_forward, swiglu_backward,
                  swiglu_forward)
from .softcap import softcap_backward, softcap_forward
from .optim import AdamW, NonFiniteError, clip_grad_norm, cosine_schedule
from .twins import Twin, TwinCache, use_fused

__all__ = [
    "FP8_FORMATS", "FP8_MAX", "FP8Linear", "FP8LinearCache", "FP8Spec", "FP8Tensor",
    "fp8_active", "fp8_cast_backward", "fp8_cast_forward", "fp8_dequantize",
    "fp8_linear_backward", "fp8_linear_forward", "fp8_matmuls", "fp8_quantize", "fp8_round",
    "full_precision",
    "LoRAFactors", "LoRALinear", "LoRAWeights", "lora_backward", "lora_forward",
    "lora_merge_backward", "lora_merge_forward",
    "info_nce_backward", "info_nce_forward",
    "HeadWeights", "pool_backward", "pool_forward", "sequence_head_backward",
    "sequence_head_forward",
    "GeGLU", "GeluMLP", "LayerNorm", "geglu_backward", "geglu_forward", "gelu_backward",
    "gelu_forward", "gelu_mlp_backward", "gelu_mlp_forward", "layernorm_backward",
    "layernorm_forward", "ReluMLP", "relu_mlp_backward", "relu_mlp_forward",
    "AdamW", "Embedding", "Linear", "Module", "NonFiniteError", "Param", "RMSNorm", "SwiGLU",
    "AdamWStep", "CROSS_ENTROPY", "RMSNORM", "SWIGLU", "Twin", "TwinCache", "atomic_write",
    "adamw_update", "adamw_update_ref", "clip_grad_norm", "detect_anomaly", "fused_cross_entropy_backward",
    "fused_cross_entropy_forward", "fused_rmsnorm_backward", "fused_rmsnorm_forward",
    "fused_swiglu_backward", "fused_swiglu_forward", "sum_squares", "sum_squares_ref",
    "use_fused",
    "cosine_schedule", "cross_entropy_backward", "cross_entropy_forward", "embedding_backward",
    "embedding_forward", "linear_backward", "linear_forward", "log_softmax_backward",
    "log_softmax_forward", "normal_init", "rmsnorm_backward", "rmsnorm_forward",
    "sigmoid_backward", "sigmoid_forward", "silu_backward", "silu_forward", "softmax_backward",
    "softmax_forward", "softplus_backward", "softplus_forward", "swiglu_backward",
    "swiglu_forward", "softcap_backward", "softcap_forward",
]
