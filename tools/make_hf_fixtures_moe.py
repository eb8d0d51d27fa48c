"""Write the Mixture-of-Experts fixtures of tests/fixtures/hf/ (make_hf_fixtures.py calls this;
it also runs alone):

    PYTHONPATH=$PWD python tools/make_hf_fixtures_moe.py

Per checkpoint (mixtral with a sliding window shorter than the test sequences; deepseek_v3
with q_lora_rank, YaRN with mscale != mscale_all_dim, rope_interleave, a dense first layer,
group-limited routing and a random e_score_correction_bias; deepseek_v3_plain with a plain
q_proj, rotate-half RoPE, norm_topk_prob false and two shared experts) the same files as
make_hf_fixtures.py writes (its docstring), with two differences:
  * the ids are drawn again until every routing decision that transformers makes (the
    forward on ids and every step of the greedy generation) is at least MARGIN from a tie
    (top-k of the selection scores; for DeepSeek-V3 also the top-topk_group group choice),
    and every expert of every MoE layer receives a token, so every gradient is nonzero;
  * transformers 5 holds the experts fused in memory (experts.gate_up_proj ...): the
    gradients are converted to the checkpoint's per-expert names and layouts with the same
    revert_weight_conversion that its save_pretrained applies to the weights (checked here
    on the weights against the file it wrote).
Plus moe/ and mla/: scratchllm's `moe` and `mla` presets (tiny) written by
scratchllm.hub.save_pretrained, loaded by transformers' from_pretrained, with transformers'
float64 logits and the preset's fields (mla with norm_eps 1e-6: deepseek_v3's latent norms
keep eps 1e-6; and random selection biases, saved as e_score_correction_bias).
Reference: huggingface/transformers src/transformers/models/mixtral/modeling_mixtral.py,
src/transformers/models/deepseek_v3/modeling_deepseek_v3.py.
"""
import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.core_model_loading import revert_weight_conversion
from safetensors.torch import load_file

from make_hf_fixtures import (B, G_SEED, GEOMETRY, N_NEW, OUT, P, QWEN_SPLIT, ROOT, T,
                              float64_everywhere, make_tokenizer, randomize,
                              saved_by_scratchllm)

MARGIN = 1e-4  # routing decisions at least this far from a tie
_DSV3 = dict(model_type="deepseek_v3", hidden_size=16, num_attention_heads=4,
             num_key_value_heads=4, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
             v_head_dim=6, intermediate_size=24, moe_intermediate_size=8, n_routed_experts=8,
             num_experts_per_tok=2, rms_norm_eps=1e-6, max_position_embeddings=64)
FAMILIES = {
    "mixtral": dict(GEOMETRY, model_type="mixtral", num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=4),
    "deepseek_v3": dict(_DSV3, num_hidden_layers=3, q_lora_rank=12, first_k_dense_replace=1,
                        n_group=4, topk_group=2, n_shared_experts=1, norm_topk_prob=True,
                        routed_scaling_factor=2.5, rope_interleave=True, rope_parameters=dict(
                            rope_type="yarn", rope_theta=10000.0, factor=4.0,
                            original_max_position_embeddings=16, mscale=1.0,
                            mscale_all_dim=0.5)),
    "deepseek_v3_plain": dict(_DSV3, num_hidden_layers=2, q_lora_rank=None,
                              first_k_dense_replace=0, n_group=1, topk_group=1,
                              n_shared_experts=2, norm_topk_prob=False,
                              routed_scaling_factor=1.5, rope_interleave=False),
}
PRESETS = {"moe": dict(n_experts=4, top_k=2), "mla": dict(
    n_experts=4, top_k=2, norm_eps=1e-6, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4,
    qk_rope_head_dim=4, v_head_dim=6)}


def randomize_moe(model, seed):
    """make_hf_fixtures.randomize, then the fused expert tensors (E, out, in) N(0, 1/in) and
    DeepSeek-V3's selection bias N(0, 0.1^2) (a buffer, which randomize leaves at zero)."""
    randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 3:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * p.shape[2] ** -0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=torch.float64))


