"""Write the fixtures of the newer causal LM families in tests/fixtures/hf/ (runs alone):

    PYTHONPATH=$PWD python tools/make_hf_fixtures_causal.py [family ...]

Per family the files make_hf_fixtures.py writes (its docstring: config.json and
model.safetensors by transformers' save_pretrained in float32, tokenizer.json, expected.npz
with transformers' float64 logits, every parameter's gradient of sum(logits * G), greedy ids,
and the float32 logits of scratchllm's save_pretrained loaded by from_pretrained):
    olmo2      output-only norms, QK-norm over the whole projections, GQA
The Mixture-of-Experts families go through make_hf_fixtures_moe.py's writer and reference
(ids redrawn until every routing decision is clear of a tie; per-expert gradient names):
    qwen3_moe       qwen3 attention (QK-norm per head, head_dim 12), a dense first layer
                    (mlp_only_layers [0]), softmax top-2 of 4 experts with norm_topk_prob
    qwen3_moe_step  decoder_sparse_step 2 (the second layer MoE), norm_topk_prob false
Reference: huggingface/transformers src/transformers/models/olmo2/modeling_olmo2.py,
src/transformers/models/gemma2/modeling_gemma2.py,
src/transformers/models/qwen3_moe/modeling_qwen3_moe.py.
"""
import sys
import zlib
from pathlib import Path

import numpy as np

import make_hf_fixtures as dense
import make_hf_fixtures_moe as moe
from make_hf_fixtures import GEOMETRY, OUT, QWEN_SPLIT, make_tokenizer, saved_by_scratchllm

DENSE = {
    "olmo2": dict(GEOMETRY, model_type="olmo2", rope_theta=500.0),
    "gemma2": dict(GEOMETRY, model_type="gemma2", head_dim=12, query_pre_attn_scalar=10,
                   sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                   rope_theta=1000.0),
}
_QWEN3_MOE = dict(GEOMETRY, model_type="qwen3_moe", head_dim=12, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=8, rope_theta=1e6)
MOE = {
    "qwen3_moe": dict(_QWEN3_MOE, num_hidden_layers=3, mlp_only_layers=[0],
                      norm_topk_prob=True),
    "qwen3_moe_step": dict(_QWEN3_MOE, num_hidden_layers=2, decoder_sparse_step=2,
                           norm_topk_prob=False),
}


def main(names=()):
    tok = make_tokenizer(QWEN_SPLIT)
    V = tok.get_vocab_size()
    for family, fields in {**DENSE, **MOE}.items():
        if names and family not in names:
            continue
        maker = moe if family in MOE else dense
        d = OUT / family
        d.mkdir(parents=True, exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        maker.write_checkpoint(d, fields, V, seed=len(family))
        rng = np.random.default_rng(zlib.crc32(family.encode()))  # the ids: own seed each
        expected = maker.reference(d, rng, V)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{family}: {sorted(p.name for p in Path(d).iterdir())}")


if __name__ == "__main__":
    main(sys.argv[1:])
