"""A padded batch through a whole LM (forward(input_ids=, attention_mask=), lm/padding.py): each
row's real tokens get the logits and the gradients of the row alone, unpadded, for every kind
of position and mask; a left-padded batch generates what each prompt alone generates; and the
masks and models a padded batch cannot take are refused by name."""
import numpy as np
import pytest

from scratchllm.lm import LM, generate_batch_ids, generate_ids, padded_positions
from scratchllm.specs import preset

TINY = dict(vocab_size=31, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=24,
            kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
CASES = {
    "rope": ("dense", {}),
    "learned": ("dense", dict(positions="learned", max_positions=16)),
    "alibi": ("dense", dict(positions="alibi")),
    "window": ("dense", dict(window=3)),
    "mla": ("dense", dict(attention="mla")),
    "chunk": ("dense", dict(layer_types=["chunked_attention"] * 2, attention_chunk=2)),
    "hybrid": ("hybrid", dict(n_layers=4, n_experts=4, d_ff=8)),  # Mamba + attention, MoE
    "mamba2": ("mamba2", dict(n_layers=2, layer_pattern="SS")),
}
MASK = np.array([[0, 0, 0, 1, 1, 1, 1],    # left padding
                 [1, 1, 1, 1, 1, 1, 1],
                 [0, 1, 1, 1, 1, 0, 0]])   # both sides


def _model(case):
    name, extra = CASES[case]
    return LM(preset(name, **dict(TINY, **extra)), rng=np.random.default_rng(1),
              dtype=np.float64)


def _grads(model):
    return {n: p.grad.copy() for n, p in model.named_parameters()}


def test_positions_are_the_masks_cumulative_sum_as_transformers_generate_computes_them():
    assert padded_positions(MASK).tolist() == [[0, 0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6],
                                               [0, 0, 1, 2, 3, 0, 0]]


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_batch_equals_each_row_alone(case):
    model = _model(case)
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 31, MASK.shape)  # (B, T)
    logits, cache = model.forward(input_ids=ids, attention_mask=MASK)  # (B, T, V)
    dlogits = rng.standard_normal(logits.shape) * MASK[..., None]  # a loss skips padding
    model.zero_grad()
    model.backward(dlogits, cache, dloss_aux=0.0)  # MoE aux terms count the whole batch
    padded = _grads(model)
    model.zero_grad()
    for b, row in enumerate(MASK.astype(bool)):
        alone, c1 = model.forward(ids[b:b + 1, row])  # positions 0..n-1
        np.testing.assert_allclose(logits[b, row], alone[0], rtol=0, atol=1e-12)
        model.backward(dlogits[b:b + 1, row], c1, dloss_aux=0.0)
    for n, g in _grads(model).items():
        assert np.abs(padded[n] - g).max() / max(np.abs(g).max(), 1e-30) < 1e-11, n
    plain, _ = model.forward(ids)  # without the mask the padding is read
    assert np.abs(plain[0, 3:] - logits[0, 3:]).max() > 1e-4


@pytest.mark.parametrize("case", ["rope", "window", "mla", "mamba2"])
def test_a_left_padded_batch_generates_what_each_prompt_alone_generates(case):
    model = _model(case)
    ids = np.random.default_rng(3).integers(0, 31, (3, 6))
    mask = np.array([[0, 0, 0, 1, 1, 1], [1] * 6, [0, 1, 1, 1, 1, 1]])  # T > window
    greedy = generate_batch_ids(model, ids, mask, 5, None, temperature=0)
    for b, row in enumerate(mask.astype(bool)):
        alone = list(generate_ids(model, ids[b, row].tolist(), 5, None, temperature=0))
        assert greedy[b] == alone
    rngs = [np.random.default_rng(s) for s in (4, 5, 6)]  # sampled: row b with rng b
    drawn = generate_batch_ids(model, ids, mask, 5, rngs, temperature=1.0, top_p=None)
    for b, row in enumerate(mask.astype(bool)):
        alone = generate_ids(model, ids[b, row].tolist(), 5, np.random.default_rng(4 + b),
                             temperature=1.0, top_p=None)
        assert drawn[b] == list(alone)


def test_a_row_stops_at_its_stop_id_and_the_others_go_on():
    model = _model("rope")
    ids = np.random.default_rng(3).integers(0, 31, (2, 4))
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    full = generate_batch_ids(model, ids, mask, 6, None, temperature=0)
    stop = full[0][2]
    cut = generate_batch_ids(model, ids, mask, 6, None, stop_ids={stop}, temperature=0)
    assert cut[0] == full[0][:full[0].index(stop)]
    assert cut[1] == full[1][:full[1].index(stop)] if stop in full[1] else cut[1] == full[1]


