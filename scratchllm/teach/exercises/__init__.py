"""The chapters' exercises (Ex. 1-5), each as a statement, a hint and a checked solution.

    python -m scratchllm exercise list             # numbers and titles
    python -m scratchllm exercise show 2           # statement, hint, the function to write
    python -m scratchllm exercise show 2 --solution
    python -m scratchllm exercise check 2          # the library's solution through the checks
    python -m scratchllm exercise check 2 --file my_answer.py   # yours

Proofs become a function whose value the proof predicts (Ex. 2: Σ f_i P_i - 1/E as a sum over
pairs of experts) plus a randomised property test of it (10,000 random routers); coding
exercises are checked against the library's own code (expert_choice_forward, the Attention
and Mamba decoding states, gqa_forward). moe.py holds Ex. 2-3, memory.py Ex. 1, 4 and 5.
"""
from . import moe, memory  # noqa: F401  (importing them registers Ex. 2-3, then 1, 4, 5)
from .core import EXERCISES, Exercise, check

__all__ = ["EXERCISES", "Exercise", "check"]
