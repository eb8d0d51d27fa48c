"""Chat templates: the conversation -> ids step that instruct checkpoints expect, rendered with
`jinja2` as transformers' apply_chat_template renders it (transformers
utils/chat_template_utils.py: a sandboxed environment with trim_blocks and lstrip_blocks, the
loopcontrols extension, a `tojson` filter that keeps non-ASCII, the globals raise_exception and
strftime_now; the template sees messages, add_generation_prompt and the tokenizer's special
tokens by name: bos_token, eos_token, ...).

The template comes from chat_template.jinja, else tokenizer_config.json's "chat_template" (a
string, or a list of {"name", "template"}: "default"), else chat_template.json's (the file
a vision-language processor writes). The rendered text is encoded with the
template's special tokens allowed (apply_chat_template encodes it with add_special_tokens=False,
so a BOS appears only where the template writes bos_token).

User text stays text: a special-token string inside a message (a typed "<|im_end|>") is
wrapped in private-use markers before rendering, and the marked spans are encoded as ordinary
text, so a message cannot forge a turn (transformers does the same with
sanitize_control_tokens=True). Each piece after a marker is encoded after a "\\n" that is then
removed, so a SentencePiece tokenizer adds no dummy prefix in mid-text (as transformers does).
Without a special string in the messages the ids are exactly apply_chat_template's.
"""
import json
from datetime import datetime
from pathlib import Path

import jinja2
import regex
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")
_OPEN, _CLOSE = "\U000f0000", "\U000f0001"   # private-use markers around user specials


def _content(value):
    return value.get("content") if isinstance(value, dict) else value


def chat_template_of(path):
    """(template source, {special name: string}) of a checkpoint directory, or (None, {})
    when it has no chat template."""
    path = Path(path)
    config = {}
    if (path / CONFIG_FILE).is_file():
        config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    specials = {}
    if (path / "special_tokens_map.json").is_file():
        specials.update(json.loads((path / "special_tokens_map.json").read_text("utf-8")))
    specials.update({k: config[k] for k in SPECIAL_NAMES if config.get(k) is not None})
    specials = {k: _content(v) for k, v in specials.items() if k in SPECIAL_NAMES and
                _content(v) is not None}
    if (path / TEMPLATE_FILE).is_file():
        return (path / TEMPLATE_FILE).read_text(encoding="utf-8"), specials
    template = config.get("chat_template")
    if template is None and (path / "chat_template.json").is_file():   # processors' form
        template = json.loads((path / "chat_template.json").read_text("utf-8")).get(
            "chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    return template, specials


def render_chat(template, messages, *, add_generation_prompt=True, **specials):
    """The text of messages ([{"role", "content"}]) under a jinja2 chat template."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template).render(messages=messages, tools=None, documents=None,
                                                add_generation_prompt=add_generation_prompt,
                                                **specials)
    except jinja2.exceptions.TemplateError as err:
        raise ValueError(f"chat template: {err}") from None


def _mark(messages, specials):
    """messages with every special-token string in their text wrapped in markers (markers
    already there are dropped first, so they cannot be forged either)."""
    pattern = regex.compile("|".join(regex.escape(s) for s in sorted(specials, key=len,
                                                                    reverse=True)))

    def mark(value):
        if isinstance(value, str):
            value = value.replace(_OPEN, "").replace(_CLOSE, "")
            return pattern.sub(lambda m: _OPEN + m.group() + _CLOSE, value) if specials \
                else value
        if isinstance(value, dict):
            return {k: mark(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [mark(v) for v in value]
        return value
    return [mark(m) for m in messages]


def _encode_piece(tok, piece, as_text):
    encode = tok.encode_ordinary if as_text else (lambda t: tok.encode(t,
                                                                     allowed_special="all"))
    newline = tok.encode_ordinary("\n")
    ids = encode("\n" + piece)
    return ids[len(newline):] if ids[:len(newline)] == newline else encode(piece)


def encode_chat(tok, template, messages, *, add_generation_prompt=True, specials=None):
    """The ids of messages under the chat template (see the module docstring): the template's
    special tokens as their ids, the messages' text as ordinary text. specials: the template's
    {bos_token: ...} variables (chat_template_of gives them)."""
    if not template:
        raise ValueError("encode_chat: no chat template (the directory has neither "
                         f"{TEMPLATE_FILE} nor a chat_template in {CONFIG_FILE})")
    registered = [s for s in tok.special_tokens if s]
    text = render_chat(template, _mark(messages, registered),
                       add_generation_prompt=add_generation_prompt, **(specials or {}))
    pieces = regex.split(f"{_OPEN}(.*?){_CLOSE}|[{_OPEN}{_CLOSE}]", text)
    ids = tok.encode(pieces[0], allowed_special="all")
    for k, piece in enumerate(pieces[1:], start=1):
        if piece:
            ids += _encode_piece(tok, piece, as_text=k % 2 == 1)
    return ids
