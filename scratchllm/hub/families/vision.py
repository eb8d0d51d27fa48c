"""The vision families: ViT (ViTForImageClassification), SigLIP's vision tower
(SiglipVisionModel) and CLIP's (CLIPVisionModel: as SigLIP's names, with [CLS] as
embeddings.class_embedding (D,), no patch bias, pre_layrnorm = pre_norm, and post_layernorm
on the [CLS] vector alone). Both are the library's VisionTransformer (scratchllm/vision): patch
embedding, pre-norm blocks of bidirectional MHA with biases and a GELU MLP with biases
(LayerNorm), a final LayerNorm; ViT adds [CLS] and a linear classifier on it.

    library              vit: ViTForImageClassification   siglip_vision_model
    embed.W (C*P*P, D)   E.patch_embeddings.projection    embeddings.patch_embedding
                         .weight (D, C, P, P): W^T reshaped (the same)
    embed.b              E.patch_embeddings.projection    embeddings.patch_embedding.bias
                         .bias
    embed.cls (D,)       E.cls_token (1, 1, D)            -
    embed.pos (N', D)    E.position_embeddings            embeddings.position_embedding
                         (1, N + 1, D)                    .weight (N, D)
    layers.i.norm1, 2    L.layernorm_before, _after       S.layer_norm1, 2
    layers.i.mixer.wq..  L.attention.attention.query,     S.self_attn.q_proj, k_proj,
    (bq, bk, bv)         key, value                       v_proj
    layers.i.mixer.wo,bo L.attention.output.dense         S.self_attn.out_proj
    layers.i.ffn.W1, b1  L.intermediate.dense             S.mlp.fc1
    layers.i.ffn.W2, b2  L.output.dense                   S.mlp.fc2
    norm.g, norm.b       vit.layernorm                    post_layernorm
    head.W, head.b       classifier (n_labels, D)         -
with E = vit.embeddings., L = vit.encoder.layer.i., S = encoder.layers.i.; norms and biases
are .weight and .bias of those. Matrices are transposed ((out, in) in torch). transformers 5
saves ViT under these (older) names and converts them on loading; SigLIP towers saved by
transformers 4 put "vision_model." before every name (dropped on loading).

Reference: huggingface/transformers src/transformers/models/vit/modeling_vit.py;
huggingface/transformers src/transformers/models/siglip/modeling_siglip.py.

Glossary: C channels, P patch side, N patches, N' tokens, D model width.
"""
from types import SimpleNamespace

from scratchllm.hub.families.base import differences, fail_config, over, refuse, require
from scratchllm.hub.families.defaults import with_defaults
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.layout import Entry
from scratchllm.specs import AttentionSpec, FFNSpec, LayerSpec, Mask, NormSpec
from scratchllm.specs.vision import PatchSpec, VisionConfig
from scratchllm.vision import VisionTransformer

_GELU = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh",  # HF ACT2FN names
         "quick_gelu": "quick"}
_ACT = {"none": "gelu", "tanh": "gelu_pytorch_tanh", "quick": "quick_gelu"}  # and back
_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


def _square(hf, field, default):
    """An int, or a [height, width] list, of config.json; (height, width)."""
    v = hf.get(field, default)
    return (v, v) if isinstance(v, int) else tuple(v)


def _config(hf, family, *, cls_token, qkv_bias, eps, n_labels, pool=False, clip=False):
    """The VisionConfig of a ViT-style config.json (the fields the families share); clip:
    no patch bias, a pre-norm, the final norm on [CLS] alone."""
    require(hf, _FIELDS, family)
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        fail_config(f"hidden_act = {act!r} is not implemented for {family} (only "
                    f"{sorted(_GELU)})")
    patch = _square(hf, "patch_size", 16)
    if patch[0] != patch[1]:
        fail_config(f"patch_size = {hf['patch_size']!r}: only square patches are implemented")
    D, H = hf["hidden_size"], hf["num_attention_heads"]
    norm = NormSpec("layernorm", float(hf.get("layer_norm_eps", eps)))
    attn = AttentionSpec(H, H, head_dim=hf.get("head_dim"), qkv_bias=qkv_bias, o_bias=True,
                         rope=None, mask=Mask(causal=False))
    layer = LayerSpec(attn, FFNSpec("gelu_mlp", hf["intermediate_size"], gelu_approx=_GELU[act]),
                      norm)
    return VisionConfig(name=family, d_model=D, layers=(layer,) * hf["num_hidden_layers"],
                        patch=PatchSpec(_square(hf, "image_size", 224), patch[0],
                                        hf.get("num_channels", 3), cls_token=cls_token,
                                        patch_bias=not clip),
                        norm=norm, n_labels=n_labels, pool=layer if pool else None,
                        pre_norm=norm if clip else None, norm_cls=clip)


