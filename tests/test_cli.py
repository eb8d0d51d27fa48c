"""Every command fails the same way: a usage error exits 2 and a runtime error exits 1, each
with one message `scratchllm COMMAND: ...` on stderr."""
import re

import pytest

from scratchllm import cli

USAGE_ERRORS = {
    "train": ["--no-such-flag"],
    "sample": [],  # --checkpoint is required
    "compare": ["--presets", "nope"],
    "bpe": ["encode"],  # -t and the file are required
    "size": ["llama-9"],
    "drill": ["check", "no_such_drill"],
    "exercise": ["check", "9"],
    "notebooks": [],  # --html is required
    "finetune": ["--hf", "x"],  # --data and --out are required
    "experiment": ["run", "nope"],
    "embed": ["--steps", "-1"],
}


@pytest.mark.parametrize("command", sorted(USAGE_ERRORS))
def test_usage_error_exits_2_with_the_command_prefix(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, *USAGE_ERRORS[command]])
    assert exit_.value.code == 2
    assert re.search(rf"^scratchllm {command}( \w+)?: ", capsys.readouterr().err, re.M)


def test_runtime_errors_exit_1_with_the_command_prefix(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    (tmp_path / "a_file").write_text("")  # --out under a file: the directory cannot be made
    cases = {
        "train": ["train", "--data", missing, "--out", str(tmp_path / "run"), "--no-progress"],
        "sample": ["sample", "--checkpoint", missing],
        "bpe encode": ["bpe", "encode", "-t", missing, missing],
        "drill": ["drill", "check", "zoh", "--dir", missing],
        "exercise": ["exercise", "check", "2", "--file", missing],
        "notebooks": ["notebooks", "--html", str(tmp_path / "site"), "--source", missing],
        "finetune": ["finetune", "--hf", missing, "--data", missing, "--out", missing],
        "experiment": ["experiment", "run", "collapse", "--smoke", "--out",
                       str(tmp_path / "a_file" / "missing")],
    }
    for command, argv in cases.items():
        assert cli.main(argv) == 1, command
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"scratchllm {command}: ") and "missing" in err[-1], err


def test_unknown_command_exits_2():
    assert cli.main(["nope"]) == 2
