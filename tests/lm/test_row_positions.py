"""One position per row in LM.decode: sequences at different lengths share a batch (a row at
position 0 starts a new sequence in its slot), and each decodes as it does alone."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.attention import Attention, KVState, gqa_decode
from scratchllm.lm import LM
from scratchllm.specs import AttentionSpec

V = LM_TINY["vocab_size"]
VARIANTS = [("dense", {}), ("mla", {}), ("moe", {}), ("swa", {}),
            ("swa", dict(positions="alibi")), ("dense", dict(positions="learned")),
            ("dense", dict(positions="alibi")), ("dense", dict(positions="sinusoidal")),
            ("dense", dict(attn_sinks=True, qk_norm=True)),
            ("dense", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                         "original_max_position_embeddings": 8}))]


def _alone(model, seq):
    """Logits (T, V) of one sequence decoded by itself, batch 1."""
    state = model.init_state(1, len(seq))
    return np.stack([model.decode(seq[t:t + 1], state, t)[0] for t in range(len(seq))])


@pytest.mark.parametrize("name, flat", VARIANTS)
def test_rows_at_different_positions_decode_as_each_alone(name, flat):
    model = LM(lm_tiny(name, **flat), rng=np.random.default_rng(0), dtype=np.float64)
    rng = np.random.default_rng(1)
    seqs = [rng.integers(0, V, n) for n in (9, 4, 6, 5)]
    # row -> [(sequence, first step)]: row 1 runs seq 1, then seq 2 in the same slot
    plan = {0: [(0, 0)], 1: [(1, 0), (2, 4)], 2: [(2, 0), (3, 6)]}
    state, seen = model.init_state(3, 10), []
    for step in range(9):
        runs = [[(s, step - t0) for s, t0 in plan[row] if t0 <= step][-1] for row in plan]
        ids = np.array([seqs[s][p] for s, p in runs])
        positions = np.array([p for _, p in runs])  # step 6: [6, 2, 0]
        logits = model.decode(ids, state, positions)  # (3, V)
        seen += [(s, p, logits[row]) for row, (s, p) in enumerate(runs)]
    alone = [_alone(model, seq) for seq in seqs]
    for s, p, logits in seen:
        np.testing.assert_allclose(logits, alone[s][p], rtol=0, atol=1e-12,
                                   err_msg=f"{name} {flat}: sequence {s} at {p}")


def test_greedy_requests_joining_a_running_batch_get_their_own_tokens():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(4))  # float32
    prompts = [[3, 7, 1], [5], [2, 9, 4, 4, 8]]
    n_new = 6

    def greedy_alone(prompt):
        state, ids = model.init_state(1, len(prompt) + n_new), list(prompt)
        for t in range(len(prompt) + n_new - 1):
            logits = model.decode(np.array(ids[t:t + 1]), state, t)
            if t >= len(prompt) - 1:
                ids.append(int(logits[0].argmax()))
        return ids[len(prompt):]

    # two slots; the third request waits for the first to finish, then takes its slot
    queue, slots, out = list(range(len(prompts))), [None, None], {}
    state = model.init_state(2, max(len(p) for p in prompts) + n_new)
    while queue or any(s is not None for s in slots):
        for i in range(2):
            if slots[i] is None and queue:
                r = queue.pop(0)
                slots[i], out[r] = (r, 0), list(prompts[r])
        # an idle slot decodes token 0 at position 0 (a fresh start) and its logits are dropped
        ids = np.array([out[s[0]][s[1]] if s else 0 for s in slots])
        logits = model.decode(ids, state, np.array([s[1] if s else 0 for s in slots]))
        for i, slot in enumerate(slots):
            if slot is None:
                continue
            r, p = slot
            if p + 1 >= len(out[r]):
                out[r].append(int(logits[i].argmax()))
            done = len(out[r]) == len(prompts[r]) + n_new
            slots[i] = None if done else (r, p + 1)
    assert [out[r][len(prompts[r]):] for r in range(3)] == [greedy_alone(p) for p in prompts]


def test_rows_in_step_give_the_int_path_exactly():
    rng = np.random.default_rng(2)
    layer = Attention(16, AttentionSpec(4, 2), rng=rng)
    x = rng.standard_normal((3, 5, 16)).astype(np.float32)
    a, b = KVState(3, 2, 4, 5), KVState(3, 2, 4, 5)
    for t in range(5):
        ya = layer.decode(x[:, t], a, t)
        yb = layer.decode(x[:, t], b, np.full(3, t))
        assert np.array_equal(ya, yb)


def test_wrong_row_positions_and_unsupported_states_raise():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    state = model.init_state(2, 8)
    model.decode(np.array([1, 2]), state, np.array([0, 0]))
    with pytest.raises(ValueError, match=r"position\[1\]=2, but row 1 holds 1 tokens"):
        model.decode(np.array([1, 2]), state, np.array([1, 2]))
    with pytest.raises(ValueError, match=r"one per row"):
        model.decode(np.array([1, 2]), state, np.array([1.0, 1.0]))
    model.decode(np.array([1, 2]), state, np.array([1, 0]))  # row 1 starts over
    with pytest.raises(ValueError, match="position=2, but the state holds"):
        model.decode(np.array([1, 2]), state, 2)  # an int needs the rows in step
    recurrent = LM(lm_tiny("linear", layer_pattern="LL"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="recurrent state keeps no positions"):
        recurrent.decode(np.array([1, 2]), recurrent.init_state(2, 4), np.array([0, 1]))
    w = Attention(8, AttentionSpec(2, 1, rope=None), rng=np.random.default_rng(0))._weights()
    with pytest.raises(ValueError, match="ints >= 0"):
        gqa_decode(np.zeros((2, 8)), w, KVState(2, 1, 4, 4), np.array([0, 0, 0]),
                   spec=AttentionSpec(2, 1, rope=None))


class _Plain:
    """A state of the plain protocol only (n_seen, append, kv, positions), as a paged cache's
    view is: one length for all rows, no key_mask."""

    def __init__(self, inner):
        self.inner = inner

    n_seen = property(lambda self: self.inner.n_seen)
    append = property(lambda self: self.inner.append)
    kv = property(lambda self: self.inner.kv)
    positions = property(lambda self: self.inner.positions)


def test_states_of_the_plain_protocol_still_decode_with_one_int():
    rng = np.random.default_rng(3)
    layer = Attention(16, AttentionSpec(4, 2), rng=rng)
    x = rng.standard_normal((2, 4, 16)).astype(np.float32)
    a, b = KVState(2, 2, 4, 4), _Plain(KVState(2, 2, 4, 4))
    for t in range(4):
        assert np.array_equal(layer.decode(x[:, t], a, t), layer.decode(x[:, t], b, t))
    with pytest.raises(ValueError, match="keeps one length for all rows"):
        layer.decode(x[:, 0], _Plain(KVState(2, 2, 4, 4)), np.array([0, 0]))
