"""Tests for scratchllm/attention/mla.py: the training form against an independent transcription of
DeepSeek-V3's naive MLA, absorbed decoding against the training form, the latent cache's
bytes, gradients (grads case `mla`), shape errors, cache arithmetic and the Module."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.teach.sizing import kv_cache_elements
from scratchllm.attention import (MLA, LatentKVState, MLAWeights, make_rope, mla_backward,
                                  mla_decode, mla_decode_ref, mla_forward, mla_softmax_scale)
from scratchllm.specs import Mask, MLASpec, RopeSpec

B, T, D, H, dn, dr, dv, Dc, Dq = 2, 6, 11, 3, 4, 6, 5, 7, 9
INTERLEAVED = RopeSpec(style="interleaved")  # DeepSeek's reference pairs (2i, 2i + 1)


def mla_spec(lora, rope=INTERLEAVED):
    return MLASpec(H, Dq if lora else 0, Dc, dn, dr, dv, rope=rope)


def weights(rng, lora, dtype=np.float64):
    w = dict(wkv_a=0.4 * rng.standard_normal((D, Dc + dr)), kv_norm=1 + rng.random(Dc),
             wkv_b=0.4 * rng.standard_normal((Dc, H * (dn + dv))),
             wo=0.4 * rng.standard_normal((H * dv, D)))
    if lora:
        w.update(wq_a=0.4 * rng.standard_normal((D, Dq)), q_norm=1 + rng.random(Dq),
                 wq_b=0.4 * rng.standard_normal((Dq, H * (dn + dr))))
    else:
        w["wq"] = 0.4 * rng.standard_normal((D, H * (dn + dr)))
    return {k: v.astype(dtype) for k, v in w.items()}


def deepseek_naive(x, w, scale, eps=1e-6, base=10000.0):
    """Line by line DeepSeek-V3 inference/model.py MLA.forward, attn_impl="naive", start_pos 0
    (nn.Linear(x) = x @ W here), with its complex-number (interleaved) apply_rotary_emb."""
    bsz, seqlen, _ = x.shape

    def rms(a, g):
        return a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps) * g

    freqs = 1.0 / base ** (np.arange(0, dr, 2) / dr)
    freqs_cis = np.exp(1j * np.outer(np.arange(seqlen), freqs))  # (s, dr/2)

    def apply_rotary_emb(a):  # a (b, s, h, dr): view_as_complex(reshape(..., -1, 2))
        c = a.reshape(*a.shape[:-1], -1, 2)
        c = (c[..., 0] + 1j * c[..., 1]) * freqs_cis[None, :, None, :]
        return np.stack([c.real, c.imag], axis=-1).reshape(a.shape)

    q = x @ w["wq"] if "wq" in w else rms(x @ w["wq_a"], w["q_norm"]) @ w["wq_b"]
    q = q.reshape(bsz, seqlen, H, dn + dr)
    q = np.concatenate([q[..., :dn], apply_rotary_emb(q[..., dn:])], axis=-1)
    kv = x @ w["wkv_a"]
    kv, k_pe = kv[..., :Dc], apply_rotary_emb(kv[..., None, Dc:])
    kv = (rms(kv, w["kv_norm"]) @ w["wkv_b"]).reshape(bsz, seqlen, H, dn + dv)
    k = np.concatenate([kv[..., :dn], np.broadcast_to(k_pe, (bsz, seqlen, H, dr))], axis=-1)
    scores = np.einsum("bshd,bthd->bsht", q, k) * scale
    scores += np.triu(np.full((seqlen, seqlen), -np.inf), 1)[:, None, :]  # mask.unsqueeze(1)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    scores /= scores.sum(-1, keepdims=True)
    out = np.einsum("bsht,bthd->bshd", scores, kv[..., dn:])
    return out.reshape(bsz, seqlen, H * dv) @ w["wo"]


@pytest.mark.parametrize("lora", [False, True])
def test_training_form_matches_deepseek_reference(lora):
    rng = np.random.default_rng(1)
    w, x = weights(rng, lora), rng.standard_normal((B, T, D))
    out, _ = mla_forward(x, MLAWeights(**w), spec=mla_spec(lora))
    np.testing.assert_allclose(out, deepseek_naive(x, w, (dn + dr) ** -0.5), atol=1e-12)
    yarn = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "mscale_all_dim": 1}  # the scale's mscale^2
    scale = mla_softmax_scale(dn + dr, yarn)
    out, _ = mla_forward(x, MLAWeights(**w), spec=mla_spec(lora, RopeSpec(scaling=yarn)),
                         rope=make_rope(INTERLEAVED, dr, np.arange(T)))  # default frequencies
    np.testing.assert_allclose(out, deepseek_naive(x, w, scale), atol=1e-12)


@pytest.mark.parametrize("lora", [False, True])
def test_absorbed_decoding_equals_training_form(lora):
    rng = np.random.default_rng(2)
    w, x, spec = MLAWeights(**weights(rng, lora)), rng.standard_normal((B, T, D)), mla_spec(lora)
    full, _ = mla_forward(x, w, spec=spec)
    absorbed, naive = LatentKVState(B, T, Dc, dr, np.float64), LatentKVState(B, T, Dc, dr, np.float64)
    for t in range(T):
        a = mla_decode(x[:, t], w, absorbed, t, spec=spec)
        n = mla_decode_ref(x[:, t], w, naive, t, spec=spec)
        np.testing.assert_allclose(a, full[:, t], rtol=0, atol=1e-10)
        np.testing.assert_allclose(n, full[:, t], rtol=0, atol=1e-10)
    assert absorbed.length == T
    np.testing.assert_array_equal(absorbed.latents, naive.latents)


def test_causal():
    rng = np.random.default_rng(10)
    w, x, spec = MLAWeights(**weights(rng, True)), rng.standard_normal((B, T, D)), mla_spec(True)
    out, _ = mla_forward(x, w, spec=spec)
    x2 = x.copy()
    x2[:, 3] += 1.0  # a future token changes nothing before it, and changes its own row
    out2, _ = mla_forward(x2, w, spec=spec)
    np.testing.assert_array_equal(out2[:, :3], out[:, :3])
    assert np.abs(out2[:, 3:] - out[:, 3:]).min(axis=-1).max() > 0
    full, _ = mla_forward(x, w, spec=spec, mask=Mask(causal=False))  # the last row: unchanged
    np.testing.assert_allclose(full[:, -1], out[:, -1], atol=1e-13)
    assert not np.allclose(full[:, 0], out[:, 0])


def test_cache_holds_normalised_latent_and_roped_key():
    rng = np.random.default_rng(3)
    w, x = weights(rng, False), rng.standard_normal((B, 3, D))
    cache = LatentKVState(B, 4, Dc, dr, np.float64)
    for t in range(3):
        mla_decode(x[:, t], MLAWeights(**w), cache, t, spec=mla_spec(False))
    c = x @ w["wkv_a"][:, :Dc]
    np.testing.assert_allclose(cache.kv, c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-6)
                               * w["kv_norm"], atol=1e-13)
    k_pe = x @ w["wkv_a"][:, Dc:]  # position 0 is unrotated; later rotations keep the norm
    np.testing.assert_allclose(cache.pe[:, 0], k_pe[:, 0], atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(cache.pe, axis=-1),
                               np.linalg.norm(k_pe, axis=-1), atol=1e-12)
    assert not np.allclose(cache.pe[:, 1:], k_pe[:, 1:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cache_bytes_per_token(dtype):
    cache = LatentKVState(3, 100, 64, 16, dtype)
    assert cache.nbytes == 3 * 100 * (64 + 16) * np.dtype(dtype).itemsize
    assert cache.nbytes / (3 * 100) == kv_cache_elements(
        "mla", kv_lora_rank=64, qk_rope_head_dim=16) * np.dtype(dtype).itemsize


def test_cache_full_raises():
    rng = np.random.default_rng(4)
    w, x = weights(rng, False), rng.standard_normal((B, 2, D))
    cache = LatentKVState(B, 1, Dc, dr, np.float64)
    w, spec = MLAWeights(**w), mla_spec(False)
    mla_decode(x[:, 0], w, cache, 0, spec=spec)
    with pytest.raises(ValueError, match="full"):
        mla_decode(x[:, 1], w, cache, 1, spec=spec)


def test_gradients():
    reports = CASES["mla"](np.random.default_rng(5))
    for report in reports:
        assert report.ok, f"\n{report}"


def test_float32_in_float32_out():
    rng = np.random.default_rng(6)
    w, x = weights(rng, True, np.float32), rng.standard_normal((B, T, D)).astype(np.float32)
    w, spec = MLAWeights(**w), mla_spec(True)
    out, cache = mla_forward(x, w, spec=spec)
    grads = mla_backward(np.ones_like(out), cache)
    dws = [g for g in grads["w"] if g is not None]
    assert len(dws) == 7 and grads["w"].wq is None
    assert out.dtype == np.float32 and all(g.dtype == np.float32 for g in [grads["x"], *dws])
    step = mla_decode(x[:, 0], w, LatentKVState(B, 1, Dc, dr), 0, spec=spec)
    assert step.dtype == np.float32


@pytest.mark.parametrize("change, match", [
    (dict(wkv_b=np.zeros((Dc + 1, H * (dn + dv)))), "wkv_b"),
    (dict(wo=np.zeros((H * dv + 1, D))), "wo"),
    (dict(wkv_a=np.zeros((D, Dc + 5))), "dr"),
    (dict(wq_a=np.zeros((D, Dq))), "either wq"),
    (dict(wq=None), "either wq"),
    (dict(wq=np.zeros((D, H * (dn + dr) + 1))), "wq"),
    (dict(kv_norm=np.zeros((Dc, 1))), "kv_norm"),
])
def test_bad_shapes_raise(change, match):
    w = weights(np.random.default_rng(7), False)
    w.update(change)
    with pytest.raises(ValueError, match=match):
        mla_forward(np.zeros((B, T, D)), MLAWeights(**w), spec=mla_spec(False))


def test_bad_inputs_raise():
    w, spec = MLAWeights(**weights(np.random.default_rng(8), False)), mla_spec(False)
    with pytest.raises(ValueError, match="x must have 3 axes"):
        mla_forward(np.zeros((T, D)), w, spec=spec)
    with pytest.raises(TypeError, match="mask must be a Mask"):
        mla_forward(np.zeros((B, T, D)), w, spec=spec, mask="sliding")
    with pytest.raises(ValueError, match="LatentKVState of width"):
        mla_decode(np.zeros((B, D)), w, LatentKVState(B, 4, Dc, dr + 2), 0, spec=spec)
    with pytest.raises(TypeError, match="spec must be an MLASpec"):
        mla_forward(np.zeros((B, T, D)), w, spec=None)


def test_kv_cache_elements_deepseek_v2():
    mha = kv_cache_elements("mha", n_heads=128, head_dim=128)
    mla = kv_cache_elements("mla", kv_lora_rank=512, qk_rope_head_dim=64)
    assert (mha, mla) == (32768, 576)
    assert mla / kv_cache_elements("mqa", head_dim=128) == 2.25  # = GQA with 2.25 groups
    assert kv_cache_elements("gqa", n_kv_heads=8, head_dim=128) * 2 == 4096  # Llama-3 bf16 B
    with pytest.raises(ValueError, match="one of"):
        kv_cache_elements("mlp", head_dim=128)
    with pytest.raises(ValueError, match="needs n_kv_heads"):
        kv_cache_elements("gqa", head_dim=128)


def test_softmax_scale_deepseek_v3():
    assert mla_softmax_scale(192) == 192 ** -0.5
    yarn = {"rope_type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    assert mla_softmax_scale(192, yarn) == pytest.approx(0.1352338, abs=1e-7)


def test_module_calls_the_pair_and_decodes():
    rng = np.random.default_rng(9)
    spec = mla_spec(True)
    layer = MLA(D, spec, rng=rng, dtype=np.float64)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["wq_a", "q_norm", "wq_b", "wkv_a", "kv_norm", "wkv_b", "wo"]
    assert layer.spec is spec
    x, dout = rng.standard_normal((B, T, D)), rng.standard_normal((B, T, D))
    out, cache = layer.forward(x)
    dx = layer.backward(dout, cache)
    w = MLAWeights(**{n: p.data for n, p in layer.named_parameters()})
    ref, ref_cache = mla_forward(x, w, spec=spec)
    grads = mla_backward(dout, ref_cache)
    np.testing.assert_allclose(out, ref, atol=1e-14)
    np.testing.assert_allclose(dx, grads["x"], atol=1e-14)
    for n, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad, getattr(grads["w"], n), atol=1e-14)
    kv = layer.init_state(B, T)
    assert kv.nbytes == B * T * (Dc + dr) * 8
    steps = np.stack([layer.decode(x[:, t], kv, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(steps, out, atol=1e-10)
