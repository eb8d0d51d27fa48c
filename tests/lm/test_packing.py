"""Packed documents through a whole LM (Llama 3's document masking): a batch whose rows hold
several documents, run with doc_ids, gives each document's logits and each parameter's
gradient exactly as the documents run one by one; and the corpus option that packs them."""
import numpy as np
import pytest

from scratchllm.lm import LM
from scratchllm.specs import preset
from scratchllm.train import corpus

TINY = dict(vocab_size=31, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24,
            kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
LENGTHS = [[3, 5, 1], [6, 3]]  # two packed rows of 9 tokens: documents of 3, 5, 1 and 6, 3
CASES = {
    "rope": ("dense", {}),
    "learned": ("dense", dict(positions="learned", max_positions=16)),
    "sinusoidal": ("dense", dict(positions="sinusoidal")),
    "alibi": ("dense", dict(positions="alibi")),
    "window": ("dense", dict(window=4)),
    "mla": ("dense", dict(attention="mla")),
    "chunk": ("dense", dict(layer_types=["chunked_attention"] * 2, attention_chunk=2)),
    "moe": ("moe", dict(n_experts=4, d_ff=8)),
}


def _grads(model):
    return {n: p.grad.copy() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_packed_batch_equals_each_document_alone(case):
    name, extra = CASES[case]
    model = LM(preset(name, **dict(TINY, **extra)), rng=np.random.default_rng(1), dtype=np.float64)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 31, (2, 9))  # (B, T)
    doc = np.array([np.repeat(np.arange(len(ls)), ls) for ls in LENGTHS])  # (B, T)
    logits, cache = model.forward(ids, doc_ids=doc)  # (B, T, V)
    dlogits = rng.standard_normal(logits.shape)  # (B, T, V)
    model.zero_grad()
    model.backward(dlogits, cache, dloss_aux=0.0)  # MoE aux terms count the batch: not per doc
    packed = _grads(model)
    summed = {n: np.zeros_like(g) for n, g in packed.items()}
    model.zero_grad()
    for row, ls in enumerate(LENGTHS):
        for start, n in zip(np.cumsum([0] + ls[:-1]), ls):
            part = slice(start, start + n)
            alone, c1 = model.forward(ids[row:row + 1, part])  # positions 0..n-1
            np.testing.assert_allclose(logits[row, part], alone[0], rtol=0, atol=1e-12)
            model.backward(dlogits[row:row + 1, part], c1, dloss_aux=0.0)
    for n, g in _grads(model).items():
        scale = max(np.abs(g).max(), 1e-30)
        assert np.abs(packed[n] - g).max() / scale < 1e-11, n
    plain, _ = model.forward(ids)  # without doc_ids the documents see each other
    assert np.abs(plain[:, 3:] - logits[:, 3:]).max() > 1e-4


def test_packing_refuses_what_cannot_stay_inside_a_document():
    ids = np.zeros((1, 6), dtype=np.int64)
    doc = np.array([[0, 0, 0, 1, 1, 1]])
    hybrid = LM(preset("hybrid", **dict(TINY, n_layers=4, n_experts=4, d_ff=8)),
                rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match="recurrence would carry one document"):
        hybrid.forward(ids, doc_ids=doc)
    sinks = LM(preset("swa", **dict(TINY, window=4, n_sink=2)), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="packed_mask: mask=.*sinks"):
        sinks.forward(ids, doc_ids=doc)
    dense = LM(preset("dense", **TINY), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="doc_ids has shape"):
        dense.forward(ids, doc_ids=doc[:, :5])


def test_document_ids_start_a_new_document_after_each_separator():
    eot = 9
    x = np.array([[1, 2, eot, 3, 4, eot, eot, 5], [eot, 1, 2, 3, 4, 5, 6, 7]])
    doc = corpus.document_ids(x, eot)
    assert doc.tolist() == [[0, 0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1, 1]]
    with pytest.raises(ValueError, match="document_ids: eot"):
        corpus.document_ids(x, -1)


def test_packed_training_step_runs_and_differs_from_unpacked():
    from scratchllm.train.settings import Settings
    from scratchllm.train.trainer import Run
    ids = np.random.default_rng(0).integers(0, 31, 400).astype(np.int32)
    ids[::17] = 30  # a separator every 17 tokens
    losses = {}
    for pack in (False, True):
        run = Run(preset("dense", **TINY), Settings(steps=2, batch_size=2, seq_len=16,
                                                    threads=1, warmup=1, pack_documents=pack))
        run.eot = 30
        losses[pack] = [run.train_step(ids)[0] for _ in range(2)]
        assert np.isfinite(run.evaluate(run.eval_set(ids[:100])))  # (x, y[, doc_ids]) batches
        run.dp.close()
    assert np.isfinite(losses[True]).all()
    assert losses[True] != losses[False]
