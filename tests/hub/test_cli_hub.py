"""`sample --hf` and `finetune --hf` on the tiny fixture checkpoints."""
from pathlib import Path

import numpy as np

from scratchllm import cli
from scratchllm.hub import load_pretrained, load_tokenizer, state_dict

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
HF = ROOT / "hf"
DATA = ROOT / "python-docs-slice.txt"


def test_sample_hf_greedy_equals_full_forward_argmax(capsys):
    """Greedy `sample --hf` (decoding states) prints the ids a full-forward argmax loop picks."""
    prompt = "def f(x):"
    assert cli.main(["sample", "--hf", str(HF / "qwen3"), "--prompt", prompt,
                     "--max-tokens", "6", "--temperature", "0", "--top-p", "1"]) == 0
    model, tok = load_pretrained(HF / "qwen3", np.float64), load_tokenizer(HF / "qwen3")
    ids = tok.encode(prompt)
    for _ in range(6):
        logits, _ = model.forward(np.array([ids]))
        ids.append(int(np.argmax(logits[0, -1])))
    assert capsys.readouterr().out == tok.decode(ids) + "\n"


def _finetune(out, steps, *extra):
    return cli.main(["finetune", "--hf", str(HF / "llama"), "--data", str(DATA), "--out",
                     str(out), "--steps", str(steps), "--batch-size", "2", "--seq-len", "16",
                     "--eval-every", "2", "--lr", "1e-3", "--no-progress", *extra])


class _StopAfterTwoSteps:
    """Stands in for the trainer's Ctrl-C flag: 'pressed' after two steps."""

    def __init__(self):
        self.reads = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @property
    def stop(self):
        self.reads += 1
        return self.reads > 2


def test_finetune_saves_a_checkpoint_and_resumes_bit_exactly(tmp_path, monkeypatch):
    """4 steps straight == 2 steps, interrupted (state saved), then --resume to 4."""
    from scratchllm.train import trainer
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert _finetune(straight, 4) == 0
    with monkeypatch.context() as m:
        m.setattr(trainer, "_StopFlag", _StopAfterTwoSteps)
        assert _finetune(resumed, 4) == 130
    assert _finetune(resumed, 4, "--resume") == 0
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (straight / name).is_file()
    before = state_dict(load_pretrained(HF / "llama"))
    a, b = state_dict(load_pretrained(straight)), state_dict(load_pretrained(resumed))
    assert sorted(a) == sorted(before)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["model.layers.0.mlp.up_proj.weight"],
                              before["model.layers.0.mlp.up_proj.weight"])
