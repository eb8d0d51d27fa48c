"""Write the encoder-decoder fixtures of tests/fixtures/hf/: tiny random T5ForConditionalGeneration
(and SwitchTransformersForConditionalGeneration) checkpoints and what transformers computes
with them (float64, eager attention), for tests/hub/test_t5.py.

    PYTHONPATH=$PWD python tools/make_hf_fixtures_t5.py [name ...]

Checkpoints:
    t5       relu FFN, tied head with the d_model^-1/2 output scale, 8 buckets up to 12; with
             a tiny tokenizer.json in T5's form (a Unigram over 38 pieces, Metaspace, the
             post-processor's </s>) for `sample --hf`
    t5_v11   T5 v1.1: gated-gelu FFN, 3 decoder layers over 2 encoder layers, an untied
             lm_head written as the Hub's v1.1 checkpoints are (config.json's
             tie_word_embeddings false, no scale_decoder_outputs)
    switch   switch_transformers: 4 experts, expert_capacity 2 (tokens beyond it pass
             through unchanged), sparse every 2nd layer, router z-loss and balance loss
Each directory holds config.json and model.safetensors (transformers' save_pretrained,
float32) and expected.npz:
    input_ids (B, Ts), decoder_input_ids (B, Tt), logits (B, Tt, V), G_seed (G =
    default_rng(G_seed).standard_normal((B, Tt, V))), grad/<HF name> = d sum(logits * G) /
    d param for every parameter, greedy (B, N_NEW): generate's ids after the decoder start
    (min_new_tokens = max_new_tokens, cached decoding), saved_by_scratchllm_rel_err
    (scratchllm's save_pretrained of the checkpoint, loaded by from_pretrained: the float32
    logits' largest relative difference from `logits`, asserted < 1e-5 here); switch also
    z_loss, aux_loss (transformers' encoder + decoder router losses, unweighted) and
    grad_aux/<HF name>: the gradient of sum(logits * G) + z_coef z_loss + aux_coef aux_loss.
t5/expected_masked.npz (`... make_hf_fixtures_t5.py t5_masked`; switch_masked likewise
switch/expected_masked.npz), from the checkpoint as it is, nothing else rewritten: a padded
source batch, input_ids (B, Ts) with pad id 0 after each row's length, attention_mask (B, Ts)
0/1, decoder_input_ids, logits, G_seed, grad/<HF name> and greedy as above, all with
attention_mask given to transformers.
float64 as make_hf_fixtures.py does it (float64_everywhere: T5LayerNorm's float32 variance,
the router's float32 dtype).
Reference: huggingface/transformers src/transformers/models/t5/modeling_t5.py,
src/transformers/models/switch_transformers/modeling_switch_transformers.py.
"""
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

from make_hf_fixtures import G_SEED, OUT, ROOT, float64_everywhere

B, TS, TT, N_NEW = 2, 9, 7, 6
T5 = dict(vocab_size=40, d_model=16, d_kv=6, d_ff=24, num_layers=2, num_heads=4,
          relative_attention_num_buckets=8, relative_attention_max_distance=12,
          dropout_rate=0.0, decoder_start_token_id=0)
CHECKPOINTS = {
    "t5": ("t5", dict(T5, feed_forward_proj="relu")),
    "t5_v11": ("t5", dict(T5, feed_forward_proj="gated-gelu", num_decoder_layers=3,
                          layer_norm_epsilon=1e-5)),
    "switch": ("switch_transformers", dict(
        T5, num_layers=4, num_decoder_layers=4, num_sparse_encoder_layers=2,
        num_sparse_decoder_layers=2, num_experts=4, expert_capacity=2,
        router_jitter_noise=0.0, router_z_loss_coef=0.01, router_aux_loss_coef=0.02)),
}
CLASSES = {"t5": transformers.T5ForConditionalGeneration,
           "switch_transformers": transformers.SwitchTransformersForConditionalGeneration}


