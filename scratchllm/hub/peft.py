"""LoRA adapters on the projections of any LM, named as Hugging Face names them, saved and
loaded in peft's format (huggingface/peft: src/peft/tuners/lora/config.py LoraConfig,
src/peft/utils/save_and_load.py get_peft_model_state_dict):

    adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R,
                                "lora_alpha": alpha, "target_modules": [...], "bias": "none",
                                "fan_in_fan_out": false, "use_rslora": false, ...}
    adapter_model.safetensors  base_model.model.<module>.lora_A.weight (R, Din)
                               base_model.model.<module>.lora_B.weight (Dout, R)
<module> is the HF module of the projection ("model.layers.0.self_attn.q_proj"); peft's
lora_A and lora_B are nn.Linear weights (out, in), the transposes of the library's A (Din, R)
and B (R, Dout). The scale is lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).

A projection the library keeps as a plain Param W (Din, Dout) trains through the merged pair
(core/lora.py lora_merge_forward/_backward): before a step `merge` sets W = W0 + s A B, the
model's forward and backward run unchanged, and `backward` turns W's gradient into A's and
B's (W0 stays frozen). `unmerge` puts W0 back bit for bit.
Targets are the last part of the module name (peft's target_modules list): "q_proj",
"v_proj", ... A projection is a target when its HF tensor is a 2-D weight made of library
weights: one, transposed (nn.Linear's (out, in)), or stored as is (transformers' Conv1D,
(in, out): GPT-2's c_attn, c_proj, c_fc; peft's fan_in_fan_out), and fused ones whose
library weights sit side by side along the output axis (GPT-2's c_attn = [wq | wk | wv]):
one adapter (A (Din, R), B (R, Dq + Dk + Dv)) on the fused projection, its update split over
the library weights as the checkpoint's columns are,
    [Wq' | Wk' | Wv'] = [Wq0 | Wk0 | Wv0] + s A B,   d(s A B) = [dWq' | dWk' | dWv'].
peft's layout is the same for both kinds (lora_A (R, Din), lora_B (Dout, R)); its config says
fan_in_fan_out true for Conv1D targets (peft sets it itself for them), and a model's targets
must be all Linear or all Conv1D.
"""
import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
from safetensors.numpy import load_file, save_file

from scratchllm.core import LoRAFactors, Param, lora_merge_backward, lora_merge_forward
from scratchllm.core.atomic import atomic_write, write_text
from scratchllm.core.nn import normal_init
from scratchllm.core.validate import expect_finite, expect_integer
from scratchllm.hub.registry import family_for, flat_of

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."


class Site(NamedTuple):
    """One adapted projection: its library weights (several: fused, side by side along the
    output axis), W0 = their base values side by side (Din, Dout), the adapter's Params."""
    weights: tuple  # the library Params, e.g. (wq,) or (wq, wk, wv)
    W0: np.ndarray  # (Din, Dout) the frozen base, the weights concatenated on the last axis
    A: Param  # (Din, R)
    B: Param  # (R, Dout)


def lora_sites(model):
    """{HF module name: (library Param names, conv1d)} of every projection an adapter can sit
    on: a 2-D weight of one or more (fused) library weights; conv1d True when the HF tensor is
    stored (in, out) (transformers' Conv1D), False for nn.Linear's (out, in)."""
    f = flat_of(model.cfg)
    params = dict(model.named_parameters())
    return {e.hf[:-len(".weight")]: (tuple(e.lib), not e.transpose)
            for e in family_for(f).names(model, f)
            if e.hf.endswith(".weight") and e.expert is None and not e.buffer
            and e.unsqueeze is None and e.reshape is None and e.groups is None
            and e.scale == 1.0
            and all(n in params and params[n].data.ndim == 2 and not n.endswith(".E")
                    for n in e.lib)}  # .E: an embedding table, not a projection


def _concat(arrays):
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays, axis=-1)