def _common_hf(cfg, family, dtype_name, base):
    """config.json fields both families write."""
    layer = cfg.layers[0]
    hf = over(base)
    size = cfg.patch.image_size
    hf.update(architectures=[family.architecture], model_type=family.model_type,
              hidden_size=cfg.d_model, intermediate_size=layer.ffn.d_ff,
              num_hidden_layers=cfg.n_layers, num_attention_heads=layer.mixer.n_heads,
              num_channels=cfg.patch.n_channels, patch_size=cfg.patch.patch_size,
              image_size=size[0] if size[0] == size[1] else list(size),
              hidden_act=_ACT[layer.ffn.gelu_approx],
              layer_norm_eps=cfg.norm.eps, dtype=dtype_name)
    if layer.mixer.head_dim is not None:
        hf["head_dim"] = layer.mixer.head_dim
    return hf


def _needs(cfg, *, cls_token, n_labels, qkv_bias=None, pool=False, clip=False):
    """(got, need): the options of cfg a family decides on, by name, and what the family
    needs of each (for refuse). pool: the family's pooling head, which must be the blocks'
    own LayerSpec ("pool" is "blocks'" then, "none" without a head)."""
    first = cfg.layers[0]
    same = all(layer == first for layer in cfg.layers)
    a, ffn = first.mixer, first.ffn
    got = dict(cls_token=cfg.patch.cls_token, labels=bool(cfg.n_labels),
               same_layers=same, attention=type(a).__name__, mha=a.n_heads == a.n_kv_heads,
               qkv_bias=getattr(a, "qkv_bias", None), o_bias=getattr(a, "o_bias", None),
               qk_norm=getattr(a, "qk_norm", None), scale=getattr(a, "scale", None),
               ffn=getattr(ffn, "kind", None), norm=first.norm.kind,
               placement=first.placement, same_norms=first.norm == cfg.norm,
               pool="none" if cfg.pool is None else "blocks'" if cfg.pool == first else "other",
               patch_bias=cfg.patch.patch_bias, norm_cls=cfg.norm_cls,
               pre_norm="none" if cfg.pre_norm is None else "final's" if cfg.pre_norm == cfg.norm
               else "other")
    need = dict(cls_token=cls_token, labels=n_labels, same_layers=True,
                attention="AttentionSpec", mha=True, qkv_bias=got["qkv_bias"] if qkv_bias is
                None else qkv_bias, o_bias=True, qk_norm=False, scale=None, ffn="gelu_mlp",
                norm="layernorm", placement="pre", same_norms=True,
                pool="blocks'" if pool else "none", patch_bias=not clip, norm_cls=clip,
                pre_norm="final's" if clip else "none")
    return got, need


def _refuse(cfg, family, **needs):
    """base.refuse for what the family needs of cfg (_needs), read off a flat view."""
    got, need = _needs(cfg, **needs)
    view = SimpleNamespace(name=cfg.name, **got)
    refuse(view, family, differences(view, need))


# ---------------------------------------------------------------------------- vit
def _vit_from_hf(hf):
    id2label = hf.get("id2label")
    n_labels = len(id2label) if id2label else hf.get("num_labels", 2)
    return _config(hf, "vit", cls_token=True, qkv_bias=bool(hf.get("qkv_bias", True)),
                   eps=1e-12, n_labels=n_labels)


def _vit_to_hf(cfg, dtype_name, base=None):
    hf = _common_hf(cfg, VIT, dtype_name, base)
    labels = hf.get("id2label")
    if not labels or len(labels) != cfg.n_labels:
        hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(cfg.n_labels)}
        hf["label2id"] = {f"LABEL_{i}": i for i in range(cfg.n_labels)}
    hf.pop("num_labels", None)
    hf["qkv_bias"] = cfg.layers[0].mixer.qkv_bias
    return hf


