"""The bad-input audit of issue 18, re-runnable: every case is a small program run in its own
forked process (a segfault or a hang cannot take the audit down), classified as

    clear      ValueError/TypeError whose message starts with the function or command name
    unclear    any other exception, or a message that names nothing ("index 3 is out of ...")
    wrong      a result returned where an error (or another value) is the right answer
    nonfinite  NaN or inf returned where a finite result is the right answer
    hang       no answer within --timeout seconds
    crash      the process died on a signal (segfault)
    ok         the right answer (an expected finite value)

Run it against any checkout:  PYTHONPATH=/path/to/checkout python benchmarks/audit.py
(`--list` prints each case's outcome, `--only NAME...` runs the cases named). The cases are
the issue's reproductions plus the categories it names, and those of audit_extra.py (masks,
decoding states, the Tokenizer's methods, sizes); their `want` says what the right answer is.
"""
import argparse
import multiprocessing as mp
import re
import sys
import traceback
from collections import Counter

import numpy as np

from audit_extra import EXTRA_CASES

CLEAR = re.compile(r"^(scratchllm )?[A-Za-z_][\w.]*( \w+)?: |^\S+ line \d+: |^/")
ERROR = "error"  # the right answer is a clear error


def _rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------------------- the cases
def scan_short_dy():
    from scratchllm.ssm import selective_scan_backward, selective_scan_forward
    r, (b, T, d, N) = _rng(), (1, 100_000, 4, 2)
    _, c = selective_scan_forward(r.standard_normal((b, T, d)), r.random((b, T, d)),
                                  -r.random((d, N)), r.standard_normal((b, T, N)),
                                  r.standard_normal((b, T, N)), np.ones(d))
    return selective_scan_backward(np.ones((b, 1, d)), c)


def scan_gpt2_bad_offsets():
    from scratchllm.tokenizer import fast
    data = np.frombuffer(b"hello world", np.uint8)
    return fast.scan_gpt2(data, fast.char_classes(), np.array([10 ** 9], np.int64))


def scan_gpt2_truncated_utf8():
    from scratchllm.tokenizer import fast
    data = np.frombuffer(b"ab\xf0", np.uint8)
    return fast.scan_gpt2(data, fast.char_classes(), np.array([3], np.int64))


def merge_loop_bad_words():
    from scratchllm.tokenizer.fast_train import merge_loop_numba
    sym = np.array([1, 2, 1, 2], np.int64)
    return list(merge_loop_numba(sym, np.array([10 ** 8]), np.array([4]), np.array([1]), 5))


def _pair_dy(op, dy_of):
    from scratchllm.core import ops
    x = _rng().standard_normal((3, 4))
    fwd, bwd = getattr(ops, f"{op}_forward"), getattr(ops, f"{op}_backward")
    out, c = fwd(x, np.ones(4)) if op == "rmsnorm" else fwd(x)
    return bwd(dy_of(out), c)


def rmsnorm_row_dy():
    return _pair_dy("rmsnorm", lambda y: np.ones((1, 4)))


def softmax_row_dy():
    return _pair_dy("softmax", lambda y: np.ones((1, 4)))


def silu_row_dy():
    return _pair_dy("silu", lambda y: np.ones((1, 4)))


def linear_float32_dy():
    from scratchllm.core import linear_backward, linear_forward
    y, c = linear_forward(np.ones((2, 3)), np.ones((3, 5)))
    return linear_backward(y.T.copy().astype(np.float32).T, c)


def moe_transposed_dy():
    from scratchllm.moe import MoEOut, MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    r, (D, E, F) = _rng(), (4, 3, 5)
    x = r.standard_normal((6, D))
    w = MoEWeights(r.standard_normal((D, E)), None, r.standard_normal((E, D, F)),
                   r.standard_normal((E, D, F)), r.standard_normal((E, F, D)))
    out, c = moe_forward(x, w, spec=MoESpec(RouterSpec(E, 2), ExpertsSpec(d_ff=F)))
    return moe_backward(MoEOut(np.ones((D, 6)), None, None), c)


