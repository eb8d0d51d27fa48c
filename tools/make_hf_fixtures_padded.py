"""Write tests/fixtures/hf/<name>/expected_padded.npz: what transformers computes on a padded
batch (attention_mask) of the existing checkpoints (nothing else rewritten), for
tests/hub/test_padded_batch.py.

    PYTHONPATH=$PWD:$PWD/tools python tools/make_hf_fixtures_padded.py [name ...]

Checkpoints: llama (RoPE with llama3 scaling), mistral (a sliding window of 4 < T), gemma2
(alternating sliding / global layers, attention and final soft-caps, the embedding's
padding_idx), gpt2 (learned positions: the table is read at the mask's positions), qwen2,
deepseek_v2 (MLA with YaRN, group-limited routing; per-expert gradient names as
make_hf_fixtures_moe.py writes them), mamba, mamba2 and jamba (transformers masks the
padding's inputs to their mixers, apply_mask_to_padding_states; make_hf_fixtures_ssm.py's
loader and gradient names), llama4_text (chunks from each row's first real token, as
masking_utils.chunked_overlay's left_padding; its NoPE layers' temperature tuning reads the
cache position, the index in the padded row, so a padded row is not the row alone there, in
transformers and here; no greedy); and bert (BertForMaskedLM: right and left padding, positions 0..T-1 as BERT's, no greedy).
The batch: MASK's rows, left-padded, unpadded, and padded on both sides; the padding holds the
config's pad_token_id (0 without one). Positions as transformers' generate passes them
(generation/utils.py _prepare_position_ids_for_generation: attention_mask.cumsum(-1) - 1,
0 at padding), given to the forward as position_ids.
expected_padded.npz: ids (B, T), attention_mask (B, T), logits (B, T, V) (the padding's
rows are transformers' own and compared nowhere), G_seed (G = default_rng(G_seed).
standard_normal((B, T, V)) times the mask: a loss that skips the padding), grad/<HF name>
= d sum(logits * G * mask) / d param, greedy (B, N_NEW): generate on the left-padded rows
(LEFT: MASK without its right-padded row), eos off; none for mamba, mamba2 and jamba
(scratchllm generates no padded batch with a recurrent state; transformers' own padded
mamba2 generate is not each prompt's alone in 5.24). The script checks that transformers
itself gives each row's real tokens the logits of the row alone and each left-padded row the
greedy ids of the prompt alone, both within 1e-12 / exactly.
float64 as make_hf_fixtures.py (load_float64, float64_everywhere).
Reference: huggingface/transformers src/transformers/generation/utils.py,
src/transformers/models/{llama,mistral,gemma2,gpt2,qwen2}/modeling_*.py.
"""
import sys

import numpy as np
import torch

import make_hf_fixtures_encoders as encoders
import make_hf_fixtures_moe as moe
import make_hf_fixtures_ssm as ssm
from make_hf_fixtures import G_SEED, OUT, float64_everywhere, load_float64

NAMES = ("llama", "mistral", "gemma2", "gpt2", "qwen2", "deepseek_v2", "mamba", "mamba2",
         "jamba", "llama4_text")
MASK = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1],
                 [1, 1, 1, 1, 1, 1, 1, 1, 1],
                 [0, 0, 0, 0, 0, 0, 1, 1, 1],
                 [0, 1, 1, 1, 1, 1, 1, 0, 0]])
MOE = ("deepseek_v2", "llama4_text")
BY_INDEX = ("llama4_text",)  # temperature tuning at the cache position: no alone, no greedy
SSM = ("mamba", "mamba2", "jamba")  # loaded as make_hf_fixtures_ssm.py loads them  # loaded as make_hf_fixtures_moe.py loads them (fused experts)
LEFT = 3  # the first three rows are left-padded (or unpadded): the ones generate takes
N_NEW = 8


def positions(mask):
    return np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 0)


