"""Training: the demo corpus and its cached tokenization (corpus), checkpoints and the one
atomic writer (checkpoint), data-parallel threads (parallel), how to train (settings), the loop
(trainer; data parallel across MPI ranks through dist), and loss plots (plots). Stands on lm,
hub and dist."""
from .checkpoint import CheckpointError, load_model
from .parallel import DataParallel, blas_threads, set_blas_threads
from .settings import Settings
from .trainer import Run, evaluate, fit, make_optimizer, train_preset

__all__ = ["CheckpointError", "DataParallel", "Run", "Settings", "blas_threads", "evaluate",
           "fit", "load_model", "make_optimizer", "set_blas_threads", "train_preset"]
