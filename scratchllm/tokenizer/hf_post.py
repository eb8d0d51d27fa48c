"""Hugging Face post-processors: the special tokens `tokenizers` puts around an encoded text
when encode(text, add_special_tokens=True) (its default), e.g. Llama's beginning-of-sequence.

A single text's ids become  prefix + ids(text) + suffix,  read off tokenizer.json's
post_processor:
    TemplateProcessing  "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]
                        with "special_tokens": {"<s>": {"ids": [1], ...}}: the items before
                        the sequence $A are the prefix, those after it the suffix
    BertProcessing      [cls] $A [sep]   ("cls": ["[CLS]", 101], "sep": ["[SEP]", 102])
    RobertaProcessing   <s> $A </s>      (the same fields)
    ByteLevel           offsets only: no ids
    Sequence            each processor in turn
    null                nothing
Only single texts: the "pair" templates (two sequences A, B) are not read.
Reference: huggingface/tokenizers tokenizers/src/processors/template.rs.
"""


def _fail(where, msg):
    raise ValueError(f"{where}: post_processor {msg}")


def _template(spec, where):
    """(prefix ids, suffix ids) of a TemplateProcessing's single template."""
    prefix, suffix, seen = [], [], False
    for item in spec.get("single", []):
        if "Sequence" in item:
            if item["Sequence"].get("id") != "A" or seen:
                _fail(where, f"TemplateProcessing single {spec['single']} is not one $A")
            seen = True
        elif "SpecialToken" in item:
            name = item["SpecialToken"]["id"]
            if name not in spec.get("special_tokens", {}):
                _fail(where, f"TemplateProcessing names {name!r}, not in its special_tokens")
            (suffix if seen else prefix).extend(spec["special_tokens"][name]["ids"])
        else:
            _fail(where, f"TemplateProcessing item {item} is neither Sequence nor SpecialToken")
    if not seen:
        _fail(where, f"TemplateProcessing single {spec.get('single')} has no $A")
    return prefix, suffix


def post_processor_ids(spec, where):
    """(prefix ids, suffix ids) of a tokenizer.json post_processor (see the module docstring)."""
    kind = (spec or {}).get("type")
    if kind is None or kind == "ByteLevel":
        return [], []
    if kind == "TemplateProcessing":
        return _template(spec, where)
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [spec["cls"][1]], [spec["sep"][1]]
    if kind == "Sequence":
        prefix, suffix = [], []
        for step in spec["processors"]:
            p, s = post_processor_ids(step, where)
            prefix, suffix = p + prefix, suffix + s  # a later step wraps the earlier result
        return prefix, suffix
    _fail(where, f"{kind!r} is not implemented (TemplateProcessing, BertProcessing, "
                 f"RobertaProcessing, ByteLevel, Sequence)")


class PostProcessed:
    """A tokenizer (Tokenizer, SentencePieceBPE or Unigram) with tokenizer.json's
    post-processor: encode and encode_ordinary take add_special_tokens (default False, the
    library's encode: the text's ids only; True: prefix + ids + suffix, as HF `tokenizers`'
    encode does by default). Everything else is the wrapped tokenizer's (`inner`)."""

    def __init__(self, inner, prefix=(), suffix=()):
        self.inner, self.prefix, self.suffix = inner, list(prefix), list(suffix)

    def __getattr__(self, name):
        if name == "inner":  # not set yet (unpickling): no recursion through inner
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _wrap(self, ids, add_special_tokens):
        return self.prefix + list(ids) + self.suffix if add_special_tokens else list(ids)

    def encode(self, text, *, add_special_tokens=False, **specials):
        """inner.encode(text, **specials), wrapped when add_special_tokens."""
        return self._wrap(self.inner.encode(text, **specials), add_special_tokens)

    def encode_ordinary(self, text, *, add_special_tokens=False):
        """inner.encode_ordinary(text), wrapped when add_special_tokens."""
        return self._wrap(self.inner.encode_ordinary(text), add_special_tokens)
