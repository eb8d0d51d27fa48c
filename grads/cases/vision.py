"""Gradient-check cases of scratchllm.vision: the 2-D convolution, the patch embedding (the
same map as one matmul of flattened patches), the ViT embedding ([CLS] and positions), and a
whole tiny Vision Transformer of each kind (a classifier with [CLS]; an encoder without), and
the vision-language models (LLaVA, Qwen2-VL, the multimodal Gemma 3) with their projectors."""
import numpy as np

from grads.cases._common import case
from grads.check import check


@case
def conv2d(rng):
    from scratchllm.vision.patch import ConvWeights, conv2d_backward, conv2d_forward
    x = rng.standard_normal((2, 3, 7, 9))
    return [check(conv2d_forward, conv2d_backward, rng=rng, label="K=3 S=2 (overlapping)",
                  x=x, w=ConvWeights(rng.standard_normal((3, 3, 3, 5)), rng.standard_normal(5)),
                  stride=2),
            check(conv2d_forward, conv2d_backward, rng=rng, label="K=S=3, no bias",
                  x=x, w=ConvWeights(rng.standard_normal((3, 3, 3, 5))), stride=3)]


@case
def patch_merger(rng):
    from scratchllm.specs.vision import MergerSpec
    from scratchllm.vision.merger import MergerWeights, patch_merger_backward, patch_merger_forward
    C, D = 3, 5
    w = MergerWeights(1 + 0.1 * rng.standard_normal(C), rng.standard_normal(C),
                      rng.standard_normal((4 * C, 4 * C)) / 3, rng.standard_normal(4 * C),
                      rng.standard_normal((4 * C, D)) / 3, rng.standard_normal(D))
    return check(patch_merger_forward, patch_merger_backward, rng=rng, spec=MergerSpec(),
                 x=rng.standard_normal((8, C)), w=w)


def _patch_spec(cls_token=True):
    from scratchllm.specs.vision import PatchSpec
    return PatchSpec(image_size=(6, 9), patch_size=3, n_channels=2, cls_token=cls_token)


@case
def patch_embed(rng):
    from scratchllm.vision.patch import PatchWeights, patch_embed_backward, patch_embed_forward
    spec = _patch_spec()
    return check(patch_embed_forward, patch_embed_backward, rng=rng, spec=spec,
                 x=rng.standard_normal((2, 2, 6, 9)),
                 w=PatchWeights(rng.standard_normal((spec.patch_dim, 5)),
                                rng.standard_normal(5)))


@case
def vision_embed(rng):
    from scratchllm.vision.embed import (VisionEmbedWeights, vision_embed_backward,
                                         vision_embed_forward)
    reports = []
    for cls_token in (True, False):
        spec = _patch_spec(cls_token)
        w = VisionEmbedWeights(rng.standard_normal((spec.patch_dim, 5)), rng.standard_normal(5),
                               rng.standard_normal(5) if cls_token else None,
                               rng.standard_normal((spec.n_positions, 5)))
        reports.append(check(vision_embed_forward, vision_embed_backward, rng=rng, spec=spec,
                             label="[CLS]" if cls_token else "no [CLS]",
                             x=rng.standard_normal((2, 2, 6, 9)), w=w))
    return reports


def vision_tiny(n_labels, cls_token, gelu_approx, pool=False, clip=False):
    """A tiny VisionConfig: 8 x 12 images of 2 channels in 4 x 4 patches (6 patches), D = 12,
    3 heads, 2 pre-norm blocks (LayerNorm, bidirectional MHA with biases, GELU MLP of 20);
    pool: with SigLIP's attention-pooling head of the same LayerSpec; clip: CLIP's shape (no
    patch bias, a pre-norm on the embedding, the final norm on [CLS] alone)."""
    from scratchllm.specs import AttentionSpec, FFNSpec, LayerSpec, Mask, NormSpec
    from scratchllm.specs.vision import PatchSpec, VisionConfig
    norm = NormSpec("layernorm", 1e-6)
    layer = LayerSpec(AttentionSpec(3, 3, qkv_bias=True, o_bias=True, rope=None,
                                    mask=Mask(causal=False)),
                      FFNSpec("gelu_mlp", 20, gelu_approx=gelu_approx), norm)
    return VisionConfig(d_model=12, patch=PatchSpec((8, 12), 4, 2, cls_token=cls_token,
                                                    patch_bias=not clip),
                        layers=(layer,) * 2, norm=norm, n_labels=n_labels,
                        pool=layer if pool else None, pre_norm=norm if clip else None,
                        norm_cls=clip)


