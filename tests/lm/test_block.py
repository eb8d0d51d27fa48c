"""The one Block: a preset and the same model written as a tuple of LayerSpecs give the same
logits; each norm placement (pre, post, sandwich, output) and the decoder's cross-attention sub-layer
equal the composition of the Block's own Modules written out by hand; the Block's backward
passes the gradient check on its inputs; an MoE FFN's aux terms come through the FFN
interface."""
import numpy as np
import pytest

import grads
from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM, Block, encoder_layer
from scratchllm.specs import (AttentionSpec, ExpertsSpec, FFNSpec, LayerSpec, MambaSpec, Mask,
                              ModelConfig, MoESpec, NormSpec, RopeSpec, RouterSpec)

D = LM_TINY["d_model"]
NORM = NormSpec(eps=1e-5)


def _attention(**kw):
    """The tiny presets' attention layer: 4 query heads, 2 KV heads, RoPE, norm_eps 1e-5."""
    return AttentionSpec(4, 2, norm_eps=1e-5, rope=RopeSpec(), **kw)


HAND_WRITTEN = {  # preset name -> the same model as a tuple of LayerSpecs
    "dense": (LayerSpec(_attention(), FFNSpec("swiglu", 12), NORM),) * 2,
    "swa": (LayerSpec(_attention(mask=Mask(window=3, n_sink=1)), FFNSpec("swiglu", 12),
                      NORM),) * 2,
    "hybrid": (LayerSpec(MambaSpec(d_state=4, expand=2, norm_eps=1e-5), FFNSpec("swiglu", 12),
                         NORM),
               LayerSpec(_attention(), MoESpec(RouterSpec(4, 2), ExpertsSpec(d_ff=12)), NORM)),
}


@pytest.mark.parametrize("name", sorted(HAND_WRITTEN))
def test_a_preset_and_its_hand_written_layer_specs_give_the_same_logits(name):
    cfg = ModelConfig(name=name, vocab_size=LM_TINY["vocab_size"], d_model=D,
                      layers=HAND_WRITTEN[name], norm=NORM)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 7))
    by_hand = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64).forward(ids)[0]
    preset = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=np.float64).forward(ids)[0]
    assert np.array_equal(by_hand, preset)
    assert cfg == lm_tiny(name)


def _block(placement, ffn=FFNSpec("swiglu", 12), cross=None):
    spec = LayerSpec(_attention(), ffn, NORM, placement)
    return Block(D, spec, rng=np.random.default_rng(0), dtype=np.float64, cross=cross)


def _x(T=5):
    return np.random.default_rng(3).standard_normal((2, T, D))


def _f(module, x):
    return module.forward(x)[0]


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "output"])
def test_each_placement_is_its_composition_of_the_modules(placement):
    b, x = _block(placement), _x()
    mixer, ffn, n1, n2 = b.mixer, b.ffn, b.norm1, b.norm2
    if placement == "pre":
        h = x + _f(mixer, _f(n1, x))
        want = h + _f(ffn, _f(n2, h))
    elif placement == "sandwich":
        h = x + _f(b.post_mixer_norm, _f(mixer, _f(n1, x)))
        want = h + _f(b.post_ffn_norm, _f(ffn, _f(n2, h)))
    elif placement == "output":
        h = x + _f(n1, _f(mixer, x))
        want = h + _f(n2, _f(ffn, h))
    else:
        h = _f(n1, x + _f(mixer, x))
        want = _f(n2, h + _f(ffn, h))
    assert np.array_equal(b.forward(x)[0], want)
    assert (b.post_mixer_norm is None) == (placement != "sandwich")


def test_the_decoder_block_is_self_attention_then_cross_attention_then_the_ffn():
    spec = encoder_layer(4, 12, causal=True)
    cross = AttentionSpec(4, 4, rope=None, mask=Mask(causal=False))
    b = Block(D, spec, rng=np.random.default_rng(0), dtype=np.float64, cross=cross)
    x, ctx = _x(), _x(7)
    h = x + _f(b.mixer, _f(b.norm1, x))
    c = h + b.cross.forward(_f(b.norm_cross, h), ctx)[0]
    assert np.array_equal(b.forward(x, ctx)[0], c + _f(b.ffn, _f(b.norm2, c)))
    with pytest.raises(ValueError, match="context goes with a cross-attention sub-layer"):
        b.forward(x)
    with pytest.raises(ValueError, match="cross-attention takes rope=None"):
        Block(D, spec, rng=np.random.default_rng(0), cross=_attention())


def _pair(block):
    """The Block as a forward/backward pair of its inputs (Params fixed)."""
    def forward(x, context=None):
        return block.forward(x, context)

    def backward(dy, cache):
        g = block.backward(dy, cache)
        return g if isinstance(g, dict) else {"x": g}
    return forward, backward


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "output"])
def test_the_block_backward_passes_the_gradient_check(placement):
    forward, backward = _pair(_block(placement))
    report = grads.check(forward, backward, rng=np.random.default_rng(4), x=_x())
    assert report.ok, f"\n{report}"


def test_the_decoder_block_backward_reaches_the_context():
    cross = AttentionSpec(4, 4, rope=None, mask=Mask(causal=False))
    forward, backward = _pair(_block("pre", cross=cross))
    report = grads.check(forward, backward, rng=np.random.default_rng(5), x=_x(),
                         context=_x(7))
    assert report.ok and {row.input for row in report.rows} == {"x", "context"}, f"\n{report}"


def test_an_moe_ffn_gives_its_weighted_aux_terms_and_a_dense_one_none():
    moe = MoESpec(RouterSpec(4, 2), ExpertsSpec(d_ff=12), balance_coef=0.5, z_coef=0.25)
    b, x = _block("pre", ffn=moe), _x()
    _, cache = b.forward(x)
    aux, z = cache.ffn.inner.losses  # the MoE's unweighted balance loss and z-loss
    assert b.aux_losses(cache) == (("balance", 0.5 * aux), ("z", 0.25 * z))
    assert aux > 0 and z > 0
    dense = _block("pre")
    assert dense.aux_losses(dense.forward(x)[1]) == ()
    assert dense.named_buffers() == [] and [n for n, _ in b.named_buffers()] == [
        "ffn.selection_bias"]


def test_the_public_body_around_another_mixer_call_is_the_blocks_own_forward():
    """Block.body with the mixer's own forward is forward; with a mixer call that doubles the
    mixer's output only the mixer's term changes (serving runs its caches through body)."""
    block = _block("sandwich")
    x = _x()
    y, _ = block.forward(x)
    y2, _ = block.body(x, block.mixer.forward)
    np.testing.assert_array_equal(y, y2)
    z, _ = block.body(x, lambda a: (2 * block.mixer.forward(a)[0], None))
    assert not np.allclose(z, y)


def test_no_module_outside_the_block_calls_its_private_members():
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parents[2] / "scratchllm"
    bad = [str(p) for p in root.rglob("*.py") if p.name != "block.py"
           and re.search(r"\b(layer|block)\._(body|sublayer)\b", p.read_text(encoding="utf-8"))]
    assert not bad
