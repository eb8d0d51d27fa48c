"""A padded batch of a loaded checkpoint against transformers: forward(input_ids=,
attention_mask=) gives the real tokens transformers' logits (with the positions its generate
passes: the mask's cumulative sum), every parameter's gradient of sum(logits * G * mask)
matches (Mamba layers too: transformers zeroes the padding's inputs to them), and
generate_batch_ids on the left-padded rows gives transformers' greedy ids (which are each
prompt's alone). Fixtures: tests/fixtures/hf/<name>/expected_padded.npz, written by
tools/make_hf_fixtures_padded.py. No torch here."""
import numpy as np
import pytest

from scratchllm.hub import grad_dict, load_pretrained
from scratchllm.lm import generate_batch_ids, generate_ids
from hub_fixtures import HF, rel_err

SLOW = pytest.mark.slow
NAMES = ["llama", pytest.param("mistral", marks=SLOW), pytest.param("gemma2", marks=SLOW),
         pytest.param("gpt2", marks=SLOW), pytest.param("qwen2", marks=SLOW),
         pytest.param("deepseek_v2", marks=SLOW), "jamba", pytest.param("mamba", marks=SLOW),
         pytest.param("mamba2", marks=SLOW),  # Mamba layers: lm/shifted.py
         pytest.param("llama4_text", marks=SLOW)]  # chunks from the first real token


@pytest.mark.parametrize("name", NAMES)
def test_a_padded_batch_matches_transformers(name):
    ref = dict(np.load(HF / name / "expected_padded.npz"))
    ids, mask = ref["ids"], ref["attention_mask"]
    model = load_pretrained(HF / name, dtype=np.float64)
    logits, cache = model.forward(input_ids=ids, attention_mask=mask)  # (B, T, V)
    real = mask.astype(bool)
    assert rel_err(logits[real], ref["logits"][real]) < 1e-9
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)
    model.zero_grad()
    model.backward(G * mask[..., None], cache, dloss_aux=0.0)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    for key, g in want.items():
        assert rel_err(grads[key], g) < 1e-8, key
    if "greedy" not in ref:  # Mamba, llama4_text: each prompt's own greedy ids (jamba: none)
        if name != "jamba":
            greedy = generate_batch_ids(model, ids[:3], mask[:3], 5, None, temperature=0)
            for b, row in enumerate(mask[:3].astype(bool)):
                assert greedy[b] == list(generate_ids(model, ids[b, row].tolist(), 5, None,
                                                      temperature=0))
        return
    left = ref["greedy"].shape[0]  # the left-padded rows
    greedy = generate_batch_ids(model, ids[:left], mask[:left], ref["greedy"].shape[1], None,
                                temperature=0)
    assert greedy == ref["greedy"].tolist()


def test_a_padded_bert_batch_matches_transformers():
    """BertForMaskedLM with attention_mask: the padding keys masked, positions 0..T-1 (BERT's,
    so the right-padded row is the row alone and the left-padded one is not)."""
    ref = dict(np.load(HF / "bert" / "expected_padded.npz"))
    mask = ref["attention_mask"]
    model = load_pretrained(HF / "bert", dtype=np.float64)
    logits, cache = model.forward(input_ids=ref["ids"], token_type_ids=ref["token_type_ids"],
                                  attention_mask=mask)
    real = mask.astype(bool)
    assert rel_err(logits[real], ref["logits"][real]) < 1e-9
    model.zero_grad()
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)
    model.backward(G * mask[..., None], cache)
    for key, g in grad_dict(model).items():
        if key.endswith("self.key.bias"):  # q . bk is the same in every score of a row:
            assert np.abs(g).max() < 1e-12  # softmax ignores it, the gradient is 0 exactly
            continue
        assert rel_err(g, ref["grad/" + key]) < 1e-8, key


def test_a_padded_batch_is_refused_by_name_where_it_is_not_implemented():
    model = load_pretrained(HF / "deepseek_v32")
    ids = np.ones((2, 4), np.int64)
    with pytest.raises(ValueError, match="attention_mask with a lightning indexer"):
        model.forward(input_ids=ids, attention_mask=np.array([[0, 1, 1, 1], [1] * 4]))