def adamw_lr_inf():
    from scratchllm.core import AdamW, Param
    return AdamW([Param(np.zeros(2))], lr=float("inf"))


def clip_nan():
    from scratchllm.core import Param, clip_grad_norm
    p = Param(np.zeros(2))
    p.grad[:] = [np.nan, 1.0]
    return clip_grad_norm([p], 1.0)


def _cli(*argv):
    """Run a command in a fresh temporary directory (a run that is not refused must not write
    into the checkout); its exit code and stderr are what is classified."""
    import os
    import tempfile
    from scratchllm import cli
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        return cli.main(list(argv))


def train_lr_inf():
    return _cli("train", "--lr", "inf", "--steps", "1")


def train_lr_1e6():
    return _cli("train", "--lr", "1e6", "--steps", "1")


def train_seed_negative():
    return _cli("train", "--seed", "-1", "--steps", "1")


def compare_steps_0():
    return _cli("compare", "--steps", "0")


def sample_max_tokens_negative():
    return _cli("sample", "--checkpoint", "nowhere", "--max-tokens", "-5")


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


def _gqa_inputs(T=9):
    from scratchllm.attention import AttentionWeights
    r = _rng()
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
    r = _rng()
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


def sdpa_t0():
    from scratchllm.attention import sdpa_forward
    return sdpa_forward(np.ones((1, 1, 2, 4)), np.ones((1, 1, 0, 4)), np.ones((1, 1, 0, 4)))


def lm_t0():
    from grads.cases import lm_tiny
    from scratchllm.lm import LM
    model = LM(lm_tiny("dense"), rng=_rng())
    return model.loss(np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64))


def rmsnorm_list():
    from scratchllm.core import rmsnorm_forward
    return rmsnorm_forward([[1.0, 2.0]], np.ones(2))


def rmsnorm_0d():
    from scratchllm.core import rmsnorm_forward
    return rmsnorm_forward(np.array(3.0), np.ones(1))


def embedding_list():
    from scratchllm.core import embedding_forward
    return embedding_forward([1, 2], np.ones((4, 3)))


def rmsnorm_float32_1e20():
    from scratchllm.core import rmsnorm_forward
    y, _ = rmsnorm_forward(np.full((1, 4), 1e20, np.float32), np.ones(4, np.float32))
    return y  # right answer: ones


def rmsnorm_float16_300():
    from scratchllm.core import rmsnorm_forward
    y, _ = rmsnorm_forward(np.full((1, 4), 300, np.float16), np.ones(4, np.float16))
    return y  # right answer: ones


def softmax_float16_vocab():
    from scratchllm.core import softmax_forward
    y, _ = softmax_forward(np.zeros((1, 128_256), np.float16))
    return float(y.astype(np.float64).sum())  # right answer: 1


def ce_float16_65536():
    from scratchllm.core import cross_entropy_forward
    loss, _ = cross_entropy_forward(np.zeros((2, 65_536), np.float16), np.array([0, 1]))
    return float(loss)  # right answer: ln 65536 = 11.09


def zoh_huge_delta():
    from scratchllm.ssm import zoh_forward
    out, _ = zoh_forward(np.array([-2.0]), np.array([1.0]), np.array(1e308))
    return float(out.B_bar[0])  # right answer: -B/A = 0.5


def sigmoid_router_underflow():
    from scratchllm.moe import router_forward
    from scratchllm.specs import RouterSpec
    x = np.full((1, 2), -500.0)
    out, _ = router_forward(x, np.eye(2) * 2, spec=RouterSpec(2, 2, "sigmoid"))
    return out.gates  # right answer: finite gates summing to 1


def sample_tiny_temperature():
    from scratchllm.lm.sampling import sample_next
    return sample_next(np.array([0.0, 3.0, 1.0]), _rng(), temperature=1e-310)  # right: 1


