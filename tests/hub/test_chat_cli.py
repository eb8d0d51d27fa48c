"""`sample --hf DIR --chat` sends apply_chat_template's ids (the tiny llama checkpoint with the
ChatML tokenizer of tools/make_chat_fixtures.py) and prints the greedy reply; an empty
generation says why and points to --chat."""
import json
import shutil

import numpy as np

from scratchllm import cli
from scratchllm.hub import load_pretrained, load_tokenizer
from hub_fixtures import HF


def _chat_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(HF / "llama", ck)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(HF / "chat_chatml" / name, ck / name)
    return ck


def _greedy(model, ids, n, stop):
    ids, new = list(ids), []
    for _ in range(n):
        logits, _ = model.forward(np.array([ids]))
        t = int(np.argmax(logits[0, -1]))
        if t in stop:
            break
        ids.append(t)
        new.append(t)
    return new


def test_chat_sends_apply_chat_template_ids_and_prints_the_reply(tmp_path, capsys):
    ck = _chat_checkpoint(tmp_path)
    case = json.loads((HF / "chat_chatml" / "expected.json").read_text("utf-8"))["cases"][0]
    question = case["messages"][0]["content"]
    model, tok = load_pretrained(ck, np.float64), load_tokenizer(ck)
    new = _greedy(model, case["ids"], 5, {2})
    assert cli.main(["sample", "--hf", str(ck), "--chat", question, "--max-tokens", "5",
                     "--temperature", "0", "--top-p", "1"]) == 0
    assert capsys.readouterr().out == tok.decode(new) + "\n"


def test_empty_generation_says_why_and_suggests_chat(tmp_path, capsys):
    ck = _chat_checkpoint(tmp_path)
    model, tok = load_pretrained(ck, np.float64), load_tokenizer(ck)
    first = _greedy(model, tok.encode_ordinary("What is"), 1, set())[0]
    (ck / "generation_config.json").write_text(json.dumps({"eos_token_id": first}), "utf-8")
    assert cli.main(["sample", "--hf", str(ck), "--prompt", "What is", "--max-tokens", "3",
                     "--temperature", "0", "--top-p", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "What is\n"
    assert "nothing was generated" in captured.err and "try --chat" in captured.err
    assert cli.main(["sample", "--hf", str(HF / "llama"), "--chat", "hi"]) != 0
    assert "has no chat template" in capsys.readouterr().err
