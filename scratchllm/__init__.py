"""scratchllm: the parts of modern large language models from scratch in NumPy, each with a
hand-written backward pass checked by finite differences (see DESIGN in README)."""
__version__ = "0.1.0"
