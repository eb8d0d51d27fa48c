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
Ctrl-C) DIR2 gets config.json, model.safetensors and every other file of DIR but its weights
(tokenizer files, chat_template.jinja, generation_config.json, ...). The state (about 3x the
model: weights and two AdamW moments) is removed after a finished run unless --keep-state;
an interrupted run keeps it for --resume. The closing message lists what was written.

An MoE checkpoint fine-tunes with its routing in view: `--freeze-router` keeps every router's
weights as they are (a parameter group with learning rate 0), `--param-group PATTERN LR_SCALE
WEIGHT_DECAY` gives the parameters whose names match the glob PATTERN their own learning rate
(LR_SCALE times --lr) and weight decay (e.g. `--param-group "*.ffn.w[123]" 0.5 0.0` for the
experts), and each validation prints every MoE layer's share of routed slots per expert (a
drift from the checkpoint's balance shows there), as does the end of the run.

A vision-language checkpoint (llava, qwen2_vl, gemma3) fine-tunes its LM on the text, the
image encoder and projector as they are; --projector-only trains the projector between its
image encoder and its LM alone instead, on image-caption pairs (--data a JSON-lines file of
{"image": PATH, "text": CAPTION}, or LLaVA's own JSON list of {"image", "conversations"}):
LLaVA's stage 1 (scratchllm/cli/projector.py).

--lora R trains rank-R LoRA adapters on the --lora-targets projections (HF module names'
last part; scale --lora-alpha / R, alpha default R) and nothing else, and saves them in
peft's format (scratchllm/cli/lora.py).
"""
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scratchllm.cli.common import Parser, run
from scratchllm.cli.lora import add_lora_arguments, lora_main
from scratchllm.cli.projector import projector_finetune
from scratchllm.hub import load_pretrained, load_tokenizer, save_pretrained
from scratchllm.train import Run, Settings, checkpoint, corpus, evaluate, fit
from scratchllm.train.trainer import expert_usage_line

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf",
                   ".onnx", ".safetensors.index.json", ".bin.index.json")
KEPT_DIRS = ("additional_chat_templates",)   # transformers' extra named templates
DEFAULTS = dict(steps=100, batch_size=4, seq_len=128, lr=1e-4, eval_every=50, warmup=10)


def build_parser():
    p = Parser("finetune", __doc__)
    start = p.add_mutually_exclusive_group(required=True)
    start.add_argument("--hf", help="Hugging Face checkpoint directory")
    start.add_argument("--preset", help="a fresh preset on the text's bytes (with --lora)")
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
    p.add_argument("--keep-state", action="store_true",
                   help="keep OUT/state (weights + AdamW moments, ~3x the model) after a "
                        "finished run, to --resume it later with more --steps")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--freeze-router", action="store_true", help="keep the MoE routers' "
                   "weights (parameters named *router*) as they are")
    p.add_argument("--param-group", nargs=3, action="append", default=[],
                   metavar=("PATTERN", "LR_SCALE", "WEIGHT_DECAY"), help="parameters whose "
                   "names match the glob PATTERN train at LR_SCALE x --lr with WEIGHT_DECAY "
                   "(repeatable; the first match wins)")
    p.add_argument("--projector-only", action="store_true", help="a vision-language "
                   "checkpoint's projector alone on image-caption pairs (--data a JSON-lines "
                   "file of {\"image\": PATH, \"text\": CAPTION}, or LLaVA's JSON list of "
                   "{\"image\", \"conversations\"}): LLaVA's stage 1")
    add_lora_arguments(p)
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
                           seed=args.seed, warmup=min(DEFAULTS["warmup"], args.steps),
                           param_groups=_param_groups(args)))


def _param_groups(args):
    """[[pattern, lr_scale, weight_decay], ...] of --freeze-router and --param-group."""
    rules = [["*router*", 0.0, 0.0]] if args.freeze_router else []
    for pattern, scale, wd in args.param_group:
        try:
            rule = [pattern, float(scale), float(wd)]
        except ValueError:
            raise ValueError(f"--param-group {pattern} {scale} {wd}: LR_SCALE and WEIGHT_DECAY "
                             f"must be numbers") from None
        if not (0 <= rule[1] < float("inf") and 0 <= rule[2] < float("inf")):
            raise ValueError(f"--param-group {pattern}: LR_SCALE and WEIGHT_DECAY must be "
                             f"finite and >= 0, got {scale} and {wd}")
        rules.append(rule)
    return rules or None


def _main(args):
    if args.projector_only and (args.lora is not None or args.preset is not None):
        raise ValueError("--projector-only trains a --hf checkpoint's projector, not --lora "
                         "adapters or a --preset")
    if args.lora is not None or args.preset is not None:
        return lora_main(args, _settings(args))
    if args.merge:
        raise ValueError("--merge goes with --lora")
    if args.projector_only:
        return _projector_only(args)
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
    if args.freeze_router and not any("router" in n for n, _ in model.named_parameters()):
        raise ValueError(f"--freeze-router: {args.hf} ({model.cfg.name}) has no MoE router")
    lm = model.lm if hasattr(model, "image_inputs") else model  # a vision-language model:
    job = Run(lm.cfg, s, lm.dtype, model=lm)                      # its LM on the text
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
    if job.last_stats:
        print(f"routing in the last step: {expert_usage_line(job.last_stats)}")
    save_pretrained(model, out)  # job.model is model (or its LM)
    copied = _copy_side_files(Path(args.hf), out)
    if finished and not args.keep_state:
        shutil.rmtree(state)
    print(_closing(out, copied, state, finished, lm is not model))
    return 0 if finished else 130


def _projector_only(args):
    """finetune --projector-only: train, then save the whole model and the side files."""
    out = Path(args.out)
    model = projector_finetune(args, _settings(args))
    save_pretrained(model, out)
    copied = _copy_side_files(Path(args.hf), out)
    print("\n".join(_closing(out, copied, out / "state", True, True).splitlines()[:2]))
    return 0


def _copy_side_files(src, out):
    """Copy every file of the source checkpoint but its weights and config.json (which
    save_pretrained wrote): tokenizer, chat template, generation config, ... Returns the
    names copied."""
    names = []
    for path in sorted(src.iterdir()):
        if (out / path.name).exists() and (out / path.name).samefile(path):
            continue                                   # fine-tuning in place
        if path.is_file() and path.name != "config.json" and \
                not path.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy(path, out / path.name)
            names.append(path.name)
        elif path.is_dir() and path.name in KEPT_DIRS:
            shutil.copytree(path, out / path.name, dirs_exist_ok=True)
            names.append(path.name + "/")
    return names


def _size(path):
    n = path.stat().st_size if path.is_file() else \
        sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _closing(out, copied, state, finished, images=False):
    """What the run wrote, with sizes (images: a vision-language checkpoint)."""
    written = ["config.json", "model.safetensors"] + copied
    lines = [f"saved {out}: " + ", ".join(f"{n} ({_size(out / n.rstrip('/'))})"
                                          for n in written if (out / n.rstrip("/")).exists()),
             f"  transformers: AutoModelFor{'ImageTextToText' if images else 'CausalLM'}"
             f".from_pretrained({str(out)!r})"]
    if state.exists():
        why = "to continue with --resume" if not finished else "(--keep-state)"
        lines.append(f"  optimizer state kept in {state} ({_size(state)}: weights and AdamW "
                     f"moments) {why}; delete it when done")
    else:
        lines.append("  optimizer state removed (pass --keep-state to keep it for --resume)")
    return "\n".join(lines)