def randomize(model, seed):
    """Weights large enough to make every path matter: the embedding and a head N(0, 1),
    other matrices N(0, 1/fan_in) (the relative bias tables N(0, 1/H)), norm gains
    1 + N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name in ("shared.weight", "lm_head.weight"):
                value = noise
            elif p.ndim == 2:
                value = noise * p.shape[1] ** -0.5
            else:
                value = 1 + 0.1 * noise
            p.copy_(value.to(p.dtype))


def write_checkpoint(directory, model_type, fields, seed, untied):
    """transformers' save_pretrained of a random tiny model (float32); untied: then an
    lm_head.weight of its own and config.json's tie_word_embeddings false, as the Hub's T5
    v1.1 checkpoints have them."""
    model = CLASSES[model_type](transformers.AutoConfig.for_model(model_type, **fields))
    randomize(model, seed)
    model.save_pretrained(directory)
    if untied:
        state = load_file(Path(directory) / "model.safetensors")
        g = torch.Generator().manual_seed(seed + 1)
        state["lm_head.weight"] = torch.randn(state["shared.weight"].shape, generator=g)
        save_file(state, Path(directory) / "model.safetensors", metadata={"format": "pt"})
        cfg = json.loads((Path(directory) / "config.json").read_text())
        cfg.pop("scale_decoder_outputs", None)
        cfg["tie_word_embeddings"] = False
        (Path(directory) / "config.json").write_text(json.dumps(cfg, indent=2))


def write_tokenizer(directory):
    """A tiny tokenizer.json of T5's form: Unigram (<pad> 0, </s> 1, <unk> 2, then ▁, the
    letters and a few pieces), Metaspace, and the post-processor's "$A </s>"."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    pieces = ["<pad>", "</s>", "<unk>", "\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581the",
              "\u2581a", "th", "er", "in", ".", ",", "\u2581is"]
    vocab = [(p, 0.0 if i < 3 else -1.0 - float(len(p) == 1) - 0.1 * i)
             for i, p in enumerate(pieces)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=2))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>",
                                                       special_tokens=[("</s>", 1)])
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    tok.save(str(Path(directory) / "tokenizer.json"))


def load_float64(directory, model_type):
    """The checkpoint as a float64 model in eval mode, eager attention, built inside
    float64_everywhere from the weights read outside it (an untied lm_head untied, as
    from_pretrained does when it differs from shared.weight)."""
    cfg = transformers.AutoConfig.from_pretrained(directory)
    state = load_file(Path(directory) / "model.safetensors")
    with float64_everywhere():
        model = CLASSES[model_type](cfg).to(torch.float64)
        model.config._attn_implementation = "eager"
    if "lm_head.weight" in state:
        model.lm_head.weight = torch.nn.Parameter(state["lm_head.weight"].double())
    missing, unexpected = model.load_state_dict({k: v.double() for k, v in state.items()},
                                                strict=False)
    tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    assert set(missing) <= tied and not unexpected, (missing, unexpected)
    assert (model.lm_head.weight is model.shared.weight) == ("lm_head.weight" not in state)
    return model.eval()


def reference(directory, model_type, rng, V):
    model = load_float64(directory, model_type)
    src, tgt = rng.integers(0, V, (B, TS)), rng.integers(0, V, (B, TT))
    G = np.random.default_rng(G_SEED).standard_normal((B, TT, V))
    out = dict(input_ids=src, decoder_input_ids=tgt, G_seed=G_SEED)
    with float64_everywhere():
        kwargs = dict(input_ids=torch.tensor(src), decoder_input_ids=torch.tensor(tgt))
        if model_type == "switch_transformers":
            kwargs["output_router_logits"] = True
        result = model(**kwargs)
        (result.logits * torch.tensor(G)).sum().backward()
        out["logits"] = result.logits.detach().numpy()
        out.update(grads_of(model, "grad"))
        if model_type == "switch_transformers":
            out.update(switch_losses(model, kwargs, G))
        with torch.no_grad():
            # a cache without the config: DynamicCache(config) sizes itself by num_layers,
            # too few for a decoder of more layers (num_decoder_layers)
            cache = transformers.EncoderDecoderCache(transformers.DynamicCache(),
                                                     transformers.DynamicCache())
            ids = model.generate(torch.tensor(src), max_new_tokens=N_NEW, cache=cache,
                                 min_new_tokens=N_NEW, do_sample=False)
    assert (ids[:, 0] == model.config.decoder_start_token_id).all()
    out["greedy"] = ids[:, 1:].numpy()
    return out


