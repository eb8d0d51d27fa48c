"""Write the state-space fixtures of tests/fixtures/hf/: tiny random Mamba-1 and Jamba
checkpoints and what transformers computes with them (make_hf_fixtures.py runs this too).

    pip install ".[ref]"
    PYTHONPATH=$PWD python tools/make_hf_fixtures_ssm.py

mamba/ and jamba/ hold what make_hf_fixtures.py's families hold (config.json and
model.safetensors from transformers' save_pretrained, tokenizer.json, expected.npz with ids,
logits, G_seed, grad/<HF name>, greedy, saved_by_scratchllm_rel_err), computed on
transformers' pure-torch Mamba path (no mamba-ssm / causal-conv1d kernels installed; the
script checks). expected.npz also records min_router_margin: over every token the routers saw
(the forward and the greedy generation), the smallest gap between the k-th and (k+1)-th
routing probability, drawn away from top-k ties (the seed is advanced until it is > 1e-3).
Jamba's ids avoid pad_token_id 0: torch's nn.Embedding(padding_idx=0) leaves that row's
gradient zero, which the library does not do.
jamba's in-memory experts are fused 3-D tensors (JambaExperts.gate_up_proj (E, 2F, D) and
down_proj (E, D, F)); its save_pretrained writes one tensor per expert
(experts.e.{gate,up,down}_proj.weight), and so do the gradients here.
hybrid_jamba/: scratchllm's `hybrid` preset (tiny, with the three options a Jamba checkpoint
needs) written by scratchllm.hub.save_pretrained; expected.npz holds the float64 logits
transformers computes after from_pretrained, and from_pretrained_float32_rel_err.
Reference: huggingface/transformers src/transformers/models/mamba/modeling_mamba.py,
src/transformers/models/jamba/modeling_jamba.py.
"""
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors import safe_open
from transformers.models.jamba import modeling_jamba

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_fixtures import (B, G_SEED, N_NEW, OUT, P, QWEN_SPLIT, ROOT, T,  # noqa: E402
                              float64_everywhere, make_tokenizer, saved_by_scratchllm)

MAMBA = dict(model_type="mamba", hidden_size=16, num_hidden_layers=2, state_size=4, expand=2,
             conv_kernel=4, time_step_rank=3, layer_norm_epsilon=1e-5)
JAMBA = dict(model_type="jamba", hidden_size=16, num_hidden_layers=5, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=24, num_experts=4, num_experts_per_tok=2,
             attn_layer_period=2, attn_layer_offset=0,  # attention at 0, 2, 4
             expert_layer_period=3, expert_layer_offset=1,  # MoE at 1 (Mamba), 4 (attention)
             mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=3, rms_norm_eps=1e-5)
HYBRID = dict(d_model=16, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=24, n_experts=4, top_k=2,
              d_state=4, dt_rank=3, positions="nope", mamba_inner_norms=True,
              norm_topk_prob=False)  # the three options a Jamba checkpoint needs
MIN_MARGIN = 1e-3


def randomize(model, seed):
    """Weights that make every path matter: matrices N(0, 1/fan_in) (routers x 3, for
    decisive routing), A_log = log(1..N) + N(0, 0.2^2), dt_proj.bias N(-1, 0.5^2) (Δ ~ 0.3),
    D 1 + N(0, 0.3^2), norm gains 1 + N(0, 0.1^2), other biases N(0, 0.1^2), embeddings N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("A_log"):
                value = torch.log(torch.arange(1, p.shape[1] + 1.0)) + 0.2 * noise
            elif name.endswith("dt_proj.bias"):
                value = -1 + 0.5 * noise
            elif name.endswith(".D"):
                value = 1 + 0.3 * noise
            elif "embed" in name:
                value = noise
            elif p.ndim >= 2:
                value = noise * p.shape[-1] ** -0.5 * (3 if "router" in name else 1)
            elif "norm" in name:
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


def load_float64(directory):
    """The checkpoint as a float64 model built inside float64_everywhere, its weights those
    of from_pretrained (which turns the per-expert tensors into JambaExperts' fused ones)."""
    cfg = transformers.AutoConfig.from_pretrained(directory)
    state = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32).state_dict()
    with float64_everywhere():
        model = transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.float64, attn_implementation="eager",
            experts_implementation="eager")  # the loop over experts: grouped_mm has no float64
    model.load_state_dict({k: v.double() for k, v in state.items()})
    return model.eval()