def _model_pair(model, rng, call):
    """(forward, backward, {param name: array}) of out = call(pixel_values) over a model's
    Params, drawn from rng: matrices N(0, 1/fan_in), norm gains 1 + N(0, 0.1^2), other
    vectors N(0, 0.3^2). backward gives d pixel_values too when the model's backward
    returns it."""
    for name, p in model.named_parameters():
        noise = rng.standard_normal(p.data.shape)
        p.data[...] = (noise * p.data.shape[0] ** -0.5 if p.data.ndim == 2 else
                       1 + 0.1 * noise if "norm" in name else 0.3 * noise)
    params = dict(model.named_parameters())

    def forward(pixel_values, **arrays):
        for name, p in params.items():
            p.data = arrays[name]
        return call(pixel_values)

    def backward(dout, cache):
        model.zero_grad()
        dx = model.backward(dout, cache)
        grads = {n: p.grad.copy() for n, p in params.items()}
        return grads if dx is None else {"pixel_values": dx, **grads}

    return forward, backward, {n: p.data for n, p in params.items()}


@case
def vision_transformer(rng):
    """out (logits, last_hidden_state, pooler_output, or the hidden state after the first
    block) . dout, d every Param and d pixel_values (2 random directions per array; the Params
    past the hidden layer have gradient 0, and get 0). Without RoPE a key bias adds q . bk
    to every score of a query's row, which softmax ignores: its gradient is 0 exactly, so it
    is left out."""
    from scratchllm.vision import VisionTransformer
    reports = []
    for label, cfg, kwargs in (("ViT classifier", vision_tiny(5, True, "none"), {}),
                               ("SigLIP-style encoder", vision_tiny(0, False, "tanh"), {}),
                               ("pooling head", vision_tiny(0, False, "tanh", True),
                                dict(pooled=True)),
                               ("hidden layer -2", vision_tiny(0, False, "tanh"),
                                dict(hidden_layer=-2)),
                               ("CLIP-style", vision_tiny(0, True, "quick", clip=True), {}),
                               ("CLIP-style [CLS] norm", vision_tiny(0, True, "quick",
                                                                     clip=True),
                                dict(pooled=True))):
        model = VisionTransformer(cfg, rng=rng, dtype=np.float64)
        forward, backward, params = _model_pair(
            model, rng, lambda x, kw=kwargs, m=model: m.forward(x, **kw))
        wrt = ["pixel_values"] + [n for n in params if not n.endswith(".bk")]
        reports.append(check(forward, backward, rng=rng, label=label, max_full=0,
                             n_directions=2, wrt=wrt, pixel_values=rng.standard_normal(
                                 (2, 2, 8, 12)), **params))
    return reports


@case
def probe_attention(rng):
    from scratchllm.specs import AttentionSpec, Mask
    from scratchllm.vision.pool import (ProbeWeights, probe_attention_backward,
                                        probe_attention_forward)
    D, HD = 12, 12
    w = ProbeWeights(rng.standard_normal(D), *(rng.standard_normal((D, HD)) for _ in range(3)),
                     rng.standard_normal((HD, D)), *(rng.standard_normal(n) for n in
                                                     (HD, HD, HD, D)))
    spec = AttentionSpec(3, 3, qkv_bias=True, o_bias=True, rope=None, mask=Mask(causal=False))
    # softmax ignores the key bias (it adds q . bk to the one row's every score)
    return check(probe_attention_forward, probe_attention_backward, rng=rng, spec=spec,
                 wrt=["h", "w.probe", "w.wq", "w.wk", "w.wv", "w.wo", "w.bq", "w.bv", "w.bo"],
                 h=rng.standard_normal((2, 5, D)), w=w)


