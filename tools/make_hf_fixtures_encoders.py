"""Write the encoder fixtures of tests/fixtures/hf/: tiny random BertForMaskedLM checkpoints and
what transformers computes with them (float64, eager attention), for tests/hub/test_encoders.py.

    PYTHONPATH=$PWD python tools/make_hf_fixtures_encoders.py

Per checkpoint (bert: GELU erf, two token types; bert_tanh: the tanh GELU, three token
types, eps 1e-6) a directory holds config.json and model.safetensors
(transformers' own save_pretrained, float32 weights) and expected.npz:
    input_ids, token_type_ids (B, T), logits (B, T, V), G_seed (G = default_rng(G_seed).
    standard_normal((B, T, V))), grad/<HF name> = d sum(logits * G) / d param for every
    parameter, saved_by_scratchllm_rel_err (scratchllm's save_pretrained of the checkpoint,
    loaded by transformers' from_pretrained: the float32 logits' largest relative difference
    from `logits`, asserted < 1e-5 here).
And t5_attention/ and t5_parts/expected.npz (their functions' docstrings) and t5_buckets/expected.npz: T5's relative position buckets of the offsets -700..700 for a
few (num_buckets, max_distance, bidirectional), as transformers computes them (float32 logs,
outside float64_everywhere: the bucket edges are transformers' own).
float64 as make_hf_fixtures.py does it (float64_everywhere); BERT's modeling code has no
float32 casts of its own, the context only keeps the references alike.
Reference: huggingface/transformers src/transformers/models/bert/modeling_bert.py.
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file

from make_hf_fixtures import B, G_SEED, OUT, ROOT, T, float64_everywhere

BERT = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=24, max_position_embeddings=64, type_vocab_size=2)
CHECKPOINTS = {
    "bert": BERT,
    "bert_tanh": dict(BERT, hidden_act="gelu_new", type_vocab_size=3, layer_norm_eps=1e-6),
}


def randomize(model, seed):
    """Weights large enough to make every path matter: matrices N(0, 1/fan_in), embeddings
    N(0, 1), LayerNorm gains 1 + N(0, 0.1^2), biases N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.ndim == 2:
                value = noise if "embeddings" in name else noise * p.shape[1] ** -0.5
            elif "LayerNorm.weight" in name:
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


def load_float64(directory):
    """The checkpoint as a float64 BertForMaskedLM in eval mode (no dropout)."""
    cfg = transformers.AutoConfig.from_pretrained(directory)
    state = load_file(Path(directory) / "model.safetensors")
    with float64_everywhere():
        model = transformers.BertForMaskedLM(cfg).to(torch.float64)
        model.config._attn_implementation = "eager"
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in state.items()},
                                                strict=False)
    allowed = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert set(missing) <= allowed and not unexpected, (missing, unexpected)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def reference(directory, rng, cfg):
    model = load_float64(directory)
    with float64_everywhere():
        ids = rng.integers(0, cfg["vocab_size"], (B, T))
        types = rng.integers(0, cfg["type_vocab_size"], (B, T))
        G = np.random.default_rng(G_SEED).standard_normal((B, T, cfg["vocab_size"]))
        logits = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types)).logits
        (logits * torch.tensor(G)).sum().backward()
        grads = {f"grad/{n}": p.grad.numpy() for n, p in model.named_parameters()}
    return dict(input_ids=ids, token_type_ids=types, logits=logits.detach().numpy(),
                G_seed=G_SEED, **grads)


