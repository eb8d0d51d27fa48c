"""Experiments: the chapters' claims measured on a CPU (registry: EXPERIMENTS by name and
run_experiment; one module per experiment: collapse, scale, heads, induction, moe, experts,
abf, recall, needle, sinks; loop: the training loop they share; synthetic: the synthetic tasks
and their training loop; base: Outcome, the modes and results.json), and the tools to look
inside any LM (tools: logit_lens, direct_logit_attribution, attention_patterns, head_scores,
steering_vector, steered_logits; patching: activation and attribution patching; memories:
FFN key-value memories; early_exit: the logit-lens exit, offline and in a decoding loop)."""
from .base import MODES, Experiment, Outcome, write_results
from .early_exit import ExitDecode, early_exit, early_exit_decode, early_exit_tradeoff
from .memories import ffn_hidden, ffn_memories, value_logits
from .patching import (activation_patching, attribution_patching, patched_logits,
                       site_activations, site_gradients)
from .registry import EXPERIMENTS, run_experiment
from .tools import (attention_patterns, direct_logit_attribution, head_scores, logit_lens,
                    steered_logits, steering_vector)

__all__ = ["EXPERIMENTS", "Experiment", "MODES", "Outcome", "attention_patterns",
           "direct_logit_attribution", "head_scores", "logit_lens", "run_experiment",
           "steered_logits", "steering_vector", "write_results"]
__all__ += ["ExitDecode", "activation_patching", "attribution_patching", "early_exit",
            "early_exit_decode", "early_exit_tradeoff",
            "ffn_hidden", "ffn_memories", "patched_logits", "site_activations",
            "site_gradients", "value_logits"]
