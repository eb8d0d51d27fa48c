"""The bad-input audit's cases of options: the optimizer's, the commands' flags (a command must
refuse a bad flag in one line naming it), the configs', and attention's window and positions
(an option must act, or be refused: never ignored)."""
import numpy as np

from audit_common import ERROR, rng


# ---------------------------------------------------------------------------- the optimizer
def adamw_lr_inf():
    from scratchllm.core import AdamW, Param
    return AdamW([Param(np.zeros(2))], lr=float("inf"))


def clip_nan():
    from scratchllm.core import Param, clip_grad_norm
    p = Param(np.zeros(2))
    p.grad[:] = [np.nan, 1.0]
    return clip_grad_norm([p], 1.0)


# ---------------------------------------------------------------------------- commands
def _command(*argv):
    """Run a command in a fresh temporary directory (a run that is not refused must not write
    into the checkout); its exit code and stderr are what is classified."""
    import os
    import tempfile
    from scratchllm import cli
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        return cli.main(list(argv))


def train_lr_inf():
    return _command("train", "--lr", "inf", "--steps", "1")


def train_lr_1e6():
    return _command("train", "--lr", "1e6", "--steps", "1")


def train_seed_negative():
    return _command("train", "--seed", "-1", "--steps", "1")


def compare_steps_0():
    return _command("compare", "--steps", "0")


def sample_max_tokens_negative():
    return _command("sample", "--checkpoint", "nowhere", "--max-tokens", "-5")


def drill_syntax_error():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/zoh.py", "w").write("def zoh(:\n")
        return _command("drill", "check", "zoh", "--dir", tmp)


# ---------------------------------------------------------------------------- configs
def config_norm_eps_negative():
    from scratchllm.lm import preset
    return preset("dense", norm_eps=-1e-5)


def config_rope_base_inf():
    from scratchllm.lm import preset
    return preset("dense", rope_base=float("inf"))


def config_window_str():
    from scratchllm.lm import preset
    return preset("dense", window="4")


def config_capacity_zero():
    from scratchllm.lm import preset
    return preset("moe", capacity_factor=0.0)


# ---------------------------------------------------------------------------- attention
def _gqa_inputs(T=9):
    from scratchllm.attention import AttentionWeights
    r = rng()
    w = AttentionWeights(*(r.standard_normal(s) for s in ((8, 8), (8, 4), (8, 4), (8, 8))))
    return r.standard_normal((1, T, 8)), w


def _gqa_spec(**mask):
    """4 query heads, 2 KV heads, no RoPE; Mask(**mask)."""
    from scratchllm.specs import AttentionSpec, Mask
    return AttentionSpec(4, 2, rope=None, mask=Mask(**mask))


def gqa_window_default_mask():
    from scratchllm.attention import gqa_forward, sliding_window_mask
    from scratchllm.specs import Mask
    x, w = _gqa_inputs()
    y, _ = gqa_forward(x, w, spec=_gqa_spec(window=4))
    want, _ = gqa_forward(x, w, spec=_gqa_spec(), mask=Mask(array=sliding_window_mask(9, 4)))
    return float(np.abs(y - want).max())  # right answer: 0 (the window acts)


def attention_window_decode():
    from scratchllm.attention import Attention
    r = rng()
    layer = Attention(8, _gqa_spec(window=4), rng=r, dtype=np.float64)
    x = r.standard_normal((1, 9, 8))
    y, _ = layer.forward(x)
    st = layer.init_state(1, 9)
    dec = np.stack([layer.decode(x[:, t], st, t) for t in range(9)], axis=1)
    return float(np.abs(dec - y).max())  # right answer: 0


def gqa_positions_without_rope():
    from scratchllm.attention import gqa_forward, make_rope
    from scratchllm.specs import RopeSpec
    x, w = _gqa_inputs()
    return gqa_forward(x, w, spec=_gqa_spec(), rope=make_rope(RopeSpec(), 2, np.arange(9) + 5))


def gqa_window_explicit_mask():
    from scratchllm.attention import causal_mask, gqa_forward
    x, w = _gqa_inputs()
    return gqa_forward(x, w, spec=_gqa_spec(array=causal_mask(9), window=4))


def gqa_t0():
    from scratchllm.attention import gqa_forward
    x, w = _gqa_inputs(0)
    return gqa_forward(x, w, spec=_gqa_spec())


OPTION_CASES = [  # "--flag": a command's clear error naming the flag
    (adamw_lr_inf, ERROR), (clip_nan, ERROR), (train_lr_inf, "--lr"), (train_lr_1e6, "--lr"),
    (train_seed_negative, "--seed"), (compare_steps_0, "--steps"),
    (sample_max_tokens_negative, "--max-tokens"), (drill_syntax_error, ERROR),
    (config_norm_eps_negative, ERROR), (config_rope_base_inf, ERROR), (config_window_str, ERROR),
    (config_capacity_zero, ERROR), (gqa_window_default_mask, 0.0),
    (attention_window_decode, 0.0), (gqa_positions_without_rope, ERROR),
    (gqa_window_explicit_mask, ERROR), (gqa_t0, ERROR),
]