def eval_seq_len_too_long():
    from scratchllm.train import corpus
    return corpus.eval_batches(np.arange(50), 2, 128, 1000)


def bpe_long_pretoken():
    from scratchllm.tokenizer import Tokenizer
    vocab = {b: bytes([b]) for b in range(256)}
    merges = [(b"a", b"b"), (b"ab", b"ab")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return len(Tokenizer(vocab, merges).encode("ab" * 200_000))  # right: 100,000 ids


def _tok_file(tmp, edit):
    from scratchllm.tokenizer import Tokenizer
    tok = Tokenizer({b: bytes([b]) for b in range(256)}, [])
    path = f"{tmp}/tok.bpe"
    tok.save(path)
    lines = open(path, encoding="utf-8").read().split("\n")
    open(path, "w", encoding="utf-8").write("\n".join(edit(lines)))
    return Tokenizer.load(path)


def _in_tmp(edit):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return _tok_file(tmp, edit)


def tokfile_redos_pattern():
    return _in_tmp(lambda ls: [ls[0], 'pattern "(a|a)+$"'] + ls[2:])


def tokfile_dropping_pattern():
    return _in_tmp(lambda ls: [ls[0], 'pattern "[a-z]+"'] + ls[2:])


def tokfile_truncated():
    return _in_tmp(lambda ls: ls[:100])


def tokfile_huge_id():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", f"{1 << 31} \"<s>\""] + ls[3:])


def tokfile_duplicate_id():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", "3 \"<s>\""] + ls[3:])


def tokfile_empty_special():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", "999 \"\""] + ls[3:])


def drill_syntax_error():
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/zoh.py", "w").write("def zoh(:\n")
        return _cli("drill", "check", "zoh", "--dir", tmp)


def corpus_bad_utf8():
    import tempfile
    from scratchllm.tokenizer import train_bpe
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/bad.txt", "wb").write(b"hello \xff world")
        return train_bpe(f"{tmp}/bad.txt", 260, workers=1)


CASES = [  # (case, want): ERROR = a clear error; "--flag": a command's clear error naming the
    # flag (exit 1 or 2, one line `scratchllm COMMAND: ...`, no traceback); else the result
    (scan_short_dy, ERROR), (scan_gpt2_bad_offsets, ERROR), (scan_gpt2_truncated_utf8, ERROR),
    (merge_loop_bad_words, ERROR), (rmsnorm_row_dy, ERROR), (softmax_row_dy, ERROR),
    (silu_row_dy, ERROR), (linear_float32_dy, ERROR), (moe_transposed_dy, ERROR),
    (adamw_lr_inf, ERROR), (clip_nan, ERROR), (train_lr_inf, "--lr"), (train_lr_1e6, "--lr"),
    (train_seed_negative, "--seed"), (compare_steps_0, "--steps"),
    (sample_max_tokens_negative, "--max-tokens"),
    (config_norm_eps_negative, ERROR), (config_rope_base_inf, ERROR), (config_window_str, ERROR),
    (config_capacity_zero, ERROR), (gqa_window_default_mask, 0.0),
    (attention_window_decode, 0.0), (gqa_positions_without_rope, ERROR),
    (gqa_window_explicit_mask, ERROR), (gqa_t0, ERROR), (sdpa_t0, ERROR), (lm_t0, ERROR),
    (rmsnorm_list, ERROR), (rmsnorm_0d, ERROR), (embedding_list, ERROR),
    (rmsnorm_float32_1e20, np.ones((1, 4))), (rmsnorm_float16_300, np.ones((1, 4))),
    (softmax_float16_vocab, 1.0), (ce_float16_65536, float(np.log(65536))),
    (zoh_huge_delta, 0.5), (sigmoid_router_underflow, np.full((1, 2), 0.5)),
    (sample_tiny_temperature, 1), (eval_seq_len_too_long, ERROR), (bpe_long_pretoken, 100_000),
    (tokfile_redos_pattern, ERROR), (tokfile_dropping_pattern, ERROR), (tokfile_truncated, ERROR),
    (tokfile_huge_id, ERROR), (tokfile_duplicate_id, ERROR), (tokfile_empty_special, ERROR),
    (drill_syntax_error, ERROR), (corpus_bad_utf8, ERROR),
] + EXTRA_CASES


# ---------------------------------------------------------------------------- running
def _child(case, conn):
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            value = case()
        if isinstance(value, int) and case.__name__.startswith(_CLI_CASES) and value != 0:
            conn.send(("exit", (value, err.getvalue())))  # a command's exit code
        else:
            conn.send(("value", value))
    except SystemExit as e:
        conn.send(("exit", (e.code, err.getvalue())))
    except BaseException as e:  # classify, whatever it is
        conn.send(("raise", (type(e).__name__, str(e), traceback.format_exc(limit=2))))


_CLI_CASES = ("train_", "compare_", "sample_max", "drill_")


def _close(a, b):
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        # rtol 5e-3: float16 results (2^-11 relative rounding per entry) count as right
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=5e-3, atol=1e-12))
    except (TypeError, ValueError):
        return False


