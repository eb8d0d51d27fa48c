"""The loss-curve PNGs that `train` and `compare` write (matplotlib is a dependency)."""
from types import SimpleNamespace

import numpy as np

from scratchllm.train import plots

PNG = b"\x89PNG\r\n\x1a\n"


def test_run_plot_writes_a_png(tmp_path):
    run = SimpleNamespace(losses=list(np.linspace(5, 3, 40)), evals=[(20, 3.9), (40, 3.5)],
                          cfg=SimpleNamespace(name="dense"))
    path = plots.save_run_plot(tmp_path / "loss.png", run, baseline=6.1)
    assert path == tmp_path / "loss.png" and path.read_bytes()[:8] == PNG


def test_compare_plot_writes_a_png(tmp_path):
    curves = {"dense": list(np.linspace(5, 4, 30)), "moe": list(np.linspace(5, 3.9, 30))}
    path = plots.save_compare_plot(tmp_path / "compare.png", curves, baseline=6.1)
    assert path.read_bytes()[:8] == PNG and path.stat().st_size > 5000