_VIT_LAYER = {"norm1.g": "layernorm_before.weight", "norm1.b": "layernorm_before.bias",
              "norm2.g": "layernorm_after.weight", "norm2.b": "layernorm_after.bias",
              "mixer.wq": "attention.attention.query.weight",
              "mixer.bq": "attention.attention.query.bias",
              "mixer.wk": "attention.attention.key.weight",
              "mixer.bk": "attention.attention.key.bias",
              "mixer.wv": "attention.attention.value.weight",
              "mixer.bv": "attention.attention.value.bias",
              "mixer.wo": "attention.output.dense.weight",
              "mixer.bo": "attention.output.dense.bias",
              "ffn.W1": "intermediate.dense.weight", "ffn.b1": "intermediate.dense.bias",
              "ffn.W2": "output.dense.weight", "ffn.b2": "output.dense.bias"}
_SIGLIP_LAYER = {"norm1.g": "layer_norm1.weight", "norm1.b": "layer_norm1.bias",
                 "norm2.g": "layer_norm2.weight", "norm2.b": "layer_norm2.bias",
                 "mixer.wq": "self_attn.q_proj.weight", "mixer.bq": "self_attn.q_proj.bias",
                 "mixer.wk": "self_attn.k_proj.weight", "mixer.bk": "self_attn.k_proj.bias",
                 "mixer.wv": "self_attn.v_proj.weight", "mixer.bv": "self_attn.v_proj.bias",
                 "mixer.wo": "self_attn.out_proj.weight", "mixer.bo": "self_attn.out_proj.bias",
                 "ffn.W1": "mlp.fc1.weight", "ffn.b1": "mlp.fc1.bias",
                 "ffn.W2": "mlp.fc2.weight", "ffn.b2": "mlp.fc2.bias"}


def _entries(model, top, layer_prefix, layer_names, skip=()):
    """[Entry] of every Param but those in `skip`: `top` {library name: (HF name,
    transposed, reshape)}, and <layer_prefix>i.<layer_names[rest]> for layers.i.<rest>
    (matrices transposed)."""
    out = []
    for name, p in model.named_parameters():
        if name in skip:
            continue
        if name in top:
            hf, transpose, shape = top[name]
            out.append(Entry(hf, (name,), transpose, reshape=shape))
            continue
        _, i, rest = name.split(".", 2)  # "layers", i, "mixer.wq"
        out.append(Entry(f"{layer_prefix}{i}.{layer_names[rest]}", (name,), p.data.ndim == 2))
    return out


def _patch_shape(cfg):
    """The Conv2d weight's shape (D, C, P, P)."""
    P = cfg.patch.patch_size
    return (cfg.d_model, cfg.patch.n_channels, P, P)


def _vit_names(model, cfg):
    D, e = cfg.d_model, "vit.embeddings."
    top = {"embed.W": (e + "patch_embeddings.projection.weight", True, _patch_shape(cfg)),
           "embed.b": (e + "patch_embeddings.projection.bias", False, None),
           "embed.cls": (e + "cls_token", False, (1, 1, D)),
           "embed.pos": (e + "position_embeddings", False, (1, cfg.patch.n_positions, D)),
           "norm.g": ("vit.layernorm.weight", False, None),
           "norm.b": ("vit.layernorm.bias", False, None),
           "head.W": ("classifier.weight", True, None), "head.b": ("classifier.bias", False, None)}
    return _entries(model, top, "vit.encoder.layer.", _VIT_LAYER)


VIT = ModuleFamily(
    "vit", "ViTForImageClassification", _vit_from_hf, _vit_to_hf,
    claims=lambda cfg: isinstance(cfg, VisionConfig) and cfg.patch.cls_token
    and not cfg.norm_cls,
    check=lambda cfg: _refuse(cfg, "vit", cls_token=True, n_labels=True),
    build=VisionTransformer, names=_vit_names)


# ---------------------------------------------------------------------------- siglip
def _siglip_from_hf(hf):
    """vision_use_head: the attention-pooling head, of the blocks' own geometry."""
    hf = with_defaults("siglip_vision_model", hf)  # a sub-config may leave them out
    return _config(hf, "siglip_vision_model", cls_token=False, qkv_bias=True, eps=1e-6,
                   n_labels=0, pool=bool(hf.get("vision_use_head", True)))


