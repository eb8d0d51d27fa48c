"""Write tests/fixtures/peft/llama_lora/ and gpt2_lora/: LoRA adapters made by peft on the
llama and gpt2 fixtures (tests/fixtures/hf/...), and transformers' logits of the adapted models
(runs alone; needs torch, transformers and peft):

    PYTHONPATH=$PWD python tools/make_peft_fixture.py

peft's LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]) on
llama (nn.Linear), and target_modules=["c_attn", "c_proj"] on gpt2 (transformers' Conv1D: the
fused q|k|v projection and both c_proj; peft sets fan_in_fan_out itself); lora_B starts at
zero in peft, so every lora_A and lora_B is redrawn from a seeded
normal, rounded to float32 (an adapter that changes something, saved exactly). Written:
adapter_config.json and adapter_model.safetensors by peft's save_pretrained, and
expected.npz with ids (B, T) and
the float64 logits of the adapted model (peft's forward; merge_and_unload's agree) and of
the base (base_logits).
Reference: huggingface/peft src/peft/tuners/lora/layer.py (Linear.forward, get_delta_weight),
src/peft/utils/save_and_load.py (the saved names).
"""
import json
from pathlib import Path

import numpy as np
import peft
import torch
import transformers

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
ADAPTERS = {"llama": ["q_proj", "v_proj", "down_proj"], "gpt2": ["c_attn", "c_proj"]}


def main():
    for name, targets in ADAPTERS.items():
        make(FIXTURES / "hf" / name, FIXTURES / "peft" / f"{name}_lora", targets)


def make(BASE, OUT, TARGETS):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=gen)
    with torch.no_grad():
        base_logits = model(ids).logits.numpy()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0,
                             task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                draw = 0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype)
                p.copy_(draw.float().double())  # float32 values: saved without rounding
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits.numpy()
    OUT.mkdir(parents=True, exist_ok=True)
    model.to(torch.float32).save_pretrained(OUT)
    merged = model.to(torch.float64).merge_and_unload()
    with torch.no_grad():
        merged_logits = merged(ids).logits.numpy()
    assert np.abs(merged_logits - logits).max() < 1e-10
    (OUT / "README.md").unlink(missing_ok=True)  # peft's model card template
    cfg = json.loads((OUT / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = str(BASE.relative_to(ROOT))  # not this machine's path
    (OUT / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    np.savez(OUT / "expected.npz", ids=ids.numpy(), logits=logits, base_logits=base_logits)
    print(f"wrote {OUT}: peft {peft.__version__}, transformers {transformers.__version__}")


if __name__ == "__main__":
    main()
