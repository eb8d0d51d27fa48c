"""Write tests/fixtures/hf/gpt_oss/: a tiny random gpt-oss checkpoint and what transformers
computes with it in float64 (make_hf_fixtures.py's format: config.json, model.safetensors,
tokenizer.json, expected.npz with ids, logits, G_seed, grad/<HF name>, greedy,
saved_by_scratchllm_rel_err). make_hf_fixtures.py calls this; it also runs alone:

    PYTHONPATH=$PWD python tools/make_gpt_oss_fixture.py

The geometry makes every gpt-oss detail act: layer_types [sliding (W = 4 < T = 9), full],
q/k/v/o biases, sink logits N(0, 1), 4 experts top-2 with a router bias, expert weights
N(0, 1/fan_in) and biases, swiglu_limit 1.2 so that the clamps bind on a good share of the
gate and up values, YaRN with truncate false. Routing is kept away from top-k ties: the ids
are redrawn until every token of the forward, and of the greedy sequence, has a gap of at
least MARGIN between its k-th and (k+1)-th router logit in every layer.
Reference: huggingface/transformers src/transformers/models/gpt_oss/modeling_gpt_oss.py.
"""
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_fixtures import (B, OUT, P, QWEN_SPLIT, T, float64_everywhere,  # noqa: E402
                              load_float64, make_tokenizer, reference, saved_by_scratchllm,
                              write_checkpoint)

FIELDS = dict(model_type="gpt_oss", head_dim=8, num_local_experts=4, num_experts_per_tok=2,
              sliding_window=4, layer_types=["sliding_attention", "full_attention"],
              swiglu_limit=1.2, rope_parameters=dict(
                  rope_type="yarn", factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
                  original_max_position_embeddings=16, rope_theta=500.0))
MARGIN = 1e-3
K = FIELDS["num_experts_per_tok"]


def rescale_moe(directory):
    """Sinks N(0, 1) and the experts' matrices N(0, 1/fan_in) (randomize gives every
    non-matrix 0.1 N(0, 1)), written back in float32."""
    from safetensors.torch import load_file, save_file
    path = Path(directory) / "model.safetensors"
    state = load_file(path)
    g = torch.Generator().manual_seed(3)
    for name, p in state.items():
        if name.endswith("sinks"):
            state[name] = torch.randn(p.shape, generator=g, dtype=torch.float64).float()
        elif name.endswith(("gate_up_proj", "down_proj")):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            state[name] = (noise * p.shape[1] ** -0.5).float()
    save_file(state, path, metadata={"format": "pt"})


def min_router_margin(model, ids):
    """The smallest gap between the k-th and (k+1)-th router logit over all tokens and
    layers of a forward over ids."""
    gaps = []

    def hook(module, args, out):
        top = torch.topk(out[0], K + 1, dim=-1).values  # out[0]: router_logits (BT, E)
        gaps.append(float((top[:, K - 1] - top[:, K]).min()))

    handles = [layer.mlp.router.register_forward_hook(hook) for layer in model.model.layers]
    with float64_everywhere(), torch.no_grad():
        model(torch.tensor(ids))
    for h in handles:
        h.remove()
    return min(gaps)


def main():
    d = OUT / "gpt_oss"
    d.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(QWEN_SPLIT)
    tok.save(str(d / "tokenizer.json"))
    V = tok.get_vocab_size()
    write_checkpoint(d, FIELDS, V, seed=7)
    rescale_moe(d)
    model = load_float64(d)
    for seed in range(100):
        expected = reference(d, np.random.default_rng(seed), V)
        greedy_seq = np.concatenate([expected["ids"][:1, :P], expected["greedy"][None]], 1)
        margin = min(min_router_margin(model, expected["ids"]),
                     min_router_margin(model, greedy_seq))
        if margin > MARGIN:
            break
    else:
        raise RuntimeError("no ids with routing away from ties in 100 draws")
    expected["router_margin"] = margin
    expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected)
    print(f"gpt_oss: ids seed {seed}, router margin {margin:.3g}, (B, T) = {(B, T)}, "
          f"{sorted(p.name for p in d.iterdir())}")


if __name__ == "__main__":
    main()
