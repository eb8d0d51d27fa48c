"""`sample --hf` and `finetune --hf` on the tiny fixture checkpoints."""
from pathlib import Path

import json
import shutil

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


def test_sample_hf_stops_at_the_configs_eos_token_id(tmp_path, capsys):
    """With the first greedy id unlike those before it made the eos (generation_config.json,
    as a list; else config.json's int), `sample --hf` prints the ids before it and stops."""
    prompt, src = "def f(x):", HF / "llama"
    model, tok = load_pretrained(src, np.float64), load_tokenizer(src)
    ids = tok.encode(prompt)
    for _ in range(6):
        logits, _ = model.forward(np.array([ids]))
        ids.append(int(np.argmax(logits[0, -1])))
    new = ids[-6:]
    k = next(j for j in range(1, 6) if new[j] not in new[:j])
    ids = ids[:len(ids) - 6 + k + 1]                       # the prompt, k ids, the eos
    shutil.copytree(src, tmp_path / "ck")
    for name, eos in (("generation_config.json", [ids[-1], 10 ** 6]), ("config.json", ids[-1])):
        spec = json.loads((src / name).read_text(encoding="utf-8")) if name == "config.json" else {}
        (tmp_path / "ck" / name).write_text(json.dumps(dict(spec, eos_token_id=eos)), "utf-8")
        assert cli.main(["sample", "--hf", str(tmp_path / "ck"), "--prompt", prompt,
                         "--max-tokens", "6", "--temperature", "0", "--top-p", "1"]) == 0
        assert capsys.readouterr().out == tok.decode(ids[:-1]) + "\n"
        (tmp_path / "ck" / "generation_config.json").unlink(missing_ok=True)


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


def test_sample_help_lists_every_supported_family(capsys):
    from scratchllm.hub import FAMILIES
    try:
        cli.main(["sample", "--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    for family in FAMILIES:
        assert family.model_type in out, family.model_type
