"""Muon: momentum SGD whose update matrix is orthogonalised by a Newton-Schulz iteration, for
the hidden weight matrices of a network (the attention and MLP projections); embeddings, the
output head and the gains keep AdamW (Keller Jordan et al. 2024, "Muon: An optimizer for
hidden layers in neural networks", kellerjordan.github.io/posts/muon; the code in
KellerJordan/Muon muon.py and KellerJordan/modded-nanogpt).

One step for a weight W (d_in, d_out) with gradient G (y = x @ W):
    M  <- mu M + (1 - mu) G                        (momentum, mu = 0.95)
    U  =  (1 - mu) G + mu M                        (Nesterov's look-ahead; U = M without it)
    O  =  NS5(U)  ~  P V^T for U = P S V^T         (its singular values pushed towards 1)
    W  <- W (1 - lr wd) - lr sqrt(max(1, d_out / d_in)) O

Why orthogonalise. The update O = P V^T (the polar factor of U) is the steepest-descent step
under the spectral norm: argmax <U, O> over ||O||_2 <= 1. The momentum of a transformer's
weight matrix is nearly low-rank (a few directions dominate); replacing its singular values by
ones gives the rare directions the same step as the dominant ones, and the step's size in
every direction is lr, whatever the gradient's scale. sqrt(max(1, d_out / d_in)) (Keller's
max(1, rows / cols) on torch's (d_out, d_in) layout) keeps the RMS of the change of each output
unit alike for wide and tall matrices.

Newton-Schulz, quintic. With X0 = U / ||U||_F (every singular value in (0, 1]), iterate
    A = X X^T;   X <- a X + (b A + c A A) X        (a, b, c) = (3.4445, -4.7750, 2.0315)
X = P S V^T gives A = P S^2 P^T, so the new X = P (a S + b S^3 + c S^5) V^T: each singular
value goes through the odd polynomial phi(s) = a s + b s^3 + c s^5 and the singular vectors
stay. Five applications of phi map every s in [2e-3, 1] into [0.68, 1.21] (the slope a = 3.4
at 0 grows small values fast; exact convergence to 1 is traded for that speed, which Keller
found does not hurt the loss; tests/core/test_muon.py checks the band against the SVD). Working on the wide side (X with rows <= cols, the tall
matrix transposed) keeps A the small Gram matrix: 2 r^2 c + r^3 multiply-adds an iteration.

Cost on a CPU. Five iterations on every hidden matrix are about 35% of the FLOPs of a
forward+backward of 1024 tokens through the dense preset; the iteration is independent per
matrix, so `threads` workers (NumPy's matmul releases the GIL) split the matrices between
them. The larger the batch, the smaller that share (it does not grow with the tokens).

State per matrix: the momentum M (one array, where AdamW keeps two).
"""
import math

import numpy as np

from scratchllm.core.blas import run_tasks
from scratchllm.core.validate import expect_finite

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # (a, b, c) of phi(s) = a s + b s^3 + c s^5


def newton_schulz(G, steps=5):
    """The quintic Newton-Schulz iteration: G (r, c) -> about P V^T for G = P S V^T, its
    singular values in [0.68, 1.21] (module docstring). Same dtype as G."""
    if G.ndim != 2:
        raise ValueError(f"newton_schulz: G must be a matrix (2-D), got shape {G.shape}")
    a, b, c = NS_COEFFS
    tall = G.shape[0] > G.shape[1]
    X = G.T if tall else G                                   # (r, c), r <= c
    X = X / (np.linalg.norm(X) + 1e-7)                       # singular values in (0, 1]
    for _ in range(steps):
        A = X @ X.T                                          # (r, r)  = P S^2 P^T
        X = a * X + (b * A + c * (A @ A)) @ X                # (r, c)  = P phi(S) V^T
    return X.T if tall else X                                # (G's shape)


def muon_scale(shape):
    """sqrt(max(1, d_out / d_in)) of a weight stored (d_in, d_out)."""
    return math.sqrt(max(1.0, shape[1] / shape[0]))


