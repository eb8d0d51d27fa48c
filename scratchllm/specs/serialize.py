"""ModelConfig <-> a JSON-able dict (checkpoints' config.json).

Format 2 writes each distinct LayerSpec once under "specs" and the layers as a list of their
keys: {"format": 2, "name": ..., "specs": {"0": {...}}, "layers": ["0", "0", "1", ...]}; a spec
is {"spec": class name, field: value, ...}, nested specs likewise. A dict without "format" is a
flat config of the first format (every checkpoint written before specs) and goes through
from_flat, so those checkpoints still load.
"""
import dataclasses

from scratchllm.specs.attention import (AttentionSpec, Mask, RelativeBiasSpec, RopeSpec,
                                        ScoresSpec, TemperatureSpec)
from scratchllm.specs.ffn import ExpertsSpec, FFNSpec, MoESpec, RouterSpec
from scratchllm.specs.flat import from_flat
from scratchllm.specs.mixers import (GatedDeltaNetSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                     RWKVSpec)
from scratchllm.specs.mla import IndexerSpec, MLASpec
from scratchllm.specs.model import HeadSpec, LayerSpec, ModelConfig, MTPSpec, NormSpec

FORMAT = 2
SPECS = {c.__name__: c for c in (AttentionSpec, Mask, MLASpec, RopeSpec, ExpertsSpec, FFNSpec,
                                 MoESpec, RouterSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                 RWKVSpec, LayerSpec, NormSpec, HeadSpec, RelativeBiasSpec,
                                 IndexerSpec, TemperatureSpec, MTPSpec, ScoresSpec,
                                 GatedDeltaNetSpec)}
# fields a spec has since moved into a sub-spec: {spec: (sub-spec field, its class, names)};
# saved configs of before keep loading (AttentionSpec's impl, block and softcap: .scores)
MOVED = {"AttentionSpec": ("scores", "ScoresSpec", ("impl", "block", "softcap"))}
TRUNK = ("name", "vocab_size", "d_model", "tie_embeddings", "embed_scale", "positions",
         "max_positions", "type_vocab_size", "embed_norm", "final_norm", "pad_id",
         "logit_softcap")


def spec_to_dict(spec):
    """A spec as {"spec": class name, field: value}; nested specs likewise."""
    out = {"spec": type(spec).__name__}
    for f in dataclasses.fields(spec):
        v = getattr(spec, f.name)
        out[f.name] = spec_to_dict(v) if type(v).__name__ in SPECS else v
    return out


def spec_from_dict(d):
    """Inverse of spec_to_dict; an unknown spec or field is a ValueError naming it."""
    if not isinstance(d, dict) or d.get("spec") not in SPECS:
        raise ValueError(f"config: expected a spec {{'spec': one of {sorted(SPECS)}, ...}}, "
                         f"got {d!r}")
    cls = SPECS[d["spec"]]
    d = _moved_in(d)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known - {"spec"})
    if unknown:
        raise ValueError(f"config: {cls.__name__} has no field(s) {unknown}; known: "
                         f"{sorted(known)}")
    return cls(**{k: spec_from_dict(v) if isinstance(v, dict) and "spec" in v else
                  tuple(v) if isinstance(v, list) else v  # JSON lists were tuples
                  for k, v in d.items() if k != "spec"})


def _moved_in(d):
    """d with the fields MOVED names gathered into their sub-spec (a config saved before the
    move), else d itself."""
    field, sub, names = MOVED.get(d["spec"], (None, None, ()))
    old = {k: d[k] for k in names if k in d}
    if not old:
        return d
    if field in d:
        raise ValueError(f"config: {d['spec']} gives {sorted(old)} and {field!r}; {field} "
                         f"holds them now, give one")
    return {**{k: v for k, v in d.items() if k not in old}, field: {"spec": sub, **old}}


FLAT_IDENTITY = ("vocab_size", "d_model", "n_layers", "n_heads")  # every flat config has them


def _require(d, keys, what):
    """ValueError naming the keys of `keys` that the dict d lacks (never a default model)."""
    missing = [k for k in keys if k not in d]
    if missing:
        raise ValueError(f"config: {what} must give {list(keys)}; missing {missing}")


def to_dict(cfg):
    """The config as a JSON-able dict of format 2."""
    keys, specs = [], {}
    for layer in cfg.layers:
        d = spec_to_dict(layer)
        key = next((k for k, v in specs.items() if v == d), str(len(specs)))
        specs[key] = d
        keys.append(key)
    trunk = {name: getattr(cfg, name) for name in TRUNK}
    if cfg.mtp is not None:  # written only when set: files without MTP stay as they were
        trunk["mtp"] = spec_to_dict(cfg.mtp)
    return {"format": FORMAT, **trunk, "norm": spec_to_dict(cfg.norm),
            "head": spec_to_dict(cfg.head), "specs": specs, "layers": keys}


def from_dict(d):
    """Inverse of to_dict; a dict of the flat first format goes through from_flat; a newer
    format is a ValueError naming it."""
    if not isinstance(d, dict):
        raise ValueError(f"config: expected a dict, got {type(d).__name__}")
    if "format" not in d:
        _require(d, FLAT_IDENTITY, "a flat config (the first format)")
        return from_flat(**d)
    if d["format"] != FORMAT:
        raise ValueError(f"config: format {d['format']!r} is not one this version reads "
                         f"({FORMAT}, or the flat first format); upgrade scratchllm")
    unknown = sorted(set(d) - set(TRUNK) - {"format", "norm", "head", "specs", "layers", "mtp"})
    if unknown:
        raise ValueError(f"config: unknown field(s) {unknown}")
    _require(d, ("norm", "specs", "layers"), f"a config of format {FORMAT}")
    if not isinstance(d["specs"], dict) or not isinstance(d["layers"], list):
        raise ValueError(f"config: 'specs' must be an object and 'layers' a list, got "
                         f"{type(d['specs']).__name__} and {type(d['layers']).__name__}")
    specs = {k: spec_from_dict(v) for k, v in d["specs"].items()}
    missing = sorted(set(d["layers"]) - set(specs))
    if missing:
        raise ValueError(f"config: layers name spec(s) {missing} that 'specs' lacks")
    head = {"head": spec_from_dict(d["head"])} if "head" in d else {}  # older: the default
    if "mtp" in d:
        head["mtp"] = spec_from_dict(d["mtp"])
    return ModelConfig(**{n: d[n] for n in TRUNK if n in d}, norm=spec_from_dict(d["norm"]),
                       layers=tuple(specs[k] for k in d["layers"]), **head)
