"""Write tests/fixtures/hf/<name>/expected_pad.npz: what transformers computes when the
inputs hold the config's pad_token_id, for the families whose config.json sets one, from
their existing checkpoints (nothing else rewritten), for tests/hub/test_pad_ids.py.

    PYTHONPATH=$PWD:$PWD/tools python tools/make_hf_fixtures_pad.py [name ...]

Checkpoints: gemma3, gemma2, olmo2, jamba (nn.Embedding(vocab, D, padding_idx=
config.pad_token_id): the pad row's lookups pass no gradient) and mamba (nn.Embedding without
padding_idx: its pad_token_id is a token id only); llama and mixtral, whose configs leave
pad_token_id None, with config.json's pad_token_id set to SET_PAD (a copy of the checkpoint in
a temporary directory: the test makes the same copy).
expected_pad.npz: ids (B, T) with the pad id at several places, pad_id, logits (B, T, V),
G_seed (G = default_rng(G_seed).standard_normal((B, T, V))), embed_grad (V, D): the
embedding's gradient of sum(logits * G), float64 (make_hf_fixtures.py's load_float64;
make_hf_fixtures_ssm.py's for jamba, mamba and mixtral).
Reference: huggingface/transformers src/transformers/models/{gemma3,gemma2,olmo2,jamba,mamba}/
modeling_*.py (their embed_tokens / embeddings).
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

import make_hf_fixtures_ssm as ssm
from make_hf_fixtures import G_SEED, OUT, float64_everywhere, load_float64

NAMES = ("gemma3", "gemma2", "olmo2", "jamba", "mamba", "llama", "mixtral")
SET_PAD = {"llama": 3, "mixtral": 3}
B, T = 2, 6


def pad_reference(directory):
    load = ssm.load_float64 if directory.name in ("jamba", "mamba", "mixtral") else load_float64
    model = load(directory)
    pad, V = model.config.pad_token_id, model.config.vocab_size
    ids = np.random.default_rng(3).integers(0, V, (B, T))
    ids[0, [1, 4]] = pad
    ids[1, 0] = pad
    G = np.random.default_rng(G_SEED).standard_normal((B, T, V))
    with float64_everywhere():
        logits = model(torch.tensor(ids)).logits
        (logits * torch.tensor(G)).sum().backward()
    embed = model.get_input_embeddings().weight
    return dict(ids=ids, pad_id=pad, logits=logits.detach().numpy(), G_seed=G_SEED,
                embed_grad=embed.grad.numpy().copy())


def with_pad(name, tmp):
    """The checkpoint's directory, or for SET_PAD's a copy with that pad_token_id."""
    if name not in SET_PAD:
        return OUT / name
    d = shutil.copytree(OUT / name, Path(tmp) / name)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "pad_token_id": SET_PAD[name]}))
    return d


def main(names=()):
    for name in names or NAMES:
        with tempfile.TemporaryDirectory() as tmp:
            out = pad_reference(with_pad(name, tmp))
        np.savez_compressed(OUT / name / "expected_pad.npz", **out)
        print(f"{name}: pad {out['pad_id']}, pad row's gradient "
              f"{np.abs(out['embed_grad'][out['pad_id']]).max():.2e}")


if __name__ == "__main__":
    main(sys.argv[1:])
