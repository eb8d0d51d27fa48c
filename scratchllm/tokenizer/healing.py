"""Token healing's tokenizer side (used by scratchllm.lm.sampling.heal): the bytes each token
adds to the text, and the first-token mask of a prompt cut mid-token."""
import numpy as np


def token_bytes(tokenizer):
    """{id: bytes} of every ordinary token: a byte-level Tokenizer's vocab, a SentencePiece
    model's pieces (▁ as a space, <0xNN> as its byte), a tokenizer.json pipeline's own
    token_bytes(); None for other tokenizers."""
    own = getattr(tokenizer, "token_bytes", None)
    if callable(own):
        return own()
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, dict) and all(isinstance(v, bytes) for v in vocab.values()):
        special = set(tokenizer.special_tokens.values())
        return {i: b for i, b in vocab.items() if i not in special}
    pieces = getattr(tokenizer, "pieces", None)
    if pieces is None:
        return None
    out = {}
    for i, (p, _) in enumerate(pieces):
        if len(p) == 6 and p.startswith("<0x") and p.endswith(">"):
            out[i] = bytes([int(p[3:5], 16)])
        elif i not in set(tokenizer.special_tokens.values()):
            out[i] = p.replace("\u2581", " ").encode("utf-8")
    return out


def heal_table(table, prompt_ids, vocab_size):
    """heal's step on a {id: bytes} table: (prompt_ids without the last id, mask (V,) of the
    ids whose bytes start with the last id's bytes)."""
    tail = table[prompt_ids[-1]]
    allowed = np.zeros(vocab_size, dtype=bool)  # (V,)
    for i, b in table.items():
        if i < vocab_size and b.startswith(tail):
            allowed[i] = True
    return list(prompt_ids[:-1]), allowed
