"""finetune --lora: LoRA adapters only, on a checkpoint (--hf) or a fresh preset (--preset,
on the text's bytes: for trying the machinery), saved in peft's format.

    python -m scratchllm finetune --hf DIR --data FILE --lora 8 --lora-alpha 16 \\
        --lora-targets q_proj,v_proj [--merge] --out DIR2

The adapters sit on the --lora-targets projections (the last part of HF's module names;
scratchllm/hub/peft.py), scale --lora-alpha / R (alpha default R), and train alone
(scratchllm/train/lora.py). DIR2 gets adapter_config.json and adapter_model.safetensors
(peft.PeftModel.from_pretrained(base, DIR2) loads them); --merge also writes the merged model
(W0 + (alpha / R) A B) as a checkpoint in DIR2/merged (beside the adapter files, transformers
would load the adapter instead). The resumable state (adapters, AdamW moments, batch RNG)
goes to DIR2/lora_state every --eval-every steps; an interrupted run continues with --resume
(bit for bit), and a finished one removes it unless --keep-state.
"""
import shutil
from pathlib import Path

import numpy as np

from scratchllm.hub import load_pretrained, load_tokenizer, save_pretrained
from scratchllm.hub.peft import LoRA, save_adapter
from scratchllm.lm import LM, preset
from scratchllm.specs import PRESETS
from scratchllm.train import checkpoint, corpus, evaluate
from scratchllm.train.lora import fit_lora

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja")


def add_lora_arguments(p):
    """The --lora flags on finetune's parser."""
    p.add_argument("--lora", type=int, default=None, metavar="R",
                   help="train rank-R LoRA adapters only; save them in peft's format")
    p.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default R)")
    p.add_argument("--lora-targets", default="q_proj,v_proj",
                   help="comma-separated projection names (q_proj,v_proj)")
    p.add_argument("--merge", action="store_true",
                   help="with --lora: also save the merged model in OUT/merged")


def _model(args):
    """(model, token ids of --data)."""
    text = Path(args.data).read_text(encoding="utf-8")
    if args.hf:
        model, tok = load_pretrained(args.hf), load_tokenizer(args.hf)
        return model, np.asarray(tok.encode_ordinary(text), dtype=np.int64)  # (N,)
    if args.preset not in PRESETS:
        raise ValueError(f"--preset must be one of {sorted(PRESETS)}, got {args.preset!r}")
    model = LM(preset(args.preset, vocab_size=256), rng=np.random.default_rng(args.seed))
    return model, np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)  # bytes


def lora_main(args, s):
    """Run finetune --lora with trainer Settings s (module docstring)."""
    if args.lora is None:
        raise ValueError("--preset goes with --lora R (a fresh preset has nothing to keep)")
    if args.lora < 1:
        raise ValueError(f"--lora must be a rank >= 1, got {args.lora}")
    out, state = Path(args.out), Path(args.out) / "lora_state"
    if (state / checkpoint.STATE).exists() and not args.resume:
        raise ValueError(f"{out} already holds a LoRA state; pass --resume to continue it or "
                         f"choose another --out")
    if args.resume and not (state / checkpoint.STATE).exists():
        raise ValueError(f"--resume: {state} holds no LoRA state to continue")
    model, ids = _model(args)
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
    before = evaluate(model, eval_set)
    _, val = fit_lora(model, lora, train_ids, eval_set, s, progress=not args.no_progress,
                      state=state, resume=args.resume)
    print(f"validation loss {before:.3f} -> {val:.3f} nats/token")
    if not args.keep_state:
        shutil.rmtree(state, ignore_errors=True)  # finished: the adapters below are the result
    if args.merge:
        save_pretrained(model, out / "merged")  # the adapters are merged after fit_lora
        for name in TOKENIZER_FILES if args.hf else ():
            if (Path(args.hf) / name).is_file():
                shutil.copy(Path(args.hf) / name, out / "merged" / name)
    lora.unmerge()
    save_adapter(lora, out, base_model=args.hf or args.preset)
    print(f"saved {out} (peft: PeftModel.from_pretrained(base, {str(out)!r}))")
    return 0