def _margin(values, k):
    """Per row, the k-th minus the (k+1)-th largest value (inf when k is the row length)."""
    if k == values.shape[-1]:
        return np.full(values.shape[0], np.inf)
    part = -np.sort(-values, axis=-1)
    return part[:, k - 1] - part[:, k]


def routing(router, logits):
    """(smallest margin of the rows' decisions, experts chosen) of one router call, redone
    in NumPy from its logits as transformers decides (modeling_mixtral.py MixtralTopKRouter,
    modeling_deepseek_v3.py DeepseekV3TopkRouter)."""
    s = logits.detach().numpy().reshape(-1, logits.shape[-1])  # (BT, E)
    k, E = router.top_k, router.num_experts
    if not hasattr(router, "e_score_correction_bias"):  # Mixtral: top-k of softmax(s)
        sel = np.exp(s - s.max(-1, keepdims=True))
        sel /= sel.sum(-1, keepdims=True)
        margin = _margin(sel, k)
    else:  # DeepSeek-V3: sigmoid + bias, best topk_group groups by their top-2 sums
        sel = 1 / (1 + np.exp(-s)) + router.e_score_correction_bias.detach().numpy()
        n, tg = router.num_group, router.topk_group
        groups = -np.sort(-sel.reshape(len(sel), n, E // n), axis=-1)[..., :2].sum(-1)
        margin = _margin(groups, tg) if n > 1 else np.full(len(sel), np.inf)
        keep = np.argsort(-groups, axis=-1)[:, :tg]  # (BT, tg)
        mask = np.zeros((len(sel), n), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        sel = np.where(np.repeat(mask, E // n, axis=1), sel, -np.inf)
        margin = np.minimum(margin, _margin(sel, k))
    return float(margin.min()), set(np.argsort(-sel, axis=-1)[:, :k].ravel().tolist())


class RoutingLog:
    """Forward hooks on every router of a transformers model: each call's margin and experts."""

    def __init__(self, model):
        self.calls = []
        self.routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")
                        or type(m).__name__.endswith("TopkRouter")]
        for i, r in enumerate(self.routers):
            r.register_forward_hook(lambda mod, inp, out, i=i: self.calls.append(
                (i, *routing(mod, out[0]))))

    def ok(self, every_expert):
        if min(m for _, m, _ in self.calls) < MARGIN:
            return False
        hit = [set().union(*(e for i, _, e in self.calls if i == j))
               for j in range(len(self.routers))]
        return not every_expert or all(len(h) == r.num_experts
                                       for h, r in zip(hit, self.routers))


def checkpoint_grads(model):
    """{checkpoint name: gradient} via transformers' own save-time conversion (fused experts
    -> one tensor per expert, Mixtral's mlp -> block_sparse_moe)."""
    grads = {n: p.grad for n, p in model.named_parameters()}
    return {n: g.numpy() for n, g in revert_weight_conversion(model, grads).items()}


def load_float64(directory):
    """The checkpoint as a float64 transformers model built inside float64_everywhere, its
    weights those of from_pretrained (float32, which fuses the experts as transformers 5
    holds them; make_hf_fixtures.load_float64 reads the file's names directly)."""
    hf32 = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with float64_everywhere():
        model = transformers.AutoModelForCausalLM.from_config(
            hf32.config, dtype=torch.float64, attn_implementation="eager",
            experts_implementation="eager")  # the loop over experts of modeling_*.py
    missing, unexpected = model.load_state_dict(
        {k: v.double() for k, v in hf32.state_dict().items()}, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return model.eval()


def reference(directory, rng, V):
    """logits, checkpoint-named grads of sum(logits * G), greedy ids, with routing margins:
    transformers in float64, eager attention; ids redrawn until the routing is clear."""
    model = load_float64(directory)
    saved = load_file(Path(directory) / "model.safetensors")
    reverted = revert_weight_conversion(model, dict(model.state_dict()))
    assert sorted(reverted) == sorted(saved), sorted(set(reverted) ^ set(saved))
    assert all(torch.equal(reverted[n].float(), saved[n]) for n in saved)
    log = RoutingLog(model)
    for _ in range(200):
        log.calls.clear()
        with float64_everywhere():
            ids = rng.integers(0, V, (B, T))
            G = np.random.default_rng(G_SEED).standard_normal((B, T, V))
            model.zero_grad()
            logits = model(torch.tensor(ids)).logits
            if not log.ok(every_expert=True):
                continue
            (logits * torch.tensor(G)).sum().backward()
            with torch.no_grad():
                out = model.generate(torch.tensor(ids[:1, :P]), max_new_tokens=N_NEW,
                                     do_sample=False, min_new_tokens=N_NEW)
        if log.ok(every_expert=False):
            return dict(ids=ids, logits=logits.detach().numpy(), G_seed=G_SEED,
                        greedy=out[0, P:].numpy(), routing_margin=min(
                            m for _, m, _ in log.calls),
                        **{f"grad/{n}": g for n, g in checkpoint_grads(model).items()})
    raise RuntimeError(f"{directory}: no ids with routing margins >= {MARGIN} in 200 draws")


def write_checkpoint(directory, fields, vocab_size, seed):
    """transformers' save_pretrained of a random tiny MoE model (float32)."""
    cfg = transformers.AutoConfig.for_model(**{**fields, "vocab_size": vocab_size})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_moe(model, seed)
    model.save_pretrained(directory)


def preset_model(name, V):
    """The tiny `moe` / `mla` preset LM of the fixture (seed 0) and its preset fields (the test
    rebuilds it from them); mla's selection biases N(0, 0.1^2) from default_rng(2), a row
    per layer, as if trained with bias_gamma > 0."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.lm import LM, preset
    fields = dict(vocab_size=V, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=16,
                  **PRESETS[name])
    model = LM(preset(name, **fields), rng=np.random.default_rng(0))
    if name == "mla":
        bias = 0.1 * np.random.default_rng(2).standard_normal((2, fields["n_experts"]))
        for layer, b in zip(model.layers, bias):  # (E,) each; both layers are MoE layers
            layer.ffn.selection_bias[...] = b
    return model, fields


def preset_roundtrip(name, directory, V):
    """scratchllm's `moe` / `mla` preset, saved by scratchllm.hub, loaded by transformers'
    from_pretrained (no missing or unexpected tensors): its float64 logits, and the float32
    from_pretrained logits' largest relative difference from them."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import save_pretrained
    model, fields = preset_model(name, V)
    save_pretrained(model, directory)
    ids = np.random.default_rng(1).integers(0, V, (B, T))
    hf32, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not any(info.values()), info
    model = load_float64(directory)
    log = RoutingLog(model)
    with float64_everywhere(), torch.no_grad():
        logits = model(torch.tensor(ids)).logits.numpy()
    with torch.no_grad():
        logits32 = hf32(torch.tensor(ids)).logits.numpy()
    err32 = float(np.abs(logits32 - logits).max() / np.abs(logits).max())
    assert err32 < 1e-5 and log.ok(every_expert=False), (err32, log.calls)
    np.savez_compressed(Path(directory) / "expected.npz", ids=ids, logits=logits,
                        from_pretrained_float32_rel_err=err32, preset=json.dumps(fields))


def main(tok=None):
    rng = np.random.default_rng(13)
    tok = tok or make_tokenizer(QWEN_SPLIT)
    V = tok.get_vocab_size()
    for family, fields in FAMILIES.items():
        d = OUT / family
        d.mkdir(parents=True, exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        write_checkpoint(d, fields, V, seed=len(family))
        expected = reference(d, rng, V)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{family}: margin {expected['routing_margin']:.2e}, "
              f"{sorted(p.name for p in d.iterdir())}")
    for name in PRESETS:
        preset_roundtrip(name, OUT / name, V)
        print(f"{name}: saved by scratchllm, loaded by transformers")


if __name__ == "__main__":
    main()
