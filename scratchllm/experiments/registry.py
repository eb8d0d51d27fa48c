"""The experiments by name, and the runner behind `python -m scratchllm experiment run NAME`:
run the experiment, print its table, the chapter's claim beside the measured outcome, and
write DIR/results.json and DIR/NAME.png."""
from pathlib import Path

from matplotlib.figure import Figure

from scratchllm.experiments.abf import ABF
from scratchllm.experiments.base import write_results
from scratchllm.experiments.collapse import COLLAPSE
from scratchllm.experiments.exits import EARLY_EXIT
from scratchllm.experiments.experts import EXPERTS_BY_TOKEN
from scratchllm.experiments.heads import HEADS
from scratchllm.experiments.induction import INDUCTION
from scratchllm.experiments.moe import MOE
from scratchllm.experiments.needle import NEEDLE
from scratchllm.experiments.recall import RECALL
from scratchllm.experiments.scale import SCALE
from scratchllm.experiments.sinks import SINKS

EXPERIMENTS = {e.name: e for e in (COLLAPSE, SCALE, HEADS, INDUCTION, MOE, EXPERTS_BY_TOKEN, ABF,
                                   RECALL, NEEDLE, SINKS, EARLY_EXIT)}


def run_experiment(name, mode="full", out="runs/experiments", seed=0, log=print):
    """Run one experiment in `mode` ("smoke", "quick", "full"); print its table, claim and
    outcome through `log`; write out/results.json and out/NAME.png. Returns the Outcome."""
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {', '.join(EXPERIMENTS)}")
    experiment = EXPERIMENTS[name]
    outcome = experiment.run(mode, seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    results = write_results(out / "results.json", outcome, seed)
    fig = Figure(figsize=(9, 4))
    experiment.figure(fig, outcome)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    log(outcome.table)
    log(f"\nclaim:    {experiment.claim}\nmeasured: {outcome.verdict}")
    log(f"\nresults: {results}\nfigure:  {out / f'{name}.png'}")
    return outcome