class Muon:
    """Muon over 2-D Params (`.data` (d_in, d_out), `.grad`): the module docstring's step.
    Set `opt.lr` before `step()` to follow a schedule. threads: workers that split the
    Newton-Schulz iterations of the matrices (the result does not depend on it)."""

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, weight_decay=0.0,
                 threads=1):
        expect_finite("Muon", "lr", lr, 0, open_low=True)
        expect_finite("Muon", "weight_decay", weight_decay, 0)
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Muon: momentum must lie in [0, 1), got {momentum}")
        self.params = list(params)
        bad = [p.data.shape for p in self.params if p.data.ndim != 2]
        if bad:
            raise ValueError(f"Muon: every parameter must be a matrix (2-D), got shapes {bad}; "
                             f"give vectors, embeddings and the head to AdamW")
        self.lr, self.momentum, self.nesterov, self.wd = lr, momentum, nesterov, weight_decay
        self.t = 0
        self.m = [np.zeros(p.data.shape, p.data.dtype) for p in self.params]
        self.threads = threads

    def _update(self, i):
        """Momentum, then W -= lr (wd W + scale NS5(U)) for Param i."""
        p, m, mu = self.params[i], self.m[i], self.momentum
        m *= mu
        m += (1 - mu) * p.grad                                 # M = mu M + (1 - mu) G
        u = (1 - mu) * p.grad + mu * m if self.nesterov else m  # (d_in, d_out)
        o = newton_schulz(u)                                   # (d_in, d_out)
        if self.wd:
            p.data *= 1 - self.lr * self.wd
        p.data -= (self.lr * muon_scale(p.data.shape)) * o

    def step(self, only=None):
        """One update of every parameter (of the indices `only` into opt.params: None for
        all) from its .grad."""
        expect_finite("Muon.step", "lr", self.lr, 0)
        self.t += 1
        todo = range(len(self.params)) if only is None else list(only)
        # the largest first: the workers finish together
        order = sorted(todo, key=lambda i: -self.params[i].data.size)
        run_tasks(lambda j: self._update(order[j]), len(order), self.threads)

    def state_dict(self):
        """The momentum of every parameter, the step count and lr: all it needs to resume."""
        state = {"t": np.asarray(self.t), "lr": np.asarray(self.lr)}
        state.update({f"m.{i}": m for i, m in enumerate(self.m)})
        return state

    def load_state_dict(self, state):
        if len(state) != len(self.m) + 2:
            raise ValueError(f"Muon.load_state_dict: state has {len(state)} entries, expected "
                             f"{len(self.m) + 2} for {len(self.m)} parameters")
        for i, buf in enumerate(self.m):
            if state[f"m.{i}"].shape != buf.shape:
                raise ValueError(f"Muon.load_state_dict: m.{i} has shape "
                                 f"{state[f'm.{i}'].shape}, expected {buf.shape}")
        self.t, self.lr = int(state["t"]), float(state["lr"])
        for i, buf in enumerate(self.m):
            buf[...] = state[f"m.{i}"]


class MuonAdamW:
    """Muon on some matrices, AdamW (core.optim) on every other Param, under one schedule:
    `opt.lr` is AdamW's and Muon's is opt.lr * muon_ratio (the ratio of their peaks), so one
    warmup + cosine drives both. `params` is AdamW's then Muon's (the checkpoint's slot
    order)."""

    def __init__(self, adamw, muon, muon_ratio):
        expect_finite("MuonAdamW", "muon_ratio", muon_ratio, 0, open_low=True)
        self.adamw, self.muon, self.ratio = adamw, muon, muon_ratio

    @property
    def lr(self):
        return self.adamw.lr

    @lr.setter
    def lr(self, value):
        self.adamw.lr, self.muon.lr = value, value * self.ratio

    @property
    def params(self):
        return self.adamw.params + self.muon.params

    def step(self, only=None):
        """only: indices into opt.params (AdamW's first), or None for all."""
        n = len(self.adamw.params)
        self.adamw.step(None if only is None else [i for i in only if i < n])
        self.muon.step(None if only is None else [i - n for i in only if i >= n])

    def state_dict(self):
        state = {f"adamw.{k}": v for k, v in self.adamw.state_dict().items()}
        state.update({f"muon.{k}": v for k, v in self.muon.state_dict().items()})
        return state

    def load_state_dict(self, state):
        parts = {"adamw.": {}, "muon.": {}}
        for k, v in state.items():
            head = next((h for h in parts if k.startswith(h)), None)
            if head is None:
                raise ValueError(f"MuonAdamW.load_state_dict: entry {k!r} is neither AdamW's "
                                 f"nor Muon's (a checkpoint of another optimizer?)")
            parts[head][k[len(head):]] = v
        self.adamw.load_state_dict(parts["adamw."])
        self.muon.load_state_dict(parts["muon."])
