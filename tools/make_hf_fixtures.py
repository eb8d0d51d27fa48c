"""Write tests/fixtures/hf/: tiny random Hugging Face checkpoints and what transformers computes
with them, so the tests can compare scratchllm against transformers without torch.

    pip install ".[ref]"      # torch, transformers, tokenizers
    PYTHONPATH=$PWD python tools/make_hf_fixtures.py

Per family (llama with llama3, yarn, linear and dynamic rope scaling, mistral with a sliding window
shorter than the test sequences, qwen2, qwen3, gemma3 (gemma3_text), gpt2) a directory
holds:
    config.json, model.safetensors   transformers' own save_pretrained (float32 weights)
    tokenizer.json                   a byte-level BPE trained with HF `tokenizers`
    expected.npz                     computed by transformers in float64 from those weights:
        ids (B, T), logits (B, T, V), G_seed (G = default_rng(G_seed).standard_normal(
        (B, T, V))), grad/<HF name> = d sum(logits * G) / d param for every parameter,
        greedy (10 ids greedily generated after ids[0, :P]), saved_by_scratchllm_rel_err
        (scratchllm's save_pretrained of the checkpoint, loaded by from_pretrained: the
        float32 logits' largest relative difference from `logits`)
Plus gpt_oss/ (tools/make_gpt_oss_fixture.py, the same format); dense/: scratchllm's `dense`
preset (tiny) written by scratchllm.hub.save_pretrained, with the logits transformers computes
after from_pretrained on it (the save path's proof), mamba/, jamba/ and hybrid_jamba/
(tools/make_hf_fixtures_ssm.py, run at the end),
and tokenizer_*/: expected ids of HF `tokenizers` for tokenizer.json files (ByteLevel,
Split + ByteLevel, and Split + ByteLevel with an NFC normalizer).

float64 in transformers: its modeling code casts to float32 in places (RMSNorm's
`.to(torch.float32)`, the rotary frequencies `dtype=torch.float`, softmax's
`dtype=torch.float32`, Gemma's `x.float()`). Those are precision choices, not semantics,
so while computing the references torch.float32, torch.float and Tensor.float are pointed
at float64 (`float64_everywhere`); the
checkpoints themselves are written outside that context, in float32.
Reference: huggingface/transformers src/transformers/models/llama/modeling_llama.py.
"""
import contextlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file
from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        trainers)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "fixtures" / "hf"
CORPUS = ROOT / "tests" / "fixtures" / "python-docs-slice.txt"
SAMPLES = ["Hello world, héllo wörld! 你好，世界。 Привет мир. こんにちは 🙂🚀👍🏽 — naïve café",
           "decomposed: cafe\u0301 n\u0303 A\u030a, composed: café ñ Å; 한국어 ﬁ ① ²",
           "def f(x):\n    return x  # 3.14 1234567 don't I'm we'll\n\n\n  spaces   here",
           "<|endoftext|>after a special token<|endoftext|>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
              r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
B, T, P, N_NEW = 2, 9, 5, 10
G_SEED = 5  # G = np.random.default_rng(G_SEED).standard_normal((B, T, V)), not stored
GEOMETRY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=24, rms_norm_eps=1e-5,
                max_position_embeddings=64)
FAMILIES = {
    "llama": dict(model_type="llama", rope_theta=10000.0, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)),
    "llama_yarn": dict(model_type="llama", rope_theta=500.0, rope_scaling=dict(
        rope_type="yarn", factor=4.0, original_max_position_embeddings=16)),
    "llama_linear": dict(model_type="llama", rope_scaling=dict(rope_type="linear", factor=2.0)),
    "llama_dynamic": dict(model_type="llama", max_position_embeddings=8, rope_scaling=dict(
        rope_type="dynamic", factor=2.0)),  # T = 9 > 8: the NTK base grows with the length
    "mistral": dict(model_type="mistral", sliding_window=4, head_dim=8),
    "qwen2": dict(model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(model_type="qwen3", head_dim=12, tie_word_embeddings=True),
    "gemma3": dict(model_type="gemma3_text", head_dim=12, query_pre_attn_scalar=10,
                   sliding_window=4, layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": {"rope_type": "default",
                                                          "rope_theta": 100.0},
                                    "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                       "rope_theta": 10000.0}}),
    "gpt2": dict(model_type="gpt2", n_embd=16, n_layer=2, n_head=4, n_positions=64,
                 n_inner=24, activation_function="gelu_new", layer_norm_epsilon=1e-5),
}


@contextlib.contextmanager
def float64_everywhere():
    """torch.float32, torch.float and Tensor.float() mean float64 inside (see the module
    docstring)."""
    saved = torch.float32, torch.float, torch.Tensor.float
    torch.float32 = torch.float = torch.float64
    torch.Tensor.float = lambda self, *args, **kwargs: self.to(torch.float64)
    torch.set_default_dtype(torch.float64)  # Gemma's embed_scale = torch.tensor(sqrt(D))
    try:
        yield
    finally:
        torch.float32, torch.float, torch.Tensor.float = saved
        torch.set_default_dtype(saved[0])


def make_tokenizer(split_regex, nfc=False):
    """A byte-level BPE (vocab 300 + <|endoftext|>) trained on the bundled corpus slice:
    GPT-2's ByteLevel pre-tokenizer, or Split(regex) + ByteLevel(use_regex=False) (Qwen2)."""
    tok = Tokenizer(models.BPE())
    if split_regex is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split_regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    if nfc:
        tok.normalizer = normalizers.NFC()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train([str(CORPUS)], trainer)
    return tok


