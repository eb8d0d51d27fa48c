"""Unigram benchmark: our trainer and Viterbi encoder vs sentencepiece (and HF tokenizers).

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_unigram.py [--mb 1.0] [--vocab 4000]

Rows (one process, same machine load):
- train on the first --mb MB of the bundled corpus (scratchllm/data/python-docs.txt) to
  --vocab pieces: our train_unigram (pure Python) vs SentencePieceTrainer (unigram, identity
  normalisation, 2 threads); quality = corpus log-likelihood sum_w f_w log Z(w) of each model
  over the same words, computed by the same forward algorithm (unigram_train.py); target: ours
  within 1% of sentencepiece's;
- Viterbi encode MB/s of each model's own encoder on the same text: ours (on our model) vs
  sentencepiece (on its model) vs HF tokenizers (on our model saved as tokenizer.json);
- peak RSS (ru_maxrss) of the whole process, after each stage.
"""
import argparse
import os
import resource
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
CORPUS = os.path.join(os.path.dirname(HERE), "scratchllm", "data", "python-docs.txt")


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def corpus_ll(words, pieces):
    """sum_w f_w log Z(w) with the pieces' scores renormalised to a distribution (a model's
    stored scores need not sum to 1 after its final pruning)."""
    import numpy as np
    from scratchllm.tokenizer.unigram_train import _expected_counts
    z = np.logaddexp.reduce([s for p, s in pieces if p])
    logp = {p: s - z for p, s in pieces if p}
    return _expected_counts(words, logp, max(map(len, logp)))[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=4000)
    args = ap.parse_args()
    import sentencepiece as spm
    from tokenizers import Tokenizer as HFTokenizer
    from scratchllm.tokenizer import Unigram, save_unigram_json, train_unigram
    from scratchllm.tokenizer.unigram_files import load_sentencepiece
    from scratchllm.tokenizer.unigram_train import _words
    from bench_bpe import print_rows
    raw = open(CORPUS, "rb").read()[:int(args.mb * 1e6)].decode("utf-8", "ignore")
    text = raw.replace("<|endoftext|>", "")
    path = os.path.join(HERE, "data", f"unigram_{args.mb}mb.txt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    rows = []
    start = time.perf_counter()
    ours = train_unigram(path, args.vocab, report=lambda r, n, ll: print(
        f"round {r}: {n} pieces, log-likelihood {ll:.1f}", flush=True))
    t_ours = time.perf_counter() - start
    rss_train = rss_mb()
    prefix = os.path.join(HERE, "data", "spm_bench")
    start = time.perf_counter()
    spm.SentencePieceTrainer.train(input=path, model_prefix=prefix, vocab_size=args.vocab,
                                   model_type="unigram", normalization_rule_name="identity",
                                   character_coverage=1.0, num_threads=2, minloglevel=2)
    t_spm = time.perf_counter() - start
    theirs = load_sentencepiece(prefix + ".model")
    words = _words(path, (), Unigram([("<unk>", 0.0)]).normalize)
    ll_ours, ll_spm = corpus_ll(words, ours.pieces[1:]), corpus_ll(words, theirs.pieces[3:])
    rows.append((f"train {args.mb} MB -> {args.vocab}", f"{t_ours:.1f} s", f"spm {t_spm:.1f} s",
                 f"{t_ours / t_spm:.1f}x spm time", "", None))
    rows.append(("corpus log-likelihood (nats)", f"{ll_ours:.0f}", f"spm {ll_spm:.0f}",
                 f"{(ll_ours - ll_spm) / abs(ll_spm) * 100:+.2f}%", ">= spm - 1%",
                 ll_ours >= ll_spm - 0.01 * abs(ll_spm)))
    lines = [t for t in text.split("\n") if t.strip()]
    mb = sum(len(t.encode("utf-8")) for t in lines) / 1e6
    proc = spm.SentencePieceProcessor(model_file=prefix + ".model")
    save_unigram_json(ours, prefix + ".json")
    hf = HFTokenizer.from_file(prefix + ".json")
    timings = {}
    for name, fn in (("ours", lambda: [ours.encode_ordinary(t) for t in lines]),
                     ("spm", lambda: proc.encode(lines)),
                     ("hf", lambda: hf.encode_batch(lines))):
        start = time.perf_counter()
        fn()
        timings[name] = time.perf_counter() - start
    rows.append((f"Viterbi encode {mb:.1f} MB (1 process)", f"{mb / timings['ours']:.2f} MB/s",
                 f"spm {mb / timings['spm']:.1f} MB/s, HF {mb / timings['hf']:.1f} MB/s",
                 f"{timings['spm'] / timings['ours']:.3f}x spm", "", None))
    as_hf = Unigram(ours.pieces, 0, remove_extra_whitespaces=False, fuse_unk=True)  # HF's rules
    same_hf = [hf.encode(t).ids for t in lines[:300]] == [as_hf.encode_ordinary(t)
                                                         for t in lines[:300]]
    rows.append(("HF tokenizers on our saved tokenizer.json: same ids (300 lines)",
                 str(same_hf), "", "", "same ids", same_hf))
    rows.append(("peak RSS", f"{rss_train:.0f} MB after our training",
                 f"{rss_mb():.0f} MB at the end", "", "", None))
    print_rows(rows, 1)


if __name__ == "__main__":
    main()
