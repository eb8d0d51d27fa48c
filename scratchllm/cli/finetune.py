"""python -m scratchllm finetune: continue training a Hugging Face checkpoint on a text file,
on a CPU, with the library's hand-written backward, and save the result as a Hugging Face
checkpoint that transformers loads.

    python -m scratchllm finetune --hf DIR --data FILE --steps N --out DIR2
    python -m scratchllm finetune --hf DIR --data FILE --lora 8 --lora-alpha 16 \
        --lora-targets q_proj,v_proj --out DIR2        # adapters only, saved for peft
    python -m scratchllm finetune --preset dense --data FILE --lora 4 --out DIR2

One step is train's (scratchllm/train/trainer.py): loss = CE(LM(x), y) -> backward -> clip
-> AdamW with warmup + cosine. The text is encoded with DIR's tokenizer.json. Progress,
validation and checkpoints are train's: the resumable state lives in DIR2/state/ (weights,
AdamW moments, step, batch RNG), and --resume continues it bit-exactly. At the end (and on
Ctrl-C) DIR2 gets config.json, model.safetensors and DIR's tokenizer files.

--lora R trains rank-R LoRA adapters on the --lora-targets projections (HF module names'
last part; scale --lora-alpha / R, alpha default R) and nothing else (scratchllm/train/lora.py)
and saves them in peft's format: DIR2/adapter_config.json and DIR2/adapter_model.safetensors
(peft.PeftModel.from_pretrained(base, DIR2) loads them); --merge also writes the merged
model (W0 + (alpha / R) A B) as a checkpoint in DIR2/merged. --preset NAME starts from a fresh preset on the
text's bytes (V = 256) instead of a checkpoint (for trying the machinery).
"""
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scratchllm.cli.common import Parser, run
from scratchllm.hub import load_pretrained, load_tokenizer, save_pretrained
from scratchllm.hub.peft import LoRA, save_adapter
from scratchllm.lm import LM, preset
from scratchllm.specs import PRESETS
from scratchllm.train import Run, Settings, checkpoint, corpus, evaluate, fit
from scratchllm.train.lora import fit_lora

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")
DEFAULTS = dict(steps=100, batch_size=4, seq_len=128, lr=1e-4, eval_every=50, warmup=10)


def build_parser():
    p = Parser("finetune", __doc__)
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--hf", help="Hugging Face checkpoint directory")
    start.add_argument("--preset", choices=sorted(PRESETS),
                       help="a fresh preset on the text's bytes (with --lora)")
    p.add_argument("--data", required=True, help="UTF-8 text file to fine-tune on")
    p.add_argument("--out", required=True, help="output directory (a Hugging Face checkpoint)")
    p.add_argument("--steps", type=int, default=DEFAULTS["steps"], help="optimizer steps (100)")
    p.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="(4)")
    p.add_argument("--seq-len", type=int, default=DEFAULTS["seq_len"], help="(128)")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="peak learning rate (1e-4)")
    p.add_argument("--eval-every", type=int, default=DEFAULTS["eval_every"],
                   help="validate and checkpoint every N steps (50)")
    p.add_argument("--seed", type=int, default=0, help="batch order seed (0)")
    p.add_argument("--resume", action="store_true", help="continue the state in OUT/state")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--lora", type=int, default=None, metavar="R",
                   help="train rank-R LoRA adapters only; save them in peft's format")
    p.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default R)")
    p.add_argument("--lora-targets", default="q_proj,v_proj",
                   help="comma-separated projection names (q_proj,v_proj)")
    p.add_argument("--merge", action="store_true",
                   help="with --lora: also save the merged model in OUT/merged")
    return p


def main(argv=None):
    return run("finetune", _main, build_parser().parse_args(argv))


