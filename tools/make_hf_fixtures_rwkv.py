"""Write tests/fixtures/hf/rwkv_rescale/: RWKV-4 with transformers' inference rescale on
(rescale_every 2 of 3 blocks: the hidden state halved after block 1, block 2's
attention.output and feed_forward.value weights divided by 2), in make_hf_fixtures.py's
format (config.json, model.safetensors, tokenizer.json, expected.npz with float64 logits,
every gradient, greedy ids and the float32 logits of scratchllm's save read by
from_pretrained).

    PYTHONPATH=$PWD:$PWD/tools python tools/make_hf_fixtures_rwkv.py

transformers rescales in eval mode only (RwkvModel._rescale_layers divides the weights in
place at the first forward), so its parameters' .grad are gradients of the divided weights
w' = w / 2^k; expected.npz holds the gradients of the checkpoint's own tensors w (what
scratchllm.hub.grad_dict gives): dL/dw = dL/dw' / 2^k. Also train_mode_rel_err: how far
transformers' training-mode logits (no rescale) are from its inference logits, so the test
knows the rescale is exercised (it differs only through the LayerNorms' eps).
Reference: huggingface/transformers src/transformers/models/rwkv/modeling_rwkv.py
(RwkvModel.forward, RwkvModel._rescale_layers).
"""
import numpy as np
import torch

import make_hf_fixtures as dense
import make_hf_fixtures_causal as causal  # noqa: F401  (RWKV's load_float64: no state)
from make_hf_fixtures import OUT, QWEN_SPLIT, float64_everywhere, make_tokenizer

NAME = "rwkv_rescale"
N, L = 2, 3
FIELDS = dict(model_type="rwkv", hidden_size=16, num_hidden_layers=L, intermediate_size=24,
              context_length=64, rescale_every=N)
RESCALED = ("attention.output.weight", "feed_forward.value.weight")


def main():
    tok = make_tokenizer(QWEN_SPLIT)
    V = tok.get_vocab_size()
    d = OUT / NAME
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    dense.write_checkpoint(d, FIELDS, V, seed=11)
    expected = dense.reference(d, np.random.default_rng(11), V)
    for i in range(L):  # the gradients of the files' weights, not of transformers' w / 2^k
        for name in RESCALED:
            expected[f"grad/rwkv.blocks.{i}.{name}"] /= 2.0 ** (i // N)
    model = dense.load_float64(d).train()  # training mode: no rescale, no dropout in RWKV
    with float64_everywhere(), torch.no_grad():
        plain = model(torch.tensor(expected["ids"])).logits.numpy()
    ref = expected["logits"]
    expected["train_mode_rel_err"] = float(np.abs(plain - ref).max() / np.abs(ref).max())
    expected["saved_by_scratchllm_rel_err"] = dense.saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected)
    print(f"{NAME}: train mode differs by {expected['train_mode_rel_err']:.2e}; saved "
          f"{expected['saved_by_scratchllm_rel_err']:.2e}")


if __name__ == "__main__":
    main()
