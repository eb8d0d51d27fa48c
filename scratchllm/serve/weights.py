"""Weight quantisation of a model's Linear layers, round-to-nearest (the baseline GPTQ and AWQ
improve on; serve/gptq.py is GPTQ in the same storage): every weight matrix W (Din, Dout) is
stored as codes with one scale per group of `group_size` consecutive input rows of each
output column (int8 default: the whole column, per output channel; int4: groups of 32), and
the returned model computes with the dequantised weights (simulated quantisation: the numbers
the quantised model computes, in the original dtype). Embeddings, MoE routers, Mamba's A_log
and convolution stay as they are.
Reference: arXiv 2210.17323 (GPTQ: group-wise weight quantisation against round-to-nearest).

Glossary: Din, Dout a matrix's input and output widths; E experts (a stacked (E, Din, Dout)).
"""
import numpy as np

from scratchllm.serve.quantize import quantize

KEEP = ("w_router", "A_log", "conv_w")  # matrices that are not a Linear's weight


def quantizable(name, array):
    """Whether the Param `name` is a Linear layer's weight matrix (2-D, or a stacked 3-D of
    experts) that weight quantisation replaces."""
    parts = name.split(".")
    return array.ndim >= 2 and parts[0] not in ("embed", "pos") and parts[-1] not in KEEP


def quantize_weights(model, fmt, *, group_size=None):
    """A model sharing nothing it quantises with `model` (the rest shared), whose Linear
    weights are dequantize(quantize(W)) with groups along the input axis.

    Inputs:  model an LM; fmt "int8", "fp8" or "int4"; group_size as quantize's (a divisor of
             each Din; default: quantize's default for that Din).
    Returns: (the quantised model, report {"params": weights quantised, "float_bytes": their
             bytes in the model's dtype, "quantized_bytes": codes + float32 scales}).
    """
    twin = model.replica()
    report = dict(params=0, float_bytes=0, quantized_bytes=0)
    for name, p in twin.named_parameters():
        if not quantizable(name, p.data):
            continue
        w = np.ascontiguousarray(np.swapaxes(p.data, -1, -2))  # (..., Dout, Din)
        q = quantize(w, fmt, group_size=group_size)  # groups along Din
        p.data = np.ascontiguousarray(np.swapaxes(q.dequantize(), -1, -2))  # (..., Din, Dout)
        report["params"] += p.data.size
        report["float_bytes"] += p.data.nbytes
        report["quantized_bytes"] += q.nbytes
    return twin, report