@case
def llava(rng):
    """logits . dout of a tiny LLaVA (the SigLIP-style encoder's first block as features,
    [CLS]-free, the GELU projector, a tiny dense LM of width 12): d every Param, 2 random
    directions each; the encoder's last block and norm come after the features (gradient 0)."""
    from scratchllm.specs import preset
    from scratchllm.specs.vision_lm import LlavaConfig
    from scratchllm.vision.llava import Llava
    text = preset("dense", vocab_size=23, d_model=12, n_layers=1, n_heads=2, n_kv_heads=1,
                  d_ff=14)
    cfg = LlavaConfig(vision=vision_tiny(0, False, "tanh"), text=text, feature_layer=-2,
                      select="full", image_token_id=22)
    model = Llava(cfg, rng=rng, dtype=np.float64)
    ids = rng.integers(0, 22, (2, 9))
    ids[0, 1:7], ids[1, 3:9] = 22, 22  # one image of 6 patches per sequence
    forward, backward, params = _model_pair(model, rng, lambda x: model.forward(ids, x))
    return check(forward, backward, rng=rng, max_full=0, n_directions=2,
                 wrt=["pixel_values"] + [n for n in params if not n.endswith(".bk")],
                 pixel_values=rng.standard_normal((2, 2, 8, 12)), **params)


@case
def pool_project(rng):
    """The multimodal Gemma 3's projector: a 4 x 4 grid pooled to 2 x 2 tokens, the RMSNorm
    with gain 1 + g, the matrix."""
    from scratchllm.specs.vision_lm import PoolProjectorSpec
    from scratchllm.vision.gemma3 import (PoolProjectorWeights, pool_project_backward,
                                          pool_project_forward)
    w = PoolProjectorWeights(0.1 * rng.standard_normal(3), rng.standard_normal((3, 5)))
    return check(pool_project_forward, pool_project_backward, rng=rng,
                 spec=PoolProjectorSpec(tokens_per_image=4), x=rng.standard_normal((2, 16, 3)),
                 w=w)


def _vlm(model_type, hf, rng):
    """The float64 model of a tiny config.json dict of a vision-language family."""
    from scratchllm.hub import family_named
    family = family_named(model_type)
    return family.build(family.from_hf(hf), rng=rng, dtype=np.float64)


@case
def qwen2_vl(rng):
    """logits . dout of a tiny Qwen2-VL (a tower of one block of width 8 over two images of
    2 x 4 and 4 x 2 patches, packed; the merger; one qwen2 layer with M-RoPE): d every Param
    and d pixel_values, 2 random directions each."""
    text = dict(vocab_size=19, hidden_size=12, intermediate_size=10, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 50.0,
                                 "mrope_section": [1, 1, 1]})
    vision = dict(depth=1, embed_dim=8, num_heads=2, mlp_ratio=2, patch_size=2,
                  temporal_patch_size=1, in_channels=1, spatial_merge_size=2, hidden_size=12)
    model = _vlm("qwen2_vl", dict(text_config=text, vision_config=vision, image_token_id=18),
                 rng)
    grid = np.array([[1, 2, 4], [1, 4, 2]])
    ids = rng.integers(0, 18, (1, 9))
    ids[0, 1:3], ids[0, 5:7] = 18, 18  # two merged tokens per image
    forward, backward, params = _model_pair(
        model, rng, lambda x: model.forward(input_ids=ids, pixel_values=x, image_grid_thw=grid))
    return check(forward, backward, rng=rng, max_full=0, n_directions=2,
                 wrt=["pixel_values", *params], pixel_values=rng.standard_normal((16, 4)),
                 **params)


@case
def gemma3_vl(rng):
    """logits . dout of a tiny multimodal Gemma 3 (a SigLIP tower over 8 x 8 images in 2 x 2
    patches, pooled to 4 tokens; a sliding and a full Gemma 3 layer), each image's tokens
    attending each other: d every Param (but the tower's key bias, 0) and d pixel_values."""
    text = dict(vocab_size=19, hidden_size=12, intermediate_size=10, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=1, head_dim=6,
                query_pre_attn_scalar=6, sliding_window=3,
                layer_types=["sliding_attention", "full_attention"])
    vision = dict(hidden_size=8, intermediate_size=10, num_hidden_layers=1,
                  num_attention_heads=2, image_size=8, patch_size=2, num_channels=1)
    model = _vlm("gemma3", dict(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                image_token_index=18), rng)
    ids = rng.integers(1, 18, (2, 8))
    ids[0, 2:6], ids[1, 3:7] = 18, 18
    forward, backward, params = _model_pair(
        model, rng, lambda x: model.forward(input_ids=ids, pixel_values=x))
    return check(forward, backward, rng=rng, max_full=0, n_directions=2,
                 wrt=["pixel_values"] + [n for n in params if not n.endswith(".bk")],
                 pixel_values=rng.standard_normal((2, 1, 8, 8)), **params)
