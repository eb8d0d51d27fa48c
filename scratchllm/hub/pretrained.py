"""Load, save and inspect Hugging Face checkpoints as scratchllm LMs.

A checkpoint directory holds config.json (the architecture: its model_type's record in
registry.py, chosen once per load or save and passed along) and the weights in
safetensors files: model.safetensors, or shards listed by model.safetensors.index.json
({"weight_map": {tensor name: file name}}). safetensors' NumPy API reads float32, float16 and
bfloat16 (through ml_dtypes) into arrays; torch is never imported.

    load_pretrained(path, dtype)  -> LM   every tensor checked by name and shape (the
                                          family's model_class: MaskedLM for bert)
    save_pretrained(model, path)          config.json + model.safetensors, loadable by
                                          transformers.AutoModelForCausalLM.from_pretrained
    state_dict(model), grad_dict(model)   {HF name: array} in HF's layouts (the family's
                                          names: layout.py)

Reference: huggingface/safetensors bindings/python/py_src/safetensors/numpy.py;
huggingface/transformers src/transformers/modeling_utils.py (the index file, tied weights).
"""
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from scratchllm.core.atomic import atomic_write, write_text
from scratchllm.core.nn import NO_DRAWS
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.layout import from_hf, hf_shape, to_hf, whole_target
from scratchllm.hub.mapped import MappedSafetensors
from scratchllm.hub.registry import (config_from_flat, family_for, family_named, flat_of,
                                     module_family_for)
from scratchllm.lm import LM
from scratchllm.tokenizer import from_tokenizer_json

LOAD_THREADS = 2
CONFIG, WEIGHTS, INDEX = "config.json", "model.safetensors", "model.safetensors.index.json"
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
          "float64": np.float64}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")  # old buffers


def read_hf_config(path):
    """config.json of a checkpoint directory as a dict; ValueError if it is not one."""
    path = Path(path)
    if not (path / CONFIG).is_file():
        raise ValueError(f"load_pretrained: {path} is not a Hugging Face checkpoint directory "
                         f"(no {CONFIG})")
    return json.loads((path / CONFIG).read_text(encoding="utf-8"))


def weight_files(path):
    """{tensor name: safetensors file} of a checkpoint: one file or an index of shards."""
    path = Path(path)
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text(encoding="utf-8"))["weight_map"]
        return {name: path / file for name, file in weight_map.items()}
    if not (path / WEIGHTS).is_file():
        raise ValueError(f"load_pretrained: {path} has no {WEIGHTS} or {INDEX} (only "
                         f"safetensors weights are read)")
    with safe_open(path / WEIGHTS, framework="np") as f:
        return {name: path / WEIGHTS for name in f.keys()}


def _canonical(name, family):
    """A tensor's name as the family's names() give it: checkpoints of the headless model
    (GPT-2's GPT2Model, openai-community/gpt2) leave out the family's bare_prefix; older
    checkpoints of a ModuleFamily put its old_prefix first; older names are renamed
    (renames)."""
    if isinstance(family, ModuleFamily):
        name = name.removeprefix(family.old_prefix) if family.old_prefix else name
    else:
        prefix = family.bare_prefix
        if prefix and not name.startswith((prefix, "lm_head.")):
            name = prefix + name
    for old, new in family.renames:  # older checkpoints' names (BERT's LayerNorm.gamma)
        name = name.replace(old, new)
    return name


def _load_into(path, stored, by_hf, arrays):
    """Read every wanted tensor into the model's arrays, one shard open (memory-mapped) at a
    time; stored maps a name to (file, the name inside the file). LOAD_THREADS threads: one
    reads a tensor while another transposes the last (reads and NumPy's copies release the
    GIL)."""
    by_file = {}
    for name in by_hf:
        by_file.setdefault(stored[name][0], []).append(name)
    for file, names in by_file.items():
        with MappedSafetensors(file) as f, ThreadPoolExecutor(LOAD_THREADS) as pool:
            list(pool.map(lambda n: _place(path, by_hf[n], f, stored[n][1], arrays), names))


