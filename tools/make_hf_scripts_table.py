"""Write scratchllm/tokenizer/hf_scripts.py: where HF `tokenizers`' UnicodeScripts pre-tokenizer
gives a character another script than Python `regex`'s Script property does.

    PYTHONPATH=$PWD python tools/make_hf_scripts_table.py     # needs tokenizers; ~1 minute

`tokenizers` carries its own, older script table (characters assigned since are "Any", which
joins every script), so a text holding them cuts differently. Each code point c is probed
through `tokenizers` itself: "a" + c and "中" + c both one piece means Any; otherwise c joins the
first script representative r (a character of that script by `regex`) for which r + c is one
piece. Where that differs from hf_pretokenizers' own reading (regex's script, Hiragana and
Katakana as Han), the table records it, as ranges of equal answers.
"""
from pathlib import Path

import regex
from tokenizers import pre_tokenizers

from scratchllm.tokenizer.hf_pretokenizers import hf_script

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "scratchllm" / "tokenizer" / "hf_scripts.py"
SCRIPTS = pre_tokenizers.UnicodeScripts()


def pieces(text):
    return len(SCRIPTS.pre_tokenize_str(text))


def representatives():
    """{script: a character that regex and tokenizers both put in it}."""
    reps = {}
    for c in map(chr, range(0x20, 0x30000)):
        s = hf_script(c, table=False)
        if s is not None and s not in reps and pieces(c + c) == 1 and \
                not (pieces("a" + c) == 1 and pieces("中" + c) == 1):
            reps[s] = c
    return reps


def main():
    reps = representatives()
    rows = []
    for code in range(0x110000):
        if 0xD800 <= code < 0xE000 or code == 0x20:
            continue
        c = chr(code)
        ours = hf_script(c, table=False)
        if pieces("a" + c) == 1 and pieces("中" + c) == 1:
            theirs = None
        elif ours is not None and pieces(reps[ours] + c) == 1:
            theirs = ours
        else:
            theirs = next((s for s, r in reps.items() if pieces(r + c) == 1), "?")
        if theirs != ours:
            if rows and rows[-1][1] == code - 1 and rows[-1][2] == theirs:
                rows[-1][1] = code
            else:
                rows.append([code, code, theirs])
    body = ",\n".join(f"    (0x{a:05X}, 0x{b:05X}, {s!r})" for a, b, s in rows)
    OUT.write_text(f'''"""Where HF `tokenizers`' UnicodeScripts reads a character's script otherwise than Python
`regex` (its table predates the characters, which it reads as "Any": None here). Written by
tools/make_hf_scripts_table.py by probing `tokenizers`; ranges (first, last, script).
"""
OVERRIDES = (
{body},
)
''', encoding="utf-8")
    print(f"{OUT}: {len(rows)} ranges, {sum(b - a + 1 for a, b, _ in rows)} code points; "
          f"{regex.__name__} scripts probed: {len(reps)}")


if __name__ == "__main__":
    main()
