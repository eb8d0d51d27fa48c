"""Unigram benchmark: our trainer and Viterbi encoder vs sentencepiece (and HF tokenizers).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/bench_unigram.py \
        [--vocab 4000] [--mb 0 (= the whole 33 MB corpus)] [--encode-mb 2] [--stages a,b]
        [--interleave 7 (encode only, ours and spm alternating in one process)]

--stages runs some stages only (to keep each locked run short); every stage's result is kept
in benchmarks/data/unigram_results_<vocab>_<mb>.json and the table is printed once all five
are there.

The corpus is benchmarks/data/large_en.txt with its "<|endoftext|>" separators removed
(written once to benchmarks/data/unigram_corpus.txt). Each stage runs in its own child process,
which reports its wall time and its own peak RSS (ru_maxrss):
- train to --vocab pieces: our train_unigram (Numba kernels, NUMBA_NUM_THREADS=2) vs
  SentencePieceTrainer (unigram, identity normalisation, character_coverage 1, 2 threads,
  split_by_unicode_script and split_by_number off: ours has no such rule, a piece may mix
  letters, digits and punctuation; otherwise spm's defaults, which are also ours). Ours gets
  "<s>", "</s>" as special tokens so that both learn vocab - 3 pieces;
- quality: the corpus log-likelihood sum_w f_w log Z(w) of each model over the same words
  (the corpus's, split as both trainers split it), computed by the same forward algorithm
  (unigram_em.expected_counts) with each model's learned pieces' scores renormalised to sum
  to 1 (sentencepiece's do not after its final pruning). Target: ours within 1% of spm's;
- Viterbi encode MB/s on the first --encode-mb MB of lines, one thread each: ours (on our
  model, encode_ordinary_batch: the whitespace rules and the segmentation are one kernel call
  each over all lines, unigram_viterbi.py)
  vs sentencepiece (on its model, num_threads=1) vs HF tokenizers (on our model saved as
  tokenizer.json, encode_batch, RAYON_NUM_THREADS=1).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "2")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
DATA = os.path.join(HERE, "data")
SOURCE, CORPUS = os.path.join(DATA, "large_en.txt"), os.path.join(DATA, "unigram_corpus.txt")
META = ("<s>", "</s>")
STAGES = "train-ours,train-spm,encode-ours,encode-spm,encode-hf"


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def corpus(mb):
    path = CORPUS if not mb else os.path.join(DATA, f"unigram_{mb}mb.txt")
    if not os.path.exists(path):
        with open(SOURCE, encoding="utf-8") as fh:
            text = fh.read()
        text = text[:int(mb * 1e6)] if mb else text
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text.replace("<|endoftext|>", ""))
    return path


def model_path(kind, vocab, mb):
    return os.path.join(DATA, f"unigram_{kind}_{vocab}_{mb}" + (".json" if kind == "ours"
                                                                  else ""))


def lines_of(path, mb):
    out, size = [], 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if line.strip():
                out.append(line)
                size += len(line.encode("utf-8"))
            if size >= mb * 1e6:
                break
    return out, size / 1e6


def ours_model(vocab, mb):
    from scratchllm.tokenizer import Unigram, load_unigram_json
    tok = load_unigram_json(model_path("ours", vocab, mb))             # SentencePiece's rules:
    return Unigram(tok.pieces, 0, tok.special_tokens)


def child(stage, vocab, mb, encode_mb):
    """One stage in this process: {"s": wall time, "rss": peak RSS MB, ...}."""
    path, out = corpus(mb), {}
    if stage == "prepare":
        return print(json.dumps({"mb": os.path.getsize(path) / 1e6}))
    if stage.startswith("encode"):
        lines, out["mb"] = lines_of(path, encode_mb)
    start = time.perf_counter()
    if stage == "train-ours":
        from scratchllm.tokenizer import save_unigram_json, train_unigram
        tok = train_unigram(path, vocab, META, report=lambda r, n, ll: print(
            f"round {r}: {n} pieces, log-likelihood {ll:.6g}", file=sys.stderr, flush=True))
        out["s"] = time.perf_counter() - start
        save_unigram_json(tok, model_path("ours", vocab, mb))
    elif stage == "train-spm":
        import sentencepiece as spm
        spm.SentencePieceTrainer.train(input=path, model_prefix=model_path("spm", vocab, mb),
                                       vocab_size=vocab, model_type="unigram",
                                       normalization_rule_name="identity",
                                       character_coverage=1.0, num_threads=2, minloglevel=2,
                                       split_by_unicode_script=False, split_by_number=False)
    elif stage == "encode-ours":
        tok = ours_model(vocab, mb)
        tok.encode_ordinary_batch(lines[:2])                            # compile / load cache
        start = time.perf_counter()
        out["ids"] = sum(map(len, tok.encode_ordinary_batch(lines)))
    elif stage == "encode-spm":
        import sentencepiece as spm
        proc = spm.SentencePieceProcessor(model_file=model_path("spm", vocab, mb) + ".model")
        start = time.perf_counter()
        out["ids"] = sum(map(len, proc.encode(lines, num_threads=1)))
    elif stage == "encode-hf":
        from tokenizers import Tokenizer as HFTokenizer
        hf = HFTokenizer.from_file(model_path("ours", vocab, mb))
        start = time.perf_counter()
        out["ids"] = sum(len(e.ids) for e in hf.encode_batch(lines))
    out.setdefault("s", time.perf_counter() - start)
    out["rss"] = rss_mb()
    print(json.dumps(out))


def run_child(stage, args):
    cmd = [sys.executable, __file__, "--child", stage, "--vocab", str(args.vocab), "--mb",
           str(args.mb), "--encode-mb", str(args.encode_mb)]
    res = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def likelihoods(args):
    """Corpus log-likelihood of our model and of spm's, scored the same way."""
    import numpy as np
    from scratchllm.tokenizer import Normalizer
    from scratchllm.tokenizer.unigram_em import expected_counts
    from scratchllm.tokenizer.unigram_files import load_sentencepiece
    from scratchllm.tokenizer.unigram_lattice import PieceTrie
    from scratchllm.tokenizer.unigram_train import _word_arrays, _words
    words = _word_arrays(_words(corpus(args.mb), (), Normalizer().normalize))
    out = []
    for tok in (ours_model(args.vocab, args.mb),
                load_sentencepiece(model_path("spm", args.vocab, args.mb) + ".model")):
        learned = tok.pieces[3:]
        logp = np.array([s for _, s in learned])
        trie = PieceTrie.from_strings([p for p, _ in learned], range(len(learned)), len(learned))
        out.append(expected_counts(*words, trie, logp - np.logaddexp.reduce(logp))[1])
    return out, len(words[2])