def _finite(v):
    """False if v, or any array inside a dict / tuple / list v, holds NaN or inf."""
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, (tuple, list)) and v and not np.isscalar(v[0]):
        return all(_finite(x) for x in v)
    try:
        return bool(np.isfinite(np.asarray(v, dtype=np.float64)).all())
    except (TypeError, ValueError):
        return True


def classify(kind, payload, want):
    if kind == "raise":
        name, msg, _ = payload
        if isinstance(want, str) and want.startswith("--"):
            return "unclear"  # a command let an exception escape: a traceback
        clear = name in ("ValueError", "TypeError", "CheckpointError", "NonFiniteError",
                         "FileNotFoundError", "MemoryError") and CLEAR.match(msg)
        return "clear" if clear else "unclear"
    if kind == "exit":
        code, err = payload
        last = err.strip().splitlines()[-1] if err.strip() else ""
        one_line = "Traceback" not in err and re.match(r"scratchllm \w+( \w+)?: ", last)
        names = not (isinstance(want, str) and want.startswith("--")) or want in last
        return "clear" if code in (1, 2) and one_line and names else "unclear"
    if isinstance(want, str) and want.startswith("--"):
        return "wrong"  # the command ran instead of refusing the flag
    if want is ERROR:
        return "wrong" if _finite(payload) else "nonfinite"
    if not _finite(payload):
        return "nonfinite"
    return "ok" if _close(payload, want) else "wrong"


def run_case(case, want, timeout):
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, child))
    proc.start()
    child.close()
    if not parent.poll(timeout):
        proc.kill()
        proc.join()
        return "hang", [f"no answer in {timeout:.0f} s"]
    try:
        kind, payload = parent.recv()
    except EOFError:
        proc.join()
        return "crash", f"exit code {proc.exitcode}"
    proc.join()
    detail = payload[1] if kind == "raise" else payload if kind == "value" else payload[1]
    return classify(kind, payload, want), str(detail).strip().splitlines()[-1:] or [""]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--list", action="store_true", help="print every case's outcome")
    p.add_argument("--only", nargs="*", help="run only the cases named (or audit_extra's: extra)")
    args = p.parse_args(argv)
    cases = [(c, w) for c, w in CASES if not args.only or c.__name__ in args.only
             or ("extra" in args.only and (c, w) in EXTRA_CASES)]
    counts = Counter()
    for case, want in cases:
        outcome, detail = run_case(case, want, args.timeout)
        counts[outcome] += 1
        if args.list:
            print(f"{outcome:<10} {case.__name__:<28} {str(detail)[:90]}")
    order = ["ok", "clear", "unclear", "wrong", "nonfinite", "hang", "crash"]
    print(f"{len(cases)} cases: " + ", ".join(f"{k} {counts[k]}" for k in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
