"""Write the fixtures of the newer causal LM families in tests/fixtures/hf/ (runs alone):

    PYTHONPATH=$PWD python tools/make_hf_fixtures_causal.py [family ...]

Per family the files make_hf_fixtures.py writes (its docstring: config.json and
model.safetensors by transformers' save_pretrained in float32, tokenizer.json, expected.npz
with transformers' float64 logits, every parameter's gradient of sum(logits * G), greedy ids,
and the float32 logits of scratchllm's save_pretrained loaded by from_pretrained):
    olmo2      output-only norms, QK-norm over the whole projections, GQA
The Mixture-of-Experts families go through make_hf_fixtures_moe.py's writer and reference
(ids redrawn until every routing decision is clear of a tie; per-expert gradient names):
    (none yet)
Reference: huggingface/transformers src/transformers/models/olmo2/modeling_olmo2.py.
"""
import sys
from pathlib import Path

import numpy as np

import make_hf_fixtures as dense
import make_hf_fixtures_moe as moe
from make_hf_fixtures import GEOMETRY, OUT, QWEN_SPLIT, make_tokenizer, saved_by_scratchllm

DENSE = {
    "olmo2": dict(GEOMETRY, model_type="olmo2", rope_theta=500.0),
}
MOE = {}


def main(names=()):
    rng = np.random.default_rng(27)
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
        expected = maker.reference(d, rng, V)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{family}: {sorted(p.name for p in Path(d).iterdir())}")


if __name__ == "__main__":
    main(sys.argv[1:])
