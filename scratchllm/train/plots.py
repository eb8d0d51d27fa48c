"""Loss-curve plots of training runs, written as PNG files. matplotlib's object API (Figure,
no pyplot): no global backend is switched, so importing this module leaves a notebook's
inline plots alone."""
import numpy as np
from matplotlib.figure import Figure


def save_loss_plot(path, series, baseline, title, ylabel="cross-entropy (nats/token)"):
    """Curves [(label, steps, losses, matplotlib fmt)] and the unigram baseline to the PNG at
    `path`; returns path."""
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    for label, steps, losses, fmt in series:
        ax.plot(steps, losses, fmt, lw=0.9, label=label)
    ax.axhline(baseline, ls="--", c="gray", label="unigram baseline")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def save_run_plot(path, run, baseline):
    """The run's train losses and validation points."""
    series = [("train", np.arange(1, len(run.losses) + 1), run.losses, "-")]
    if run.evals:
        series.append(("validation", *zip(*run.evals), "o-"))
    return save_loss_plot(path, series, baseline, run.cfg.name)


def save_compare_plot(path, curves, baseline, window=10):
    """Moving-average train loss per preset ({name: losses}) to the PNG at `path`."""
    series = []
    for name, losses in curves.items():
        w = max(1, min(window, len(losses)))
        smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
        series.append((name, np.arange(w, len(losses) + 1), smooth, "-"))
    return save_loss_plot(path, series, baseline, "presets, same batches",
                          f"train loss ({window}-step mean)")