def padded_reference(directory):
    moe_family, ssm_family = directory.name in MOE, directory.name in SSM
    model = (moe.load_float64 if moe_family else ssm.load_float64 if ssm_family
             else load_float64)(directory)
    model.generation_config.eos_token_id = None  # every row generates N_NEW ids
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    V = model.config.vocab_size
    ids = np.random.default_rng(7).integers(0, V, MASK.shape)
    ids[MASK == 0] = pad
    G = np.random.default_rng(G_SEED).standard_normal(MASK.shape + (V,)) * MASK[..., None]
    with float64_everywhere():
        logits = model(torch.tensor(ids), attention_mask=torch.tensor(MASK),
                       position_ids=torch.tensor(positions(MASK))).logits
        (logits * torch.tensor(G)).sum().backward()
        grads = {n: p.grad.numpy() for n, p in model.named_parameters()}
        grads = moe.checkpoint_grads(model) if moe_family else ssm.checkpoint_names(
            grads) if ssm_family else grads
        grads = {f"grad/{n}": g.copy() for n, g in grads.items()}
        logits = logits.detach().numpy()
        with torch.no_grad():
            if directory.name in BY_INDEX:  # not each row alone, in transformers either
                return dict(ids=ids, attention_mask=MASK, logits=logits, G_seed=G_SEED,
                            **grads)
            for b, row in enumerate(MASK.astype(bool)):  # transformers: each row alone
                alone = model(torch.tensor(ids[b:b + 1, row])).logits.numpy()[0]
                err = np.abs(alone - logits[b, row]).max() / np.abs(alone).max()
                assert err < 1e-12, (directory.name, b, err)
            if ssm_family:  # no padded generation for recurrent states (in scratchllm)
                return dict(ids=ids, attention_mask=MASK, logits=logits, G_seed=G_SEED,
                            **grads)
            greedy = model.generate(torch.tensor(ids[:LEFT]), attention_mask=torch.tensor(
                MASK[:LEFT]), max_new_tokens=N_NEW, do_sample=False, pad_token_id=pad)
            greedy = greedy[:, MASK.shape[1]:].numpy()
            for b, row in enumerate(MASK[:LEFT].astype(bool)):
                alone = model.generate(torch.tensor(ids[b:b + 1, row]), max_new_tokens=N_NEW,
                                       do_sample=False, pad_token_id=pad)
                assert (alone[0, row.sum():].numpy() == greedy[b]).all(), (directory.name, b)
    return dict(ids=ids, attention_mask=MASK, logits=logits, G_seed=G_SEED, greedy=greedy,
                **grads)


BERT_MASK = np.array([[1, 1, 1, 1, 1, 1, 1, 1, 1],
                      [1, 1, 1, 1, 1, 0, 0, 0, 0],    # right padding: the row alone
                      [0, 0, 0, 1, 1, 1, 1, 1, 1]])   # left: positions still 0..T-1


def bert_reference(directory):
    """BertForMaskedLM on a padded batch: attention_mask only (BERT's positions are
    0..T-1 whatever the padding), token types drawn; logits, the gradients of
    sum(logits * G * mask); the right-padded rows checked against the row alone."""
    model = encoders.load_float64(directory)
    cfg = model.config
    rng = np.random.default_rng(8)
    ids = rng.integers(0, cfg.vocab_size, BERT_MASK.shape)
    ids[BERT_MASK == 0] = cfg.pad_token_id
    types = rng.integers(0, cfg.type_vocab_size, BERT_MASK.shape)
    G = np.random.default_rng(G_SEED).standard_normal(BERT_MASK.shape + (cfg.vocab_size,))
    G = G * BERT_MASK[..., None]
    with float64_everywhere():
        logits = model(input_ids=torch.tensor(ids), token_type_ids=torch.tensor(types),
                       attention_mask=torch.tensor(BERT_MASK)).logits
        (logits * torch.tensor(G)).sum().backward()
        grads = {f"grad/{n}": p.grad.numpy().copy() for n, p in model.named_parameters()}
        logits = logits.detach().numpy()
        with torch.no_grad():
            for b in (0, 1):
                n = BERT_MASK[b].sum()
                alone = model(input_ids=torch.tensor(ids[b:b + 1, :n]),
                              token_type_ids=torch.tensor(types[b:b + 1, :n])).logits
                err = np.abs(alone.numpy()[0] - logits[b, :n]).max() / np.abs(logits).max()
                assert err < 1e-12, (b, err)
    return dict(ids=ids, token_type_ids=types, attention_mask=BERT_MASK, logits=logits,
                G_seed=G_SEED, **grads)


def main(names=()):
    for name in names or NAMES + ("bert",):
        if name == "bert":
            np.savez_compressed(OUT / name / "expected_padded.npz",
                                **bert_reference(OUT / name))
            print("bert: written")
            continue
        out = padded_reference(OUT / name)
        np.savez_compressed(OUT / name / "expected_padded.npz", **out)
        print(f"{name}: greedy {out['greedy'].tolist() if 'greedy' in out else None}")


if __name__ == "__main__":
    main(sys.argv[1:])
