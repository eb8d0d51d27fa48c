"""Loss-curve plots of training runs (PNG via matplotlib, an optional dependency: without it
nothing is written and the functions return False)."""
import numpy as np


def save_loss_plot(path, series, baseline, title, ylabel="cross-entropy (nats/token)"):
    """Curves [(label, steps, losses, matplotlib fmt)] and the unigram baseline to a PNG.
    Returns False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib  # an optional dependency: imported only when a plot is asked for
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # (optional, as above)
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, steps, losses, fmt in series:
        ax.plot(steps, losses, fmt, lw=0.9, label=label)
    ax.axhline(baseline, ls="--", c="gray", label="unigram baseline")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def save_run_plot(path, run, baseline):
    """The run's train losses and validation points."""
    series = [("train", np.arange(1, len(run.losses) + 1), run.losses, "-")]
    if run.evals:
        series.append(("validation", *zip(*run.evals), "o-"))
    return save_loss_plot(path, series, baseline, run.cfg.name)


def save_compare_plot(path, curves, baseline, window=10):
    """Moving-average train loss per preset ({name: losses}); False when matplotlib is
    missing."""
    series = []
    for name, losses in curves.items():
        w = max(1, min(window, len(losses)))
        smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
        series.append((name, np.arange(w, len(losses) + 1), smooth, "-"))
    return save_loss_plot(path, series, baseline, "presets, same batches",
                          f"train loss ({window}-step mean)")
