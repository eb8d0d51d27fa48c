"""The length-extrapolation experiment (ALiBi's, Press et al. 2021, arXiv 2108.12409, figure
1): train the same small LM with each position scheme at one context length, then measure
its validation cross-entropy at longer ones. In the paper ALiBi's loss stays flat past the
training length, while sinusoidal positions and RoPE, meeting positions (rotation angles)
never seen in training, degrade; NoPE has only the causal mask to tell positions apart.
This runs the same comparison at laptop scale; what it shows is whatever it measures.

    python -m scratchllm.train.extrapolation [--steps 150] [--plot extrapolation.png]
                                             [--json extrapolation.json]

The default budget (150 steps of 16 x 128 bytes per scheme) is meant for a few minutes on a
quiet 2-core machine. Notebook 10 shows the committed result of one run (RESULT,
scratchllm/data/extrapolation.json, with the command, settings, date and seconds it
recorded).

The data is the bundled Python-docs text as bytes (V = 256), so no tokenizer is trained.
"""
import argparse
import json
import time
from pathlib import Path

import numpy as np

from scratchllm.specs import from_flat
from scratchllm.train import corpus
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import Run, evaluate

POSITIONS = ("rope", "alibi", "sinusoidal", "nope")
DATA = Path(__file__).resolve().parent.parent / "data" / "python-docs.txt"
RESULT = DATA.parent / "extrapolation.json"  # one run of main(), committed
MODEL = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=192,
             attn_impl="flash")


def byte_ids(path=DATA, limit=None):
    """The text's UTF-8 bytes as int64 token ids (V = 256)."""
    data = Path(path).read_bytes()[:limit]
    return np.frombuffer(data, np.uint8).astype(np.int64)  # (N,)


def settings_for(steps=150, train_len=128, batch_size=16, eval_tokens=16384):
    """The trainer Settings of an extrapolation run: `steps` AdamW steps on batches of
    batch_size x train_len tokens, one thread, a short warmup; eval_tokens per eval length."""
    return Settings(steps=steps, batch_size=batch_size, seq_len=train_len, threads=1,
                    warmup=min(30, steps // 10 + 1), eval_tokens=eval_tokens)


def length_extrapolation(ids, positions=POSITIONS, *, settings=None, eval_lens=(128, 256, 512),
                         model=None, log=None):
    """{position scheme: [validation CE (nats/token) at each eval length]}.

    Each scheme trains the same model (MODEL in flat names, overridden by `model`) as
    `settings` says (default settings_for(): 150 steps at length 128); the evaluation windows
    (settings.eval_tokens at each length in eval_lens) are the same for every scheme.
    """
    settings = settings or settings_for()
    train, val = corpus.split(ids)
    table = {}
    for pos in positions:
        cfg = from_flat(**{**MODEL, **(model or {}), "name": pos, "positions": pos})
        run = Run(cfg, settings)
        for _ in range(settings.steps):
            run.train_step(train)
        table[pos] = [evaluate(run.model, corpus.eval_batches(val, 4, T, settings.eval_tokens))
                      for T in eval_lens]
        if log:
            log(f"{pos:<11} " + "  ".join(f"{v:.3f}" for v in table[pos]))
    return table


def load_result(path=RESULT):
    """The record a `--json` run wrote: {command, steps, train_len, eval_lens, model, table,
    seconds, date}."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def format_table(table, train_len, eval_lens):
    """A Markdown table: one row per position scheme, one column per eval length."""
    head = "| positions | " + " | ".join(
        f"T={T}" + (" (train)" if T == train_len else "") for T in eval_lens) + " |"
    rule = "|---" * (len(eval_lens) + 1) + "|"
    rows = [f"| {pos} | " + " | ".join(f"{v:.3f}" for v in vals) + " |"
            for pos, vals in table.items()]
    return "\n".join([head, rule, *rows])


def save_plot(path, table, train_len, eval_lens):
    """Validation CE against eval length per scheme; False (nothing written) without
    matplotlib."""
    try:
        import matplotlib  # an optional dependency: imported only when a plot is asked for
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (optional, as above)
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for pos, vals in table.items():
        ax.plot(eval_lens, vals, "o-", label=pos)
    ax.axvline(train_len, ls="--", c="gray", label="training length")
    ax.set(xscale="log", xlabel="evaluation length T", ylabel="validation CE (nats/byte)",
           title="length extrapolation")
    ax.set_xticks(eval_lens, [str(T) for T in eval_lens])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--train-len", type=int, default=128)
    p.add_argument("--plot", default="extrapolation.png")
    p.add_argument("--json", default=None, help="also write the table and the run's settings")
    a = p.parse_args(argv)
    lens = (a.train_len, 2 * a.train_len, 4 * a.train_len)
    t0 = time.time()
    table = length_extrapolation(byte_ids(), settings=settings_for(a.steps, a.train_len),
                                 eval_lens=lens, log=print)
    print(format_table(table, a.train_len, lens))
    if a.json:
        record = dict(command=f"python -m scratchllm.train.extrapolation --steps {a.steps} "
                      f"--train-len {a.train_len}", steps=a.steps, train_len=a.train_len,
                      eval_lens=list(lens), model=MODEL, table=table,
                      seconds=round(time.time() - t0, 1),
                      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
        Path(a.json).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if save_plot(a.plot, table, a.train_len, lens):
        print(f"plot: {a.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