def interleaved(args):
    """Viterbi encode in one process, ours and spm alternating for --interleave rounds (one
    thread each): medians of wall and CPU time, their ratios, and whether the counts of ids
    match; robust to load that comes and goes, unlike the stages' one run each."""
    import statistics
    import sentencepiece as spm
    lines, mb = lines_of(corpus(args.mb), args.encode_mb)
    tok = ours_model(args.vocab, args.mb)
    proc = spm.SentencePieceProcessor(model_file=model_path("spm", args.vocab, args.mb) + ".model")
    tok.encode_ordinary_batch(lines[:2])                                # compile / load cache
    runs = {"ours": (lambda: tok.encode_ordinary_batch(lines)),
            "spm": (lambda: proc.encode(lines, num_threads=1))}
    times = {name: [] for name in runs}
    for _ in range(args.interleave):
        for name, fn in runs.items():
            wall, cpu = time.perf_counter(), time.process_time()
            ids = fn()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu,
                                sum(map(len, ids))))
    med = {n: [statistics.median(r[i] for r in t) for i in range(2)] for n, t in times.items()}
    print(f"Viterbi encode {mb:.2f} MB, vocab {args.vocab}, {args.interleave} rounds "
          f"interleaved, load average {os.getloadavg()[0]:.1f}")
    for name, (wall, cpu) in med.items():
        print(f"{name:<5} wall {wall * 1e3:7.1f} ms ({mb / wall:5.2f} MB/s)  CPU "
              f"{cpu * 1e3:7.1f} ms  ids {times[name][0][2]}")
    print(f"ours / spm speed: wall {med['spm'][0] / med['ours'][0]:.2f}x, CPU "
          f"{med['spm'][1] / med['ours'][1]:.2f}x  (target >= 1.0x)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=4000)
    ap.add_argument("--mb", type=float, default=0.0, help="first MB of the corpus (0: all)")
    ap.add_argument("--encode-mb", type=float, default=2.0)
    ap.add_argument("--child")
    ap.add_argument("--stages", default=STAGES)
    ap.add_argument("--interleave", type=int, default=0,
                    help="rounds of ours and spm's encoding alternating in one process")
    args = ap.parse_args()
    if args.interleave:
        return interleaved(args)
    if args.child:
        return child(args.child, args.vocab, args.mb, args.encode_mb)
    from bench_bpe import print_rows
    size = run_child("prepare", args)["mb"]   # the parent stays small (a child starts with
    results = os.path.join(DATA, f"unigram_results_{args.vocab}_{args.mb}.json")  # its
    r = json.load(open(results)) if os.path.exists(results) else {}       # parent's peak RSS)
    for stage in filter(None, args.stages.split(",")):
        r[stage] = run_child(stage, args)
        r[stage]["load"] = os.getloadavg()[0]
        with open(results, "w") as fh:
            json.dump(r, fh)
    if any(stage not in r for stage in STAGES.split(",")):
        return print(json.dumps(r))
    print("load average after each stage:", {k: round(v["load"], 1) for k, v in r.items()})
    (ll_ours, ll_spm), n_words = likelihoods(args)
    gap = (ll_ours - ll_spm) / abs(ll_spm)
    enc = {k: r[f"encode-{k}"] for k in ("ours", "spm", "hf")}
    mb = enc["ours"]["mb"]
    print(f"corpus {size:.1f} MB, {n_words} distinct words; NUMBA_NUM_THREADS="
          f"{os.environ['NUMBA_NUM_THREADS']}")
    print_rows([
        (f"train {size:.0f} MB -> {args.vocab}", f"{r['train-ours']['s']:.1f} s",
         f"spm {r['train-spm']['s']:.1f} s",
         f"{r['train-ours']['s'] / r['train-spm']['s']:.2f}x spm time", "", None),
        ("corpus log-likelihood (nats, normalised)", f"{ll_ours:.6g}", f"spm {ll_spm:.6g}",
         f"{gap * 100:+.2f}%", ">= spm - 1%", gap >= -0.01),
        (f"Viterbi encode {mb:.1f} MB (1 thread)", f"{mb / enc['ours']['s']:.2f} MB/s",
         f"spm {mb / enc['spm']['s']:.2f} MB/s, HF {mb / enc['hf']['s']:.2f} MB/s",
         f"{enc['spm']['s'] / enc['ours']['s']:.2f}x spm, "
         f"{enc['hf']['s'] / enc['ours']['s']:.2f}x HF", "", None),
        ("tokens of the encoded text", str(enc["ours"]["ids"]),
         f"spm {enc['spm']['ids']}, HF {enc['hf']['ids']}", "", "", None),
        ("peak RSS train", f"{r['train-ours']['rss']:.0f} MB",
         f"spm {r['train-spm']['rss']:.0f} MB", "", "", None),
        ("peak RSS encode", f"{enc['ours']['rss']:.0f} MB",
         f"spm {enc['spm']['rss']:.0f} MB, HF {enc['hf']['rss']:.0f} MB", "", "", None),
    ], 1)


if __name__ == "__main__":
    main()
