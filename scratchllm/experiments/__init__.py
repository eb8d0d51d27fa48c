"""Experiments: the chapters' claims measured on a CPU (registry: EXPERIMENTS by name and
run_experiment; one module per experiment: collapse, scale, heads, induction, recall,
needle, sinks; synthetic: the synthetic tasks and their training loop; base: Outcome,
the modes and results.json), and the tools to look inside any LM (tools: logit_lens,
direct_logit_attribution, attention_patterns, head_scores, steering_vector,
steered_logits)."""
from .base import MODES, Experiment, Outcome, write_results
from .registry import EXPERIMENTS, run_experiment
from .tools import (attention_patterns, direct_logit_attribution, head_scores, logit_lens,
                    steered_logits, steering_vector)

__all__ = ["EXPERIMENTS", "Experiment", "MODES", "Outcome", "attention_patterns",
           "direct_logit_attribution", "head_scores", "logit_lens", "run_experiment",
           "steered_logits", "steering_vector", "write_results"]