def _place(path, e, f, name, arrays):
    """Check an HF tensor's shape against its library arrays and write it into them in place:
    read straight into the array when it is the tensor as stored (same dtype and order), else
    through the map (layout.from_hf: transposed, split, squeezed or an expert's slice, cast to
    their dtype), whose pages are then dropped. No tensor is copied twice; an MoE expert is
    one slice of its stacked array, so threads write disjoint memory."""
    dtype, shape = f.dtype_shape(name)
    want = hf_shape(e, arrays)
    if shape != want:
        raise ValueError(f"load_pretrained: {path}: tensor {e.hf!r} has shape {shape}, "
                         f"expected {want} from config.json")
    target = whole_target(e, arrays)
    if target is not None and target.dtype == dtype and target.flags.c_contiguous:
        f.read_into(name, target)
        return
    from_hf(e, f.view(name), arrays)
    f.release(name)


def _check_names(path, f, stored, expected, tied=("lm_head.weight",), unused=()):
    """ValueError naming the tensors the checkpoint lacks, or has beyond `expected` (the
    family's names for the config's flat view f; with a tied head, the `tied` copies of the
    embedding may be there too, and tensors under the `unused` prefixes)."""
    missing = sorted(expected - set(stored))
    if missing:
        raise ValueError(f"load_pretrained: {path}: tensor(s) {missing[:5]} missing "
                         f"({len(missing)} in all) for {f.name} with {f.n_layers} layers")
    extra = sorted(n for n in set(stored) - expected
                   if not n.endswith(IGNORED_SUFFIXES) and not n.startswith(unused))
    if getattr(f, "tie_embeddings", False):  # a tied head saved anyway: it is embed_tokens
        extra = [n for n in extra if n not in tied]
    if extra:
        raise ValueError(f"load_pretrained: {path}: unexpected tensor(s) {extra[:5]} "
                         f"({len(extra)} in all) for {f.name} (config.json does not "
                         f"describe them)")


def load_pretrained(path, dtype=np.float32):
    """The LM of a Hugging Face checkpoint directory, its weights cast to `dtype`.

    Inputs:  path (config.json + model.safetensors or a sharded index), dtype float32 or
             float64 (the compute dtype; the files may hold float32, float16 or bfloat16).
    Returns: the family's model_class (LM; MaskedLM for an encoder) whose cfg.name is the
             model_type (or the Module of a ModuleFamily: a VisionTransformer);
             model.hf_config keeps config.json.
    Raises:  ValueError naming the field (unsupported model_type or option) or the tensor
             (missing, unexpected, wrong shape).
    """
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"load_pretrained: dtype must be float32 or float64 (the compute "
                         f"dtype), got {np.dtype(dtype)}")
    hf = read_hf_config(path)
    family = family_named(hf.get("model_type"))
    stored = {_canonical(n, family): (file, n) for n, file in weight_files(path).items()}
    if isinstance(family, ModuleFamily):  # a model of its own class: its config is the view
        f = _untie(family, family.from_hf(hf), stored)
        model = family.build(f, rng=NO_DRAWS, dtype=dtype)
        tied = family.tied_head[:1]
    else:
        cfg = config_from_flat(family.from_hf(hf))
        if cfg.mtp is not None:  # the MTP layers config.json counts that the file holds
            held = family.mtp_layers(flat_of(cfg), stored)
            cfg = dataclasses.replace(cfg, mtp=dataclasses.replace(cfg.mtp, depth=held)
                                      if held else None)
        model = family.model_class(cfg, rng=NO_DRAWS, dtype=dtype)
        f, tied = flat_of(cfg), family.tied_names
    table = family.names(model, f)
    copies = {e.hf for e in table if e.copy}  # optional: checked by mtp_layers when there
    _check_names(path, f, {n: w for n, w in stored.items() if n not in copies},
                 {e.hf for e in table} - copies, tied, family.unused)
    _load_into(path, stored, {e.hf: e for e in table if not e.copy},
               _library_arrays(model, "data"))
    model.hf_config = hf
    return model