def _siglip_to_hf(cfg, dtype_name, base=None):
    hf = _common_hf(cfg, SIGLIP_VISION, dtype_name, base)
    hf["vision_use_head"] = cfg.pool is not None
    return hf


_POOL = {"pool.wo": "attention.out_proj.weight", "pool.bo": "attention.out_proj.bias",
         "pool.norm.g": "layernorm.weight", "pool.norm.b": "layernorm.bias",
         "pool.mlp.W1": "mlp.fc1.weight", "pool.mlp.b1": "mlp.fc1.bias",
         "pool.mlp.W2": "mlp.fc2.weight", "pool.mlp.b2": "mlp.fc2.bias"}


def _pool_entries(cfg):
    """[Entry] of SigLIP's pooling head: head.probe (1, 1, D), the fused in_proj of
    torch's nn.MultiheadAttention ([q | k | v] weight (3D, D) and bias), the rest one each."""
    return [Entry("head.probe", ("pool.probe",), False, reshape=(1, 1, cfg.d_model)),
            Entry("head.attention.in_proj_weight", ("pool.wq", "pool.wk", "pool.wv"), True),
            Entry("head.attention.in_proj_bias", ("pool.bq", "pool.bk", "pool.bv"), False),
            *(Entry("head." + hf, (lib,), lib.endswith(("W1", "W2", "wo")))
              for lib, hf in _POOL.items())]


def _siglip_names(model, cfg):
    top = {"embed.W": ("embeddings.patch_embedding.weight", True, _patch_shape(cfg)),
           "embed.b": ("embeddings.patch_embedding.bias", False, None),
           "embed.pos": ("embeddings.position_embedding.weight", False, None),
           "norm.g": ("post_layernorm.weight", False, None),
           "norm.b": ("post_layernorm.bias", False, None)}
    pool = _pool_entries(cfg) if cfg.pool is not None else []
    lib = {n for e in pool for n in e.lib}
    return _entries(model, top, "encoder.layers.", _SIGLIP_LAYER, skip=lib) + pool


SIGLIP_VISION = ModuleFamily(
    "siglip_vision_model", "SiglipVisionModel", _siglip_from_hf, _siglip_to_hf,
    claims=lambda cfg: isinstance(cfg, VisionConfig) and not cfg.patch.cls_token,
    check=lambda cfg: _refuse(cfg, "siglip_vision_model", cls_token=False, n_labels=False,
                              qkv_bias=True, pool=cfg.pool is not None),
    build=VisionTransformer, names=_siglip_names, old_prefix="vision_model.")


# ---------------------------------------------------------------------------- clip
def _clip_from_hf(hf):
    """CLIPVisionModel: [CLS], no patch bias, pre_layrnorm, quick-GELU; its post_layernorm
    reads the [CLS] vector alone (pooler_output)."""
    hf = with_defaults("clip_vision_model", hf)  # LLaVA-1.5's leaves out hidden_act
    return _config(hf, "clip_vision_model", cls_token=True, qkv_bias=True, eps=1e-5,
                   n_labels=0, clip=True)


def _clip_to_hf(cfg, dtype_name, base=None):
    return _common_hf(cfg, CLIP_VISION, dtype_name, base)


def _clip_names(model, cfg):
    top = {"embed.W": ("embeddings.patch_embedding.weight", True, _patch_shape(cfg)),
           "embed.cls": ("embeddings.class_embedding", False, None),
           "embed.pos": ("embeddings.position_embedding.weight", False, None),
           "pre_norm.g": ("pre_layrnorm.weight", False, None),
           "pre_norm.b": ("pre_layrnorm.bias", False, None),
           "norm.g": ("post_layernorm.weight", False, None),
           "norm.b": ("post_layernorm.bias", False, None)}
    return _entries(model, top, "encoder.layers.", _SIGLIP_LAYER)


CLIP_VISION = ModuleFamily(
    "clip_vision_model", "CLIPVisionModel", _clip_from_hf, _clip_to_hf,
    claims=lambda cfg: isinstance(cfg, VisionConfig) and cfg.norm_cls,
    check=lambda cfg: _refuse(cfg, "clip_vision_model", cls_token=True, n_labels=False,
                              qkv_bias=True, clip=True),
    build=VisionTransformer, names=_clip_names, old_prefix="vision_model.")