def _interleaved_projections(model):
    """The module names (last part) of projections whose tensor interleaves several library
    arrays head group by head group (Qwen3-Next's q_proj: each head's query, then its output
    gate) or holds them rescaled (RWKV's rescale_every): no adapter sits on them yet."""
    f = flat_of(model.cfg)
    return {e.hf[:-len(".weight")].rsplit(".", 1)[-1] for e in family_for(f).names(model, f)
            if e.hf.endswith(".weight") and (e.groups is not None or e.scale != 1.0)}


class LoRA:
    """Adapters of rank R on the target projections of an LM (module docstring). Params: A
    (Din, R) ~ N(0, 1/Din) and B (R, Dout) = 0 per module (B = 0: the model as it was)."""

    def __init__(self, model, rank, *, alpha=None, targets=("q_proj", "v_proj"), rng=None,
                 rslora=False):
        self.rank = expect_integer("LoRA", "rank", rank, 1)
        self.alpha = float(rank if alpha is None else expect_finite("LoRA", "alpha", alpha))
        self.rslora = bool(rslora)
        self.scale = self.alpha / (math.sqrt(rank) if rslora else rank)
        self.model, self.targets = model, tuple(targets)
        sites = lora_sites(model)
        chosen = {m: lib for m, lib in sites.items() if m.rsplit(".", 1)[-1] in self.targets}
        mixed = sorted(_interleaved_projections(model) & set(self.targets))
        if mixed:  # else the adapters would silently leave them out
            raise ValueError(f"LoRA: targets {mixed} are projections this model keeps "
                             f"interleaved or rescaled in their tensor; an adapter on them is "
                             f"not implemented: choose among "
                             f"{sorted({m.rsplit('.', 1)[-1] for m in sites})}")
        if not chosen:
            names = sorted({m.rsplit(".", 1)[-1] for m in sites})
            raise ValueError(f"LoRA: no projection matches targets {list(self.targets)}; this "
                             f"model has {names}")
        kinds = {conv for _, conv in chosen.values()}
        if len(kinds) > 1:
            raise ValueError(f"LoRA: targets {list(self.targets)} mix nn.Linear and Conv1D "
                             f"projections; peft's fan_in_fan_out is one flag: adapt one kind")
        self.conv1d = kinds.pop()
        params = dict(model.named_parameters())
        rng = np.random.default_rng(0) if rng is None else rng
        self.sites = {}  # module -> Site(weights, W0, A, B)
        for module, (libs, _) in sorted(chosen.items()):
            weights = tuple(params[n] for n in libs)
            W0 = _concat([w.data for w in weights]).copy()  # (Din, Dout)
            d_in, d_out = W0.shape
            A = Param(normal_init(rng, (d_in, rank), d_in ** -0.5, W0.dtype))
            B = Param(np.zeros((rank, d_out), W0.dtype))
            self.sites[module] = Site(weights, W0, A, B)
        self._caches = {}

    def parameters(self):
        """The adapters' Params [A, B, ...] (what trains)."""
        return [p for site in self.sites.values() for p in (site.A, site.B)]

    @staticmethod
    def _split(weights, W):
        """Write W (Din, Dout) into the library weights, side by side along the last axis."""
        start = 0
        for w in weights:
            w.data[...] = W[:, start:start + w.data.shape[1]]
            start += w.data.shape[1]

    def merge(self):
        """W = W0 + s A B in every target (before each training forward; for inference)."""
        for module, (weights, W0, A, B) in self.sites.items():
            W, self._caches[module] = lora_merge_forward(
                W0, LoRAFactors(A.data, B.data), scale=self.scale)  # (Din, Dout)
            self._split(weights, W)

    def backward(self):
        """After the model's backward: A.grad, B.grad += from the weights' gradients (which
        are then zeroed: W0 does not train)."""
        for module, (weights, _, A, B) in self.sites.items():
            dW = _concat([w.grad for w in weights])  # (Din, Dout): the fused weight's gradient
            g = lora_merge_backward(dW, self._caches[module])["w"]  # fwd: W = W0 + s A B
            A.grad += g.A
            B.grad += g.B
            for w in weights:
                w.grad[...] = 0

    def unmerge(self):
        """W = W0 in every target: the base model back, bit for bit."""
        for weights, W0, _, _ in self.sites.values():
            self._split(weights, W0)

    def state(self):
        """{peft tensor name: array} in peft's layout (module docstring)."""
        out = {}
        for module, (_, _, A, B) in self.sites.items():  # Linear and Conv1D alike
            out[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(A.data.T)
            out[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(B.data.T)
        return out

    def config(self, base_model=None):
        """adapter_config.json's fields (LoraConfig's; what peft reads back)."""
        return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": self.rank,
                "lora_alpha": self.alpha, "target_modules": sorted(self.targets),
                "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": self.conv1d,
                "use_rslora": self.rslora, "use_dora": False, "inference_mode": True,
                "init_lora_weights": True, "modules_to_save": None, "layers_to_transform": None,
                "rank_pattern": {}, "alpha_pattern": {},
                "base_model_name_or_path": None if base_model is None else str(base_model)}


def save_adapter(lora, path, base_model=None):
    """Write adapter_config.json and adapter_model.safetensors (float32) into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.astype(np.float32) for k, v in lora.state().items()}
    atomic_write(path / ADAPTER_WEIGHTS,
                 lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    write_text(path / ADAPTER_CONFIG, json.dumps(lora.config(base_model), indent=2) + "\n")
    return path


def _check_config(path, c):
    bad = {"peft_type": c.get("peft_type") != "LORA", "bias": c.get("bias", "none") != "none",
           "use_dora": bool(c.get("use_dora")),
           "rank_pattern": bool(c.get("rank_pattern")),
           "alpha_pattern": bool(c.get("alpha_pattern"))}
    refused = [k for k, b in bad.items() if b]
    if refused:
        found = ", ".join(f"{k}={c.get(k)!r}" for k in refused)
        raise ValueError(f"load_adapter: {path} has {found}; this reads plain LoRA (peft_type "
                         f"LORA, bias none, no DoRA, one rank and alpha for every module)")


def load_adapter(model, path):
    """The LoRA a peft adapter directory holds, on `model` (its base), not yet merged."""
    path = Path(path)
    c = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    _check_config(path, c)
    tensors = load_file(str(path / ADAPTER_WEIGHTS))
    modules = sorted({k[len(PREFIX):-len(".lora_A.weight")] for k in tensors
                      if k.startswith(PREFIX) and k.endswith(".lora_A.weight")})
    sites = lora_sites(model)
    unknown = [m for m in modules if m not in sites]
    if not modules or unknown:
        raise ValueError(f"load_adapter: {path}: modules {unknown or modules} are not "
                         f"projections of this model (it has e.g. {sorted(sites)[:3]})")
    targets = sorted({m.rsplit(".", 1)[-1] for m in modules})
    lora = LoRA(model, int(c["r"]), alpha=float(c["lora_alpha"]), targets=targets,
                rslora=bool(c.get("use_rslora")))
    if bool(c.get("fan_in_fan_out")) != lora.conv1d:
        raise ValueError(f"load_adapter: {path} has fan_in_fan_out="
                         f"{c.get('fan_in_fan_out')!r}, but its modules are "
                         f"{'Conv1D' if lora.conv1d else 'nn.Linear'} projections here")
    missing = sorted(set(lora.sites) - set(modules))
    if missing:  # targets named by suffix reach modules the file lacks (layers_to_transform)
        for m in missing:
            del lora.sites[m]
    for module, (_, _, A, B) in lora.sites.items():
        a = tensors[f"{PREFIX}{module}.lora_A.weight"]
        b = tensors[f"{PREFIX}{module}.lora_B.weight"]
        if a.shape != A.data.T.shape or b.shape != B.data.T.shape:
            raise ValueError(f"load_adapter: {module}: lora_A {a.shape}, lora_B {b.shape}; "
                             f"expected {A.data.T.shape}, {B.data.T.shape} (r={lora.rank})")
        A.data[...], B.data[...] = a.T, b.T
    return lora