def checkpoint_names(grads):
    """{checkpoint name: gradient}: fused experts split into one tensor per expert."""
    out = {}
    for name, g in grads.items():
        fused = re.fullmatch(r"(.*\.experts)\.(gate_up_proj|down_proj)", name)
        if fused is None:
            out[name] = g
            continue
        prefix, kind = fused.groups()
        for e in range(g.shape[0]):
            if kind == "down_proj":
                out[f"{prefix}.{e}.down_proj.weight"] = g[e]
            else:
                F = g.shape[1] // 2
                out[f"{prefix}.{e}.gate_proj.weight"] = g[e, :F]
                out[f"{prefix}.{e}.up_proj.weight"] = g[e, F:]
    return out


def router_margins(model):
    """A list that every JambaTopKRouter call appends its smallest top-k probability gap to."""
    margins = []

    def hook(module, args, out):
        probs = torch.softmax(out[0].detach(), dim=-1)  # (tokens, E)
        top = torch.topk(probs, module.top_k + 1, dim=-1).values
        margins.append(float((top[:, -2] - top[:, -1]).min()))
    for m in model.modules():
        if isinstance(m, modeling_jamba.JambaTopKRouter):
            m.register_forward_hook(hook)
    return margins


def reference(directory, ids):
    """logits, grads of sum(logits * G) in checkpoint names, greedy ids, router margin."""
    model = load_float64(directory)
    margins = router_margins(model)
    V = model.config.vocab_size
    with float64_everywhere():
        G = np.random.default_rng(G_SEED).standard_normal((B, T, V))
        logits = model(torch.tensor(ids)).logits
        (logits * torch.tensor(G)).sum().backward()
        grads = checkpoint_names({n: p.grad.numpy() for n, p in model.named_parameters()})
        with torch.no_grad():
            out = model.generate(torch.tensor(ids[:1, :P]), max_new_tokens=N_NEW,
                                 do_sample=False, min_new_tokens=N_NEW)
    with safe_open(Path(directory) / "model.safetensors", "np") as f:
        stored = set(f.keys()) - ({"lm_head.weight"} if model.config.tie_word_embeddings
                                  else set())
    assert set(grads) == stored, set(grads) ^ stored  # a gradient for every tensor saved
    return dict(ids=ids, logits=logits.detach().numpy(), G_seed=G_SEED,
                greedy=out[0, P:].numpy(), min_router_margin=min(margins, default=np.inf),
                **{f"grad/{n}": g for n, g in grads.items()})


def write_family(name, fields, tok, seed):
    """Checkpoint + expected.npz, the seed advanced until routing is away from ties."""
    d = OUT / name
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    V = tok.get_vocab_size()
    cfg = transformers.AutoConfig.for_model(**{**fields, "vocab_size": V})
    while True:
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        randomize(model, seed)
        model.save_pretrained(d)
        ids = np.random.default_rng(seed).integers(1, V, (B, T))  # never pad_token_id 0
        expected = reference(d, ids)
        if expected["min_router_margin"] > MIN_MARGIN:
            break
        seed += 1
    expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected)
    print(f"{name}: seed {seed}, margin {expected['min_router_margin']:.3g}, "
          f"{sorted(p.name for p in d.iterdir())}")


def hybrid_roundtrip(directory, V):
    """scratchllm's hybrid preset saved by scratchllm.hub, loaded by transformers: logits."""
    from scratchllm.hub import save_pretrained
    from scratchllm.lm import LM, preset
    save_pretrained(LM(preset("hybrid", vocab_size=V, **HYBRID), rng=np.random.default_rng(0)),
                    directory)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    hf32, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or mismatched tensors
    model = load_float64(directory)
    margins = router_margins(model)
    with float64_everywhere(), torch.no_grad():
        logits = model(torch.tensor(ids)).logits.numpy()
    assert min(margins) > 1e-6, margins
    with torch.no_grad():
        logits32 = hf32(torch.tensor(ids)).logits.numpy()
    err32 = float(np.abs(logits32 - logits).max() / np.abs(logits).max())
    assert err32 < 1e-5, err32
    np.savez_compressed(Path(directory) / "expected.npz", ids=ids, logits=logits,
                        from_pretrained_float32_rel_err=err32, min_router_margin=min(margins))
    print(f"hybrid_jamba: margin {min(margins):.3g}, float32 rel err {err32:.2g}")


def main():
    sys.path.insert(0, str(ROOT))
    for kernels in ("mamba_ssm", "causal_conv1d"):  # the pure-torch path, not the kernels
        assert importlib.util.find_spec(kernels) is None, kernels
    tok = make_tokenizer(QWEN_SPLIT)
    write_family("mamba", MAMBA, tok, seed=5)
    write_family("jamba", JAMBA, tok, seed=7)
    hybrid_roundtrip(OUT / "hybrid_jamba", tok.get_vocab_size())


if __name__ == "__main__":
    main()
