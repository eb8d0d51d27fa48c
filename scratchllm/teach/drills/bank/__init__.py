"""The drills: for each, the template a learner fills in, the checks it must pass, and the
library's own implementation in the drill's signature (the solution the tests substitute),
a private `_NAME` registered under the drill's name NAME (NAME itself is the library's).

A drill's function takes plain inputs (not a library cache), so a learner can write it from
the docstring alone. Checks differentiate the library's forward by finite differences
(grads.check) and compare with the library's own backward or an independent formula.

One module per topic (core, tokenizer, attention, moe, linear_attention, ssm), the shared
helpers in _common; DRILLS lists them in the order of `python -m scratchllm drill list`.
"""
from scratchllm.teach.drills.bank import (attention, core, linear_attention, moe, ssm,
                                          tokenizer)
from scratchllm.teach.drills.bank._common import REGISTERED, assert_close, gradient_check

ORDER = ("rmsnorm_backward", "sdpa_backward", "rope_backward", "gqa_forward",
         "balance_loss_backward", "topk_router_forward", "zoh", "ssm_kernel",
         "fft_conv_backward", "selective_scan_backward", "bpe_merge_step", "moe_forward",
         "ssm_recurrent", "selective_scan_forward", "sliding_window_mask", "alibi_bias",
         "flash_attention_forward", "linear_attention_recurrent", "delta_rule_step", "ssd_chunk",
         "blelloch", "info_nce_backward", "rwkv7_step",
         "sequence_balance_loss_backward", "token_healing", "document_mask")
MODULES = (core, tokenizer, attention, moe, linear_attention, ssm)
if sorted(ORDER) != sorted(REGISTERED):
    raise RuntimeError(f"drills registered {sorted(REGISTERED)} but ORDER lists {sorted(ORDER)}")
DRILLS = {name: REGISTERED[name] for name in ORDER}

__all__ = ["DRILLS", "MODULES", "ORDER", "assert_close", "gradient_check"]
