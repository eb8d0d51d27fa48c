"""config.json's RoPE fields read by families/base.py's rope_of: partial_rotary_factor (from
rope_parameters or the top level) for the families that turn part of each head, refused by
name for the others, and written back by rope_parameters."""
import pytest

from scratchllm.hub.families.base import rope_of, rope_parameters
from scratchllm.specs import preset
from scratchllm.specs.unflat import flat_view


@pytest.mark.parametrize("hf", [
    dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.25)),
    dict(rope_theta=1e4, partial_rotary_factor=0.25)])  # an older config: the top level
def test_partial_rotary_factor_is_read_where_the_family_implements_it(hf):
    assert rope_of(hf, partial=True) == (1e4, None, 0.25)
    with pytest.raises(ValueError, match=r"partial_rotary_factor = 0.25 \(a partial rotary "
                                         r"dim\) is not implemented for model_type 'llama'"):
        rope_of(dict(hf, model_type="llama"))


def test_a_bad_factor_is_named_and_absent_is_one():
    assert rope_of({"rope_theta": 500.0}, partial=True) == (500.0, None, 1.0)
    with pytest.raises(ValueError, match=r"partial_rotary_factor = 0 must be a number in"):
        rope_of({"partial_rotary_factor": 0}, partial=True)


def test_rope_parameters_writes_the_factor_back():
    f = flat_view(preset("dense", rope_partial=0.5, d_model=32))
    params, _ = rope_parameters(f, 64)
    assert params["partial_rotary_factor"] == 0.5
    assert rope_of({"rope_parameters": params}, partial=True)[2] == 0.5
    assert "partial_rotary_factor" not in rope_parameters(flat_view(preset("dense")), 64)[0]
