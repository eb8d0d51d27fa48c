"""scratchllm: the parts of modern large language models from scratch in NumPy, each with a
hand-written backward pass checked by finite differences. README.md has the tour, the
layout and the glossary of letters."""
__version__ = "0.1.0"