def _settings(args):
    for name in ("steps", "batch_size", "seq_len", "eval_every"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {args.lr}")
    return Settings(**dict(asdict(Settings()), steps=args.steps, batch_size=args.batch_size,
                           seq_len=args.seq_len, lr=args.lr, eval_every=args.eval_every,
                           seed=args.seed, warmup=min(DEFAULTS["warmup"], args.steps)))


def _main(args):
    if args.lora is not None or args.preset is not None:
        return _lora_main(args)
    if args.merge:
        raise ValueError("--merge goes with --lora")
    out, state = Path(args.out), Path(args.out) / "state"
    if (state / checkpoint.STATE).exists() and not args.resume:
        raise ValueError(f"{out} already holds a fine-tuning state; pass --resume to continue "
                         f"it, or use another --out")
    model, tok = load_pretrained(args.hf), load_tokenizer(args.hf)
    text = Path(args.data).read_text(encoding="utf-8")
    ids = np.asarray(tok.encode_ordinary(text), dtype=np.int64)  # (N,)
    s = _settings(args)
    train_ids, val_ids = corpus.split(ids, val_fraction=0.1)
    if len(val_ids) <= s.seq_len:
        raise ValueError(f"--data {args.data} has {len(ids)} tokens; its last 10% (the "
                         f"validation split) must hold more than --seq-len {s.seq_len}")
    job = Run(model.cfg, s, model.dtype, model=model)
    job.data = str(Path(args.data).resolve())
    if args.resume:
        job.load(state)
        print(f"resumed {state} at step {job.step}")
    print(f"model: {args.hf} ({model.cfg.name}, {model.n_params():,} parameters); data: "
          f"{len(train_ids):,} train + {len(val_ids):,} validation tokens; {s.steps} steps of "
          f"{s.batch_size}x{s.seq_len}")
    eval_set = corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens)
    finished = fit(job, train_ids, val_ids, out=state, progress=not args.no_progress,
                   eval_set=eval_set)
    if finished:
        job.save(state)
        print(f"validation loss {evaluate(job.model, eval_set, job.dp):.3f} nats/token")
    save_pretrained(job.model, out)
    for name in TOKENIZER_FILES:
        if (Path(args.hf) / name).is_file():
            shutil.copy(Path(args.hf) / name, out / name)
    print(f"saved {out} (transformers: AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return 0 if finished else 130


def _lora_main(args):
    """--lora: adapters only (module docstring)."""
    if args.lora is None:
        raise ValueError("--preset goes with --lora R (a fresh preset has nothing to keep)")
    if args.lora < 1:
        raise ValueError(f"--lora must be a rank >= 1, got {args.lora}")
    if args.resume:
        raise ValueError("--resume does not apply to --lora (the adapters train in one go)")
    s = _settings(args)
    text = Path(args.data).read_text(encoding="utf-8")
    if args.hf:
        model, tok = load_pretrained(args.hf), load_tokenizer(args.hf)
        ids = np.asarray(tok.encode_ordinary(text), dtype=np.int64)  # (N,)
    else:
        model = LM(preset(args.preset, vocab_size=256), rng=np.random.default_rng(args.seed))
        ids = np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)  # (N,) bytes
    train_ids, val_ids = corpus.split(ids, val_fraction=0.1)
    if len(val_ids) <= s.seq_len:
        raise ValueError(f"--data {args.data} has {len(ids)} tokens; its last 10% (the "
                         f"validation split) must hold more than --seq-len {s.seq_len}")
    targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    lora = LoRA(model, args.lora, alpha=args.lora_alpha, targets=targets,
                rng=np.random.default_rng(args.seed))
    n = sum(p.data.size for p in lora.parameters())
    print(f"model: {args.hf or args.preset} ({model.n_params():,} parameters, frozen); LoRA "
          f"r={lora.rank} alpha={lora.alpha:g} on {len(lora.sites)} projections ({n:,} "
          f"trainable); {s.steps} steps of {s.batch_size}x{s.seq_len}")
    eval_set = corpus.eval_batches(val_ids, 16, s.seq_len, s.eval_tokens)  # 16 rows a call
    lora.unmerge()
    before = evaluate(model, eval_set)
    _, val = fit_lora(model, lora, train_ids, eval_set, s, progress=not args.no_progress)
    print(f"validation loss {before:.3f} -> {val:.3f} nats/token")
    out = Path(args.out)
    if args.merge:  # OUT/merged: beside the adapter, transformers would load the adapter
        save_pretrained(model, out / "merged")  # the adapters are merged after fit_lora
        for name in TOKENIZER_FILES:
            if args.hf and (Path(args.hf) / name).is_file():
                shutil.copy(Path(args.hf) / name, out / "merged" / name)
    lora.unmerge()
    save_adapter(lora, out, base_model=args.hf or args.preset)
    print(f"saved {out} (peft: PeftModel.from_pretrained(base, {str(out)!r}))")
    return 0
