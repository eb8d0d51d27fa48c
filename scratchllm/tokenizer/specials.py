"""Special tokens in user text: tiktoken's rule, safe by default.

A special token (e.g. "<|endoftext|>", a chat role marker) is a control symbol. If the plain
text a user typed could become one, the user could forge document or role boundaries. So,
as in tiktoken (openai/tiktoken tiktoken/core.py, `Encoding.encode`):

    encode(text, allowed_special=(), disallowed_special="all")
    allowed    = every registered special           if allowed_special == "all"
               = set(allowed_special)               otherwise
    disallowed = registered - allowed               if disallowed_special == "all"
               = set(disallowed_special)            otherwise
    - a disallowed special anywhere in the text raises ValueError (token and position);
    - an allowed special becomes its id;
    - any other special string is ordinary text (its bytes go through BPE like any text).

So by default text holding a special raises; `allowed_special="all"` opts in (the CS336
behaviour: every registered special string is the control token); `disallowed_special=()`
with the default allowed set encodes everything as ordinary text (= `encode_ordinary`).

Glossary: registered = the tokenizer's {special string: id}.
"""
from collections.abc import Collection

from .pretokenize import special_regex


def _as_set(value, name, registered, where):
    if value == "all":
        return set(registered)
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise TypeError(f"{where}: {name} must be 'all' or a collection of special-token "
                        f"strings (e.g. set() or {{'<|endoftext|>'}}), got {value!r}")
    out = set(value)
    unknown = out - set(registered)
    if unknown:
        raise ValueError(f"{where}: {name} has unregistered tokens {sorted(unknown)}; "
                         f"registered: {sorted(registered)}")
    return out


def resolve_specials(registered, allowed_special, disallowed_special, where="encode"):
    """(allowed, disallowed) sets of special strings, resolved as tiktoken does."""
    allowed = _as_set(allowed_special, "allowed_special", registered, where)
    if disallowed_special == "all":
        return allowed, set(registered) - allowed
    return allowed, _as_set(disallowed_special, "disallowed_special", registered, where)


def check_disallowed(text, disallowed_re, offset=0, where="encode"):
    """Raise ValueError if `text` holds a disallowed special token (disallowed_re: the
    special_regex of the disallowed set, or None); `offset` = where `text` starts in the
    whole input, so the reported position is the character index in the whole input."""
    if disallowed_re is None:
        return
    m = disallowed_re.search(text)
    if m is not None:
        tok = m.group()
        raise ValueError(
            f"{where}: the text contains the special token {tok!r} at character "
            f"{offset + m.start()}, and it is disallowed. Pass allowed_special={{{tok!r}}} "
            f"(or 'all') to encode it as the special token, or disallowed_special=() (or "
            f"use encode_ordinary) to encode it as ordinary text.")


def special_plan(registered, allowed_special, disallowed_special, where="encode"):
    """(allowed specials (sorted tuple), regex of the disallowed ones or None, the specials
    chunk cuts must respect = allowed | disallowed): what every encode entry point needs."""
    allowed, disallowed = resolve_specials(registered, allowed_special, disallowed_special,
                                           where)
    return tuple(sorted(allowed)), special_regex(disallowed), tuple(sorted(allowed | disallowed))


def checked_chunks(chunks, disallowed_re, where):
    """Yield the chunks of a stream after check_disallowed on each (positions count from the
    start of the stream). Chunk cuts never split a special of the plan (iter_chunks)."""
    offset = 0
    for chunk in chunks:
        check_disallowed(chunk, disallowed_re, offset, where)
        offset += len(chunk)
        yield chunk
