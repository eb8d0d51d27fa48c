"""BPE over characters with ▁ for spaces and byte fallback: the SentencePiece BPE model (the
Llama-2 / Mistral-v0.1 / Gemma tokenizer form; Sennrich et al. 2016, arXiv 1508.07909, as
google/sentencepiece src/bpe_model.cc runs it).

The text is normalised as for the Unigram model (normalizer.py: ▁, dummy prefix), split into
characters, and the adjacent pair whose concatenation is the vocabulary piece of highest score
is merged, leftmost first among equal scores, until no adjacent pair forms a piece:

    symbols = chars(x);  repeat: (i*) = argmax_i score(s_i + s_{i+1}) over pairs in V; merge

A symbol that is not a piece (a character outside the vocabulary) becomes its UTF-8 bytes as
<0xNN> pieces with byte fallback, else the unknown id. Everything else (special tokens,
decoding) is the Unigram class's; there is one segmentation, so no n-best or sampling.

Glossary: symbol = current string of the segmentation; score = the piece's SentencePiece score
(for BPE models: minus its merge rank).
"""
from .unigram import Unigram


class SentencePieceBPE(Unigram):
    """SentencePiece BPE: the arguments of Unigram; scores order the merges, or, when
    `merges` [(a, b)] is given (HF tokenizer.json), the merge ranks do (lowest first)."""

    def __init__(self, pieces, merges=None, **options):
        super().__init__(pieces, **options)
        self._rank = None if merges is None else {(a, b): -r for r, (a, b) in enumerate(merges)}

    def _priority(self, a, b):
        """Higher merges first: the score of piece a+b, or minus the rank of merge (a, b);
        None when a, b never merge."""
        k = self._index.get(a + b)
        if k is None:
            return None
        return self._score[k] if self._rank is None else self._rank.get((a, b))

    def _segment_ids(self, x):
        """Ids of the BPE segmentation of the normalised text x."""
        return self._ids(x, self._segment(x))

    def _segment(self, x):
        """[(start, end, id)] of the BPE segmentation of the normalised text x."""
        spans = [(i, i + 1) for i in range(len(x))]
        while True:
            best, at = None, -1
            for i in range(len(spans) - 1):
                p = self._priority(x[spans[i][0]:spans[i][1]], x[spans[i + 1][0]:spans[i + 1][1]])
                if p is not None and (best is None or p > best):
                    best, at = p, i
            if at < 0:
                break
            spans[at:at + 2] = [(spans[at][0], spans[at + 1][1])]
        return [(i, j, self._index.get(x[i:j], self.unk_id)) for i, j in spans]

    def nbest(self, text, n):
        raise TypeError("SentencePieceBPE.nbest: BPE has one segmentation (use encode)")

    def sample(self, text, alpha, rng):
        raise TypeError("SentencePieceBPE.sample: BPE has one segmentation (BPE-dropout, "
                        "arXiv 1910.13267, is not implemented)")

    def log_likelihood(self, text):
        raise TypeError("SentencePieceBPE.log_likelihood: BPE scores are merge ranks, not "
                        "log-probabilities")
