"""The MoE layer's two gate options: the router's gate on the experts' input (Llama 4,
MoESpec.gate_input) and a sigmoid gate on the shared expert (Qwen2-MoE / Qwen3-Next,
MoESpec.shared_gate): the layer equals its per-token reference twin, the Module owns the
gate, the flat names carry both, and a shared gate without a shared expert is refused."""
import numpy as np
import pytest

from scratchllm.moe import MoE, moe_forward, moe_forward_ref
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec, from_flat
from scratchllm.specs.unflat import to_flat


@pytest.mark.parametrize("options", [dict(gate_input=True), dict(shared_gate=True),
                                     dict(gate_input=True, shared_gate=True)])
def test_the_gates_equal_the_reference_twin(options):
    rng = np.random.default_rng(0)
    spec = MoESpec(RouterSpec(4, 2, "sigmoid", norm_topk_prob=False), ExpertsSpec(d_ff=5),
                   d_shared=3, **options)
    layer = MoE(6, spec, rng=rng, dtype=np.float64)
    if layer.shared_gate is not None:
        layer.shared_gate.data[...] = rng.standard_normal(6)
    x = rng.standard_normal((2, 5, 6))
    y = moe_forward(x, layer.weights(), spec=spec)[0].y
    np.testing.assert_allclose(y, moe_forward_ref(x, layer.weights(), spec=spec)[0].y,
                               rtol=0, atol=1e-13)
    assert spec.n_params(6) == 6 * 4 + 4 * 3 * 6 * 5 + 3 * 6 * 3 + (
        6 if spec.shared_gate else 0)


def test_flat_names_and_refusal():
    cfg = from_flat(ffn="moe", n_shared=1, shared_gate=True, moe_gate_input=True, d_model=8,
                    n_heads=2, n_kv_heads=1, d_ff=4, n_layers=1, vocab_size=11)
    flat = to_flat(cfg)
    assert flat["shared_gate"] is True and flat["moe_gate_input"] is True
    with pytest.raises(ValueError, match="shared_gate.*needs d_shared > 0"):
        MoESpec(shared_gate=True)
    with pytest.raises(ValueError, match="shared_gate"):
        from_flat(ffn="moe", shared_gate=True)
