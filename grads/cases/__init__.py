"""One gradient-check case per component: how every backward in scratchllm is checked.

Each case draws float64 inputs at distinct odd sizes (so a wrong transpose cannot hide) from
the seeded `rng` it is given and returns one Report, or a list of Reports for variants.
Imports stay inside each case so that one broken module never hides the others.
Register a case with @case (grads.cases._common); `python -m grads NAME ...` runs some,
`--list` names them, grouped by topic in the order of MODULES:

    core               ops, norms, activations, dense FFNs, softmax, cross-entropy, fused twins
    attention          RoPE, sdpa (masks, biases, sinks, flash), cross, sparse, GQA, MLA
    moe                routers, experts, aux losses, the MoE layer, expert choice
    linear_attention   linear, RetNet, GLA, delta rule, RWKV-4, the recurrent mixer
    gated              Qwen3-Next's gated layers: gated attention's output gate
    ssm                zoh, kernel, FFT conv, S4D, selective scan, SSD, Mamba, Mamba-2
    lm                 whole tiny models (LM_TINY, lm_tiny) and the encoder models
    vision             the convolution, the patch embedding, the ViT embedding, MAP pooling,
                       tiny ViTs (ViT, SigLIP, CLIP shapes), a tiny LLaVA, Qwen2-VL and
                       multimodal Gemma 3, Qwen2-VL's merger, Gemma 3's pooled projector
    hub                whole tiny models of each Hugging Face family the hub reads
    dist               the collectives on one rank (across ranks: grads/mpi.py)
(The tokenizer has nothing to differentiate.)
"""
from grads.cases import attention, core, dist, gated, hub, linear_attention, lm, moe, ssm, vision
from grads.cases._common import REGISTERED, case
from grads.cases.hub import HF_FIXTURES
from grads.cases.lm import LM_CHECKPOINTS, LM_TINY, LM_TINY_EXTRA, lm_tiny

# the order of CASES
MODULES = (core, attention, moe, linear_attention, gated, ssm, lm, vision, hub, dist)
CASES = {name: fn for module in MODULES for name, fn in REGISTERED.items()
         if fn.__module__ == module.__name__}

__all__ = ["CASES", "HF_FIXTURES", "LM_CHECKPOINTS", "LM_TINY", "LM_TINY_EXTRA", "MODULES",
           "case", "lm_tiny"]