def saved_by_scratchllm(directory, expected):
    """scratchllm's save_pretrained of the loaded checkpoint, read by from_pretrained."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        model, info = transformers.AutoModelForMaskedLM.from_pretrained(
            saved, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(expected["input_ids"]),
                           token_type_ids=torch.tensor(expected["token_type_ids"])).logits
    err = float(np.abs(logits.numpy() - expected["logits"]).max()
                / np.abs(expected["logits"]).max())
    assert err < 1e-5, err
    return err


BUCKETS = [(32, 128, True), (32, 128, False), (8, 20, True), (16, 50, False), (64, 300, True)]


def t5_buckets():
    """{"nb_md_bidirectional": buckets of the offsets -700..700} from T5Attention."""
    from transformers.models.t5.modeling_t5 import T5Attention
    n = torch.arange(-700, 701)[None, :]  # (1, 1401)
    out = {f"{nb}_{md}_{int(bi)}": T5Attention._relative_position_bucket(
        n, bidirectional=bi, num_buckets=nb, max_distance=md).numpy() for nb, md, bi in BUCKETS}
    d = OUT / "t5_buckets"
    d.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(d / "expected.npz", **out)


def t5_attention():
    """t5_attention/expected.npz: one T5Attention with its relative bias (an encoder's first
    layer: bidirectional, unscaled; d_kv apart from d_model / heads) in float64: x (2, 9, 8),
    its weights q, k, v (D, H*d_kv) and o (H*d_kv, D) in torch's (out, in) layout, the table
    (num_buckets, H), the output y, G_seed, and grad/<name> of sum(y * G)."""
    from transformers.models.t5.modeling_t5 import T5Attention
    cfg = transformers.T5Config(d_model=8, d_kv=3, num_heads=4, relative_attention_num_buckets=8,
                                relative_attention_max_distance=12, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    with float64_everywhere():
        layer = T5Attention(cfg, has_relative_attention_bias=True).to(torch.float64).eval()
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        x = torch.randn((2, 9, 8), generator=g, dtype=torch.float64)
        y = layer(x)[0]
        G = np.random.default_rng(G_SEED).standard_normal(tuple(y.shape))
        (y * torch.tensor(G)).sum().backward()
    d = OUT / "t5_attention"
    d.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(d / "expected.npz", x=x.numpy(), y=y.detach().numpy(), G_seed=G_SEED,
                        **{n: p.detach().numpy() for n, p in layer.named_parameters()},
                        **{f"grad/{n}": p.grad.numpy() for n, p in layer.named_parameters()})


def t5_parts():
    """t5_parts/expected.npz: T5's other sub-layers in float64 on x (2, 5, 8): relu/* the
    DenseReluDense (wi, wo), gated/* the gated-gelu DenseGatedActDense (wi_0, wi_1, wo:
    gelu_new), norm/* the T5LayerNorm (weight, eps 1e-6), cross/* a T5Attention used as
    cross-attention over ctx (2, 7, 8) (no relative bias, unscaled); each with its inputs,
    weights and output y."""
    from transformers.models.t5.modeling_t5 import (T5Attention, T5DenseActDense,
                                                    T5DenseGatedActDense, T5LayerNorm)
    cfg = transformers.T5Config(d_model=8, d_kv=3, num_heads=4, d_ff=12, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    gated = transformers.T5Config(d_model=8, d_kv=3, num_heads=4, d_ff=12, dropout_rate=0.0,
                                  feed_forward_proj="gated-gelu")  # dense_act_fn gelu_new
    assert gated.dense_act_fn == "gelu_new" and gated.is_gated_act
    out = {}
    with float64_everywhere(), torch.no_grad():
        g = torch.Generator().manual_seed(4)
        x = torch.randn((2, 5, 8), generator=g, dtype=torch.float64)
        ctx = torch.randn((2, 7, 8), generator=g, dtype=torch.float64)
        out.update(x=x.numpy(), ctx=ctx.numpy())
        parts = {"relu": T5DenseActDense(cfg), "gated": T5DenseGatedActDense(gated),
                 "norm": T5LayerNorm(8, eps=1e-6), "cross": T5Attention(cfg)}
        for name, layer in parts.items():
            layer = layer.to(torch.float64).eval()
            for p in layer.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5 + (
                    1.0 if name == "norm" else 0.0))
            y = layer(x, key_value_states=ctx)[0] if name == "cross" else layer(x)
            out[f"{name}/y"] = y.numpy()
            out.update({f"{name}/{n}": p.numpy() for n, p in layer.named_parameters()})
    d = OUT / "t5_parts"
    d.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(d / "expected.npz", **out)


def main():
    t5_buckets()
    t5_attention()
    t5_parts()
    rng = np.random.default_rng(27)
    for name, fields in CHECKPOINTS.items():
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        model = transformers.BertForMaskedLM(transformers.BertConfig(**fields))
        randomize(model, seed=len(name))
        model.save_pretrained(d)
        expected = reference(d, rng, fields)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{name}: {sorted(p.name for p in d.iterdir())}")


if __name__ == "__main__":
    main()
