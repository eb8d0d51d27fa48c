"""Write the Qwen3-Next fixture of tests/fixtures/hf/ (runs alone):

    PYTHONPATH=$PWD python tools/make_hf_fixtures_qwen3_next.py

qwen3_next/ holds what make_hf_fixtures.py's families hold (config.json and model.safetensors
by transformers' save_pretrained in float32, tokenizer.json, expected.npz with transformers'
float64 logits, every parameter's gradient of sum(logits * G) under its checkpoint name,
greedy ids, routing_margin, and the float32 logits of scratchllm's save_pretrained loaded by
from_pretrained), through make_hf_fixtures_moe.py's writer and reference (ids redrawn until
every routing decision is clear of a tie). The tiny model exercises:
    - layers linear, full, linear, full: gated DeltaNet and gated attention;
    - the gated DeltaNet with 2 key heads of 4 and 4 value heads of 6 (two value heads per
      key head: q and k repeated), a causal conv of 4, A_log = log U[1, 4] and dt_bias
      N(0, 0.5^2) (decays exp(g) of about 0.2 to 0.9 per token);
    - gated attention: 4 query heads, 2 KV heads of 16, RoPE on the first quarter of each
      head (partial_rotary_factor 0.25, Qwen3-Next's), QK-norm with gains 1 + w;
    - MoE (softmax top-2 of 4, norm_topk_prob) with a shared expert of twice the expert
      width behind its sigmoid gate, layer 0 dense (mlp_only_layers [0]).
qwen3_next_dense/ (make_hf_fixtures.py's reference: no routers) has what the first leaves
out: attention_bias (q_proj's bias, query and gate head by head, and o_proj's), one value
head per key head, a conv of 3, RoPE on half of each head, dense SwiGLUs only
(num_experts 0), 3 layers.
In float64: transformers casts to float32 in RMSNormGated and the gated delta rule;
float64_everywhere points those casts at float64 while the references are computed.
Reference: huggingface/transformers src/transformers/models/qwen3_next/modeling_qwen3_next.py.
"""
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
import transformers

import make_hf_fixtures as dense
import make_hf_fixtures_moe as moe
from make_hf_fixtures import OUT, QWEN_SPLIT, make_tokenizer, saved_by_scratchllm

QWEN3_NEXT = dict(
    model_type="qwen3_next", hidden_size=16, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, intermediate_size=24, rms_norm_eps=1e-6,
    max_position_embeddings=64,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=4,
    linear_value_head_dim=6, linear_conv_kernel_dim=4,
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
    shared_expert_intermediate_size=16, decoder_sparse_step=1, mlp_only_layers=[0],
    norm_topk_prob=True,
    rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.25))
QWEN3_NEXT_DENSE = dict(  # the paths the first leaves out (a slow-tier test)
    QWEN3_NEXT, num_hidden_layers=3, num_experts=0, attention_bias=True, head_dim=8,
    layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_num_key_heads=2, linear_num_value_heads=2, linear_conv_kernel_dim=3,
    mlp_only_layers=[], rope_parameters=dict(rope_type="default", rope_theta=1000.0,
                                             partial_rotary_factor=0.5))
FIXTURES = {"qwen3_next": QWEN3_NEXT, "qwen3_next_dense": QWEN3_NEXT_DENSE}


def randomize(model, seed):
    """make_hf_fixtures_moe.randomize_moe, then the gated DeltaNet's decay parameters:
    A_log = log U[1, 4] and dt_bias N(0, 0.5^2)."""
    moe.randomize_moe(model, seed)
    g = torch.Generator().manual_seed(seed + 2000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(1 + 3 * torch.rand(p.shape, generator=g, dtype=torch.float64)))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64))


def write(family, fields, tok):
    d = OUT / family
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    V = tok.get_vocab_size()
    cfg = transformers.AutoConfig.for_model(**{**fields, "vocab_size": V})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize(model, len(family))
    model.save_pretrained(d)
    maker = moe if fields["num_experts"] else dense
    expected = maker.reference(d, np.random.default_rng(zlib.crc32(family.encode())), V)
    expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected)
    print(f"{family}: {sorted(p.name for p in Path(d).iterdir())}")


def main(names=()):
    tok = make_tokenizer(QWEN_SPLIT)
    for family, fields in FIXTURES.items():
        if not names or family in names:
            write(family, fields, tok)


if __name__ == "__main__":
    main(sys.argv[1:])