def _untie(family, cfg, stored):
    """cfg, untied (tie_embeddings False) when the checkpoint holds the family's tied head
    tensor with values other than the embedding's (transformers 5 ties T5's head whenever
    the two agree, whatever config.json says)."""
    if not family.tied_head or not getattr(cfg, "tie_embeddings", False) \
            or family.tied_head[0] not in stored:
        return cfg
    head, embed = (stored[n] for n in family.tied_head)
    with safe_open(head[0], framework="np") as f:
        h = f.get_tensor(head[1])
    with safe_open(embed[0], framework="np") as f:
        e = f.get_tensor(embed[1])
    return cfg if np.array_equal(h, e) else dataclasses.replace(cfg, tie_embeddings=False)


def _library_arrays(model, attr):
    """{library name: array} of every Param's `attr` (data or grad), and of the buffers for
    data."""
    arrays = {name: getattr(p, attr) for name, p in model.named_parameters()}
    return {**arrays, **dict(model.named_buffers())} if attr == "data" else arrays


def _hf_arrays(model, table, attr):
    """{HF name: array} of the Params' `attr` (data: and the buffers; grad), for the Entries
    of `table` (a family's names)."""
    arrays = _library_arrays(model, attr)
    return {e.hf: to_hf(e, arrays, attr == "grad") for e in table
            if attr == "data" or not (e.buffer or e.copy)}


def _saved_as(model):
    """(family, view) of the family the model's config saves as and the view its records
    read: an LM's flat view, or the config itself for a model of its own class."""
    if isinstance(model, LM):
        f = flat_of(model.cfg)
        return family_for(f), f
    return module_family_for(model.cfg), model.cfg


def _table(model):
    """The Entries of the family the model's config saves as."""
    family, f = _saved_as(model)
    return family.names(model, f)


def state_dict(model):
    """{HF parameter name: weight} in HF's layouts (a projection weight is (out, in)); copies
    where the layout differs. A tied head appears once, as model.embed_tokens.weight."""
    return _hf_arrays(model, _table(model), "data")


def grad_dict(model):
    """{HF parameter name: gradient} after a backward, in the layouts of state_dict."""
    return _hf_arrays(model, _table(model), "grad")


def save_pretrained(model, path, dtype=None):
    """Write config.json and model.safetensors for transformers' from_pretrained.

    Inputs: model an LM whose config a family of registry.py expresses (family_for), or a
            model a ModuleFamily expresses (module_family_for); path a
            directory (created); dtype "float32" | "float16" | "bfloat16" | "float64"
            (default: the model's).
    Raises: ValueError naming what the family cannot express, before anything is written.
    """
    family, f = _saved_as(model)
    name = dtype or np.dtype(model.dtype).name
    if name not in DTYPES:
        raise ValueError(f"save_pretrained: dtype must be one of {sorted(DTYPES)}, got {name!r}")
    hf = family.to_hf(f, name, getattr(model, "hf_config", None))
    tensors = {k: v.astype(DTYPES[name], copy=False)
               for k, v in _hf_arrays(model, family.names(model, f), "data").items()}
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    atomic_write(path / WEIGHTS, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    (path / INDEX).unlink(missing_ok=True)  # a shard index left there would win on loading
    write_text(path / CONFIG, json.dumps(hf, indent=2) + "\n")



def load_tokenizer(path):
    """The tokenizer of a checkpoint directory's tokenizer.json (any normalizer, pre-tokenizer,
    model and decoder), encoding as Hugging Face `tokenizers` does
    (scratchllm/tokenizer/hf_json.py)."""
    file = Path(path) / "tokenizer.json"
    if not file.is_file():
        raise ValueError(f"load_tokenizer: {path} has no tokenizer.json")
    return from_tokenizer_json(file)


def eos_ids(path):
    """The set of end-of-sequence ids of a checkpoint directory, where transformers' generate
    stops: eos_token_id (an int or a list) of generation_config.json, else of config.json."""
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id") \
            if file.is_file() else None
        if eos is not None:
            return {eos} if isinstance(eos, int) else set(eos)
    return set()
