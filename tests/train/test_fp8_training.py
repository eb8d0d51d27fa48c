"""Training with FP8 matmuls (Settings.fp8): every Linear but the head runs the FP8 pair in the
step and in evaluation, the weights stay float32, and the loss stays near float32's."""
import numpy as np

from grads.cases import lm_tiny
from scratchllm.core.fp8 import FP8LinearCache
from scratchllm.train import trainer
from scratchllm.train.settings import Settings


def _run(fp8):
    s = Settings(batch_size=2, seq_len=8, steps=3, warmup=1, threads=1, fp8=fp8)
    return trainer.Run(lm_tiny("dense"), s)


def test_an_fp8_step_quantises_the_blocks_linears_and_not_the_head():
    ids = np.random.default_rng(0).integers(0, lm_tiny("dense").vocab_size, 400)
    runs = {fp8: _run(fp8) for fp8 in (False, True)}
    for run in runs.values():
        for _ in range(3):
            run.train_step(ids)
    a, b = runs[False].losses, runs[True].losses
    assert a[0] == b[0] or abs(a[0] - b[0]) < 0.05  # step 1: the same weights, FP8 rounding
    assert a != b and all(np.isfinite(b))
    assert all(p.data.dtype == np.float32 for p in runs[True].model.parameters())
    model = runs[True].model
    with runs[True].precision():
        _, cache = model.forward(ids[:16].reshape(2, 8))
    kinds = {type(c).__name__ for c in _leaves(cache)}
    assert "FP8LinearCache" in kinds
    assert not isinstance(cache.head.proj, FP8LinearCache)  # the head stays float


def _leaves(tree):
    if isinstance(tree, FP8LinearCache):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for t in tree:
            yield from _leaves(t)


def _instances(tree, kind):
    if isinstance(tree, kind):
        yield tree
    if isinstance(tree, (tuple, list)):
        for t in tree:
            yield from _instances(t, kind)


def test_the_moe_router_stays_out_of_fp8():
    """DeepSeek-V3 keeps its MoE gating in the original precision (sec. 3.3.1): inside
    fp8_matmuls the router's logits are the float ones bit for bit while the same matmul
    elsewhere is FP8, and an MoE model's FP8 forward has FP8 experts and float routers."""
    from scratchllm.core import ops
    from scratchllm.core.fp8 import FP8Spec, fp8_matmuls
    from scratchllm.lm import LM
    from scratchllm.moe.router import RouterCache, router_forward
    from scratchllm.specs import RouterSpec
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 256)).astype(np.float32)  # two 128-channel tiles per row
    w = rng.standard_normal((256, 8)).astype(np.float32)
    spec = RouterSpec(n_experts=8, top_k=2, score="sigmoid")
    plain, _ = router_forward(x, w, spec=spec)
    with fp8_matmuls(FP8Spec()):
        out, cache = router_forward(x, w, spec=spec)
        y, lin = ops.linear_forward(x, w)
    assert isinstance(lin, FP8LinearCache) and not np.array_equal(y, x @ w)
    assert not isinstance(cache.linear, FP8LinearCache)
    np.testing.assert_array_equal(out.logits, plain.logits)
    np.testing.assert_array_equal(out.topk_idx, plain.topk_idx)
    model = LM(lm_tiny("moe"), rng=np.random.default_rng(1))
    with fp8_matmuls(FP8Spec()):
        _, lm_cache = model.forward(rng.integers(0, model.cfg.vocab_size, (2, 8)))
    routers = list(_instances(lm_cache, RouterCache))
    assert routers and not any(isinstance(r.linear, FP8LinearCache) for r in routers)
    assert any(True for _ in _leaves(lm_cache))  # the experts' and attention's linears are FP8
