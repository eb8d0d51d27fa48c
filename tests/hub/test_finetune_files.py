"""`finetune --hf` keeps every file of the checkpoint but its weights (tokenizer, chat
template, generation config), says what it wrote with sizes, and keeps the optimizer state
after a finished run only with --keep-state."""
import shutil
from pathlib import Path

from scratchllm import cli

ROOT = Path(__file__).resolve().parents[1] / "fixtures"
HF = ROOT / "hf"


def _run(src, out, *extra):
    data = out.parent / "data.txt"
    if not data.exists():
        data.write_text((ROOT / "python-docs-slice.txt").read_text("utf-8")[:3000], "utf-8")
    return cli.main(["finetune", "--hf", str(src), "--data", str(data), "--out", str(out),
                     "--steps", "2", "--batch-size", "1", "--seq-len", "8", "--eval-every", "2",
                     "--no-progress", *extra])


def test_finetune_keeps_side_files_and_states_the_optimizer_state(tmp_path, capsys):
    src = tmp_path / "src"
    shutil.copytree(HF / "llama", src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(HF / "chat_chatml" / name, src / name)
    (src / "chat_template.jinja").write_text("{{ bos_token }}", encoding="utf-8")
    (src / "additional_chat_templates").mkdir()
    (src / "additional_chat_templates" / "tool_use.jinja").write_text("x", encoding="utf-8")
    assert _run(src, tmp_path / "out") == 0
    out = capsys.readouterr().out
    for name in ("chat_template.jinja", "tokenizer_config.json", "generation_config.json",
                 "tokenizer.json", "additional_chat_templates/tool_use.jinja"):
        assert (tmp_path / "out" / name).read_bytes() == (src / name).read_bytes(), name
        assert name.split("/")[0] in out
    assert not (tmp_path / "out" / "state").exists()
    assert "model.safetensors (" in out and "optimizer state removed" in out
    assert _run(src, tmp_path / "kept", "--keep-state") == 0
    assert (tmp_path / "kept" / "state").is_dir()
    assert "optimizer state kept in" in capsys.readouterr().out