def grads_of(model, key):
    """{key/<name>: gradient} of every parameter (zeros for an expert no token reached)."""
    return {f"{key}/{n}": np.zeros(tuple(p.shape)) if p.grad is None else p.grad.numpy().copy()
            for n, p in model.named_parameters()}


def switch_losses(model, kwargs, G):
    """The router losses transformers computes with output_router_logits (unweighted), and
    the gradient of sum(logits * G) + z_coef z + aux_coef aux (HF's loss adds those terms)."""
    model.zero_grad()
    result = model(**kwargs)
    z = result.encoder_z_loss + result.decoder_z_loss
    aux = result.encoder_aux_loss + result.decoder_aux_loss
    cfg = model.config
    total = (result.logits * torch.tensor(G)).sum() + cfg.router_z_loss_coef * z + (
        cfg.router_aux_loss_coef * aux)
    total.backward()
    return {"z_loss": float(z.detach()), "aux_loss": float(aux.detach()),
            **grads_of(model, "grad_aux")}


def saved_by_scratchllm(directory, model_type, expected):
    """scratchllm's save_pretrained of the loaded checkpoint, read by from_pretrained."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        model, info = CLASSES[model_type].from_pretrained(
            saved, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            logits = model(input_ids=torch.tensor(expected["input_ids"]),
                           decoder_input_ids=torch.tensor(expected["decoder_input_ids"])).logits
    err = float(np.abs(logits.numpy() - expected["logits"]).max()
                / np.abs(expected["logits"]).max())
    assert err < 1e-5, err
    return err


def masked_reference(directory, model_type, V, lengths=(TS, 5, 3)):
    """expected_masked.npz's arrays: the checkpoint on a padded source batch, one row per
    length (padded with id 0 after it), with attention_mask."""
    model, rng = load_float64(directory, model_type), np.random.default_rng(7)
    src = rng.integers(2, V, (len(lengths), TS))
    mask = (np.arange(TS)[None] < np.array(lengths)[:, None]).astype(np.int64)  # (B, Ts)
    src[mask == 0] = model.config.pad_token_id
    tgt = rng.integers(0, V, (len(lengths), TT))
    G = np.random.default_rng(G_SEED).standard_normal((len(lengths), TT, V))
    out = dict(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, G_seed=G_SEED)
    with float64_everywhere():
        result = model(input_ids=torch.tensor(src), attention_mask=torch.tensor(mask),
                       decoder_input_ids=torch.tensor(tgt))
        (result.logits * torch.tensor(G)).sum().backward()
        out["logits"] = result.logits.detach().numpy()
        out.update(grads_of(model, "grad"))
        with torch.no_grad():
            ids = model.generate(torch.tensor(src), attention_mask=torch.tensor(mask),
                                 max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False)
    out["greedy"] = ids[:, 1:].numpy()
    return out


def main(names=()):
    for name in ("t5", "switch"):
        if f"{name}_masked" in names:
            model_type, fields = CHECKPOINTS[name]
            np.savez_compressed(OUT / name / "expected_masked.npz", **masked_reference(
                OUT / name, model_type, fields["vocab_size"]))
            print(f"{name}: expected_masked.npz")

    for name, (model_type, fields) in CHECKPOINTS.items():
        if names and name not in names:
            continue
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        write_checkpoint(d, model_type, fields, seed=len(name), untied=name == "t5_v11")
        if name == "t5":
            write_tokenizer(d)
        expected = reference(d, model_type, np.random.default_rng(len(name)),
                             fields["vocab_size"])
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, model_type, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{name}: {sorted(p.name for p in d.iterdir())}, saved rel err "
              f"{expected['saved_by_scratchllm_rel_err']:.1e}")


if __name__ == "__main__":
    main(sys.argv[1:])