def test_position_ids_are_what_rope_and_a_position_table_read():
    rope, learned = _model("rope"), _model("learned")
    ids = np.random.default_rng(5).integers(0, 31, (2, 6))
    base, _ = rope.forward(ids)
    shifted, _ = rope.forward(input_ids=ids, position_ids=np.arange(6) + 4)  # RoPE: relative
    np.testing.assert_allclose(shifted, base, rtol=0, atol=1e-12)
    plain, _ = learned.forward(ids)
    same, _ = learned.forward(input_ids=ids, position_ids=np.tile(np.arange(6), (2, 1)))
    np.testing.assert_allclose(same, plain, rtol=0, atol=1e-12)
    moved, _ = learned.forward(input_ids=ids, position_ids=np.arange(6) + 4)
    assert np.abs(moved - plain).max() > 1e-3
    padded, _ = learned.forward(input_ids=ids, attention_mask=MASK[:2, 1:],
                                position_ids=np.arange(6))  # transformers' forward default
    cumsum, _ = learned.forward(input_ids=ids, attention_mask=MASK[:2, 1:])
    assert np.abs(padded[0, 2:] - cumsum[0, 2:]).max() > 1e-4  # row 0 is left-padded
    np.testing.assert_allclose(padded[1], cumsum[1], rtol=0, atol=1e-12)  # unpadded
    with pytest.raises(ValueError, match="position_ids must be ints >= 0 of shape"):
        rope.forward(input_ids=ids, position_ids=np.arange(5))


def test_what_a_padded_batch_cannot_take_is_refused_by_name():
    dense = _model("rope")
    ids = np.zeros((2, 4), np.int64)
    with pytest.raises(ValueError, match="row 0 .* padding inside the real tokens"):
        dense.forward(input_ids=ids, attention_mask=np.array([[1, 0, 1, 1], [1] * 4]))
    with pytest.raises(ValueError, match="row 1 has no real token"):
        dense.forward(input_ids=ids, attention_mask=np.array([[1] * 4, [0] * 4]))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        dense.forward(input_ids=ids, attention_mask=np.ones((2, 3), np.int64))
    with pytest.raises(ValueError, match="0/1"):
        dense.forward(input_ids=ids, attention_mask=np.full((2, 4), 2))
    with pytest.raises(ValueError, match="not both"):
        dense.forward(input_ids=ids, attention_mask=np.ones((2, 4), np.int64), doc_ids=ids)
    with pytest.raises(ValueError, match="generation needs left padding"):
        generate_batch_ids(dense, ids, np.array([[1, 1, 1, 0], [1] * 4]), 2, None,
                           temperature=0)
    rwkv = LM(preset("rwkv", **dict(TINY, n_layers=2, layer_pattern="WW")),
              rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match="attention_mask needs attention, MLA, Mamba"):
        rwkv.forward(input_ids=ids, attention_mask=np.ones((2, 4), np.int64))
    hybrid = _model("hybrid")  # Mamba layers take the batch, not a decoding state per row
    with pytest.raises(ValueError, match="which a MambaState does not keep"):
        generate_batch_ids(hybrid, ids, np.array([[0, 1, 1, 1], [1] * 4]), 2, None,
                           temperature=0)


def test_the_loss_of_a_padded_batch_leaves_the_padding_out():
    model = _model("rope")
    rng = np.random.default_rng(6)
    ids, targets = rng.integers(0, 31, MASK.shape), rng.integers(0, 31, MASK.shape)
    loss, cache = model.loss(ids, targets, attention_mask=MASK)
    model.zero_grad()
    model.loss_backward(1.0, cache)
    padded = _grads(model)
    real = MASK.astype(bool)
    n = real.sum(1)  # (B,)
    model.zero_grad()
    total = 0.0
    for b in range(len(MASK)):  # the mean over every real token = sum_b n_b ce_b / sum n_b
        alone, c1 = model.loss(ids[b:b + 1, real[b]], targets[b:b + 1, real[b]])
        model.loss_backward(n[b] / n.sum(), c1)
        total += float(alone) * n[b] / n.sum()
    assert abs(float(loss) - total) < 1e-12
    for name, g in _grads(model).items():
        assert np.abs(padded[name] - g).max() / max(np.abs(g).max(), 1e-30) < 1e-11, name
