"""Token healing in `generate`: a prompt that ends mid-token ("see https:") ends on a token
the model never saw there (training text tokenizes "https://" as " https" + "://"), so a
model that learned the corpus's token bigrams continues it badly; backing up over ":" and
letting the first token be any token that starts with ":" lets it pick "://"."""
import numpy as np

from scratchllm.lm import sampling
from scratchllm.tokenizer import Tokenizer, token_bytes, train_bpe

CORPUS = " ".join(f"see https://{w}.org now" for w in ["a", "bb", "ccc", "dd"] * 30) + \
    " note: x note: y"


class BigramLM:
    """logits[next] = log(count(prev, next) + 1e-3) from the corpus's ids: the next-token
    statistics a model trained on whole-tokenized text would learn."""

    def __init__(self, ids, vocab_size):
        self.counts = np.full((vocab_size, vocab_size), 1e-3)  # (V, V)
        np.add.at(self.counts, (ids[:-1], ids[1:]), 1.0)
        self.cfg = type("Cfg", (), {"vocab_size": vocab_size})

    def init_state(self, batch, max_len):
        return {}

    def prefill(self, ids, state):
        return np.log(self.counts[ids])                        # (1, T, V)

    def decode(self, ids_t, state, position):
        return np.log(self.counts[ids_t])                      # (1, V)


def _setup():
    vocab, merges = train_bpe([CORPUS], 275, workers=1)
    tok = Tokenizer(vocab, merges)
    assert b"://" in tok.vocab.values()
    ids = np.array(tok.encode(CORPUS))
    return tok, BigramLM(ids, max(tok.vocab) + 1)


def _greedy(model, tok, prompt, heal):
    return "".join(sampling.generate(model, tok, prompt, 4, np.random.default_rng(0),
                                     temperature=0, heal=heal))


def test_healing_fixes_a_prompt_cut_mid_token():
    tok, model = _setup()
    prompt = "see https:"
    assert [tok.decode([i]) for i in tok.encode(prompt)][-1] == ":"
    plain, healed = _greedy(model, tok, prompt, False), _greedy(model, tok, prompt, True)
    assert not plain.startswith("//")          # ":" alone was followed by " x", " y" only
    assert healed.startswith("//")             # the healed token is "://"; ":" was printed


def test_heal_masks_the_tokens_that_extend_the_last_one():
    tok, model = _setup()
    ids = tok.encode("see https:")
    shorter, allowed, tail = sampling.heal(tok, ids, model.cfg.vocab_size)
    assert shorter == ids[:-1] and tail == b":"
    assert {tok.vocab[i] for i in np.flatnonzero(allowed)} == \
        {b for b in tok.vocab.values() if b.startswith(b":")}


def test_a_tokenizer_json_pipeline_gives_its_token_bytes():
    """Byte-level and SentencePiece-like tokenizer.json pipelines (HFPipeline) expose the
    bytes healing needs; WordPiece does not."""
    import gzip
    import json
    from pathlib import Path

    from scratchllm.tokenizer import HFPipeline
    data = json.loads(gzip.decompress((Path(__file__).resolve().parents[1] / "fixtures" / "hf" /
                                       "pipelines.json.gz").read_bytes()))

    def pipeline(name):
        case = data["cases"][name]
        return HFPipeline(dict(case["spec"], model=data["models"][case["model"]]))
    byte_level = pipeline("digits_individual")
    table = token_bytes(byte_level)
    ids = byte_level.encode_ordinary("Hello world 🙂")
    assert b"".join(table[i] for i in ids) == "Hello world 🙂".encode()
    gemma = pipeline("metaspace_gemma_replace")
    ids = gemma.encode_ordinary("héllo wörld")
    assert b"".join(token_bytes(gemma)[i] for i in ids) == "héllo wörld".encode()  # no dummy prefix
    assert token_bytes(pipeline("bert_normalizer_default")) is None