def randomize(model, seed):
    """Weights large enough to make every path matter: matrices N(0, 1/fan_in), norm gains
    1 + N(0, 0.1^2), biases N(0, 0.1^2), embeddings N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if p.ndim == 2 and "embed" not in name and "wte" not in name:
                value = noise * p.shape[1] ** -0.5
            elif p.ndim == 2:
                value = noise
            elif "norm" in name or "ln" in name:
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


def write_checkpoint(directory, fields, vocab_size, seed):
    """transformers' save_pretrained of a random tiny model (float32)."""
    geometry = {} if fields["model_type"] == "gpt2" else GEOMETRY
    cfg = transformers.AutoConfig.for_model(**{**geometry, **fields, "vocab_size": vocab_size})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model, seed)
    model.save_pretrained(directory)


def load_float64(directory):
    """The checkpoint as a float64 transformers model, built inside float64_everywhere (so
    its rotary frequencies and buffers are float64) from the weights read outside it."""
    cfg = transformers.AutoConfig.from_pretrained(directory)
    state = load_file(Path(directory) / "model.safetensors")
    with float64_everywhere():
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.float64, attn_implementation="eager",
            experts_implementation="eager")  # MoE: the default grouped_mm takes no float64
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in state.items()},
                                                strict=False)
    tied = {k for k in missing if k == "lm_head.weight" and cfg.tie_word_embeddings}
    assert set(missing) == tied and not unexpected, (missing, unexpected)
    model.tie_weights()
    return model.eval()  # no dropout (from_config builds a model in training mode)


def reference(directory, rng, V):
    """logits, grads of sum(logits * G), greedy ids: transformers in float64, eager attention."""
    model = load_float64(directory)
    with float64_everywhere():
        ids = rng.integers(0, V, (B, T))
        G = np.random.default_rng(G_SEED).standard_normal((B, T, V))
        logits = model(torch.tensor(ids)).logits
        (logits * torch.tensor(G)).sum().backward()
        grads = {f"grad/{n}": p.grad.numpy() for n, p in model.named_parameters()}
        with torch.no_grad():
            out = model.generate(torch.tensor(ids[:1, :P]), max_new_tokens=N_NEW,
                                 do_sample=False, min_new_tokens=N_NEW)
    return dict(ids=ids, logits=logits.detach().numpy(), G_seed=G_SEED,
                greedy=out[0, P:].numpy(), **grads)


def saved_by_scratchllm(directory, expected):
    """scratchllm.hub.save_pretrained of the loaded checkpoint, read back by transformers'
    from_pretrained (float32): the largest relative logit difference from the float64
    reference, recorded in expected.npz (and asserted < 1e-5 here)."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            saved, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            logits = model(torch.tensor(expected["ids"])).logits.numpy()
    err = float(np.abs(logits - expected["logits"]).max() / np.abs(expected["logits"]).max())
    assert err < 1e-5, err
    return err


def dense_roundtrip(directory, V):
    """scratchllm's dense preset, saved by scratchllm.hub, loaded by transformers: its logits."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import save_pretrained
    from scratchllm.lm import LM, preset
    cfg = preset("dense", vocab_size=V, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2,
                 d_ff=40)
    save_pretrained(LM(cfg, rng=np.random.default_rng(0)), directory)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    hf32, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    model = load_float64(directory)
    with float64_everywhere(), torch.no_grad():
        logits = model(torch.tensor(ids)).logits.numpy()
    with torch.no_grad():
        logits32 = hf32(torch.tensor(ids)).logits.numpy()
    err32 = float(np.abs(logits32 - logits).max() / np.abs(logits).max())
    assert err32 < 1e-5, err32  # from_pretrained (float32) computes the same logits
    np.savez_compressed(Path(directory) / "expected.npz", ids=ids, logits=logits,
                        from_pretrained_float32_rel_err=err32)


def tokenizer_expectations(directory, tok):
    """HF `tokenizers` ids of the samples and of the corpus slice: `encode` matches special
    tokens; `encode_ordinary` is tokenizers' encode_special_tokens=True (specials as text)."""
    texts = SAMPLES + [CORPUS.read_text(encoding="utf-8")[:6000]]
    expected = {"texts": texts, "encode": [tok.encode(t).ids for t in texts]}
    tok.encode_special_tokens = True
    expected["encode_ordinary"] = [tok.encode(t).ids for t in texts]
    tok.encode_special_tokens = False
    (Path(directory) / "expected.json").write_text(json.dumps(expected), encoding="utf-8")


def main():
    rng = np.random.default_rng(12)
    OUT.mkdir(parents=True, exist_ok=True)
    tok_split, tok_gpt2 = make_tokenizer(QWEN_SPLIT), make_tokenizer(None)
    for family, fields in FAMILIES.items():
        d = OUT / family
        d.mkdir(exist_ok=True)
        tok = tok_gpt2 if family == "gpt2" else tok_split
        tok.save(str(d / "tokenizer.json"))
        V = tok.get_vocab_size()
        write_checkpoint(d, fields, V, seed=len(family))
        expected = reference(d, rng, V)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{family}: {sorted(p.name for p in d.iterdir())}")
    dense_roundtrip(OUT / "dense", tok_split.get_vocab_size())
    import make_gpt_oss_fixture  # here: it imports this module's helpers
    make_gpt_oss_fixture.main()  # tests/fixtures/hf/gpt_oss
    tok_nfc = make_tokenizer(QWEN_SPLIT, nfc=True)
    for name, tok in (("tokenizer_split", tok_split), ("tokenizer_bytelevel", tok_gpt2),
                      ("tokenizer_nfc", tok_nfc)):
        d = OUT / name
        d.mkdir(exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        tokenizer_expectations(d, tok)
    import make_hf_fixtures_ssm  # mamba/, jamba/, hybrid_jamba/ (it imports this module)
    make_hf_fixtures_ssm.main()
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
