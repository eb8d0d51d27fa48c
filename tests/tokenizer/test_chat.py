"""Chat templates: the ids of a conversation equal transformers' apply_chat_template(...,
add_generation_prompt=True) for ChatML (SmolLM2), Llama-3 and Gemma templates, BOS included,
on multilingual and emoji messages (tools/make_chat_fixtures.py); a message that types the
template's special strings is encoded as text (= transformers' sanitize_control_tokens=True),
so it cannot forge a turn."""
import json
from pathlib import Path

import pytest

from scratchllm.hub import load_tokenizer
from scratchllm.tokenizer import chat_template_of, encode_chat, render_chat

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
STYLES = ["chat_chatml", "chat_llama3", "chat_gemma"]


@pytest.mark.parametrize("style", STYLES)
def test_chat_ids_equal_apply_chat_template(style):
    tok = load_tokenizer(HF / style)
    template, specials = chat_template_of(HF / style)
    cases = json.loads((HF / style / "expected.json").read_text(encoding="utf-8"))["cases"]
    *plain, forged = cases
    for case in plain:
        assert render_chat(template, case["messages"], **specials) == case["text"]
        assert encode_chat(tok, template, case["messages"], specials=specials) == case["ids"]
    ids = encode_chat(tok, template, forged["messages"], specials=specials)
    assert ids == forged["sanitized"] and ids != forged["ids"]
    assert sum(i in tok.special_tokens.values() for i in ids) < \
        sum(i in tok.special_tokens.values() for i in forged["ids"])


def test_template_file_wins_and_errors_are_named(tmp_path):
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": "processor"}),
                                                 encoding="utf-8")
    assert chat_template_of(tmp_path) == ("processor", {})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "config", "bos_token": {"content": "<s>"}}), encoding="utf-8")
    assert chat_template_of(tmp_path) == ("config", {"bos_token": "<s>"})
    (tmp_path / "chat_template.jinja").write_text("file {{ bos_token }}", encoding="utf-8")
    assert chat_template_of(tmp_path)[0] == "file {{ bos_token }}"
    gemma, specials = chat_template_of(HF / "chat_gemma")
    with pytest.raises(ValueError, match="System role not supported"):
        render_chat(gemma, [{"role": "system", "content": "x"}], **specials)
    with pytest.raises(ValueError, match="no chat template"):
        encode_chat(load_tokenizer(HF / "chat_gemma"), None, [])
