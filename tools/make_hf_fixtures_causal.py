"""Write the fixtures of the newer causal LM families in tests/fixtures/hf/ (runs alone):

    PYTHONPATH=$PWD python tools/make_hf_fixtures_causal.py [family ...]

Per family the files make_hf_fixtures.py writes (its docstring: config.json and
model.safetensors by transformers' save_pretrained in float32, tokenizer.json, expected.npz
with transformers' float64 logits, every parameter's gradient of sum(logits * G), greedy ids,
and the float32 logits of scratchllm's save_pretrained loaded by from_pretrained):
    olmo2      output-only norms, QK-norm over the whole projections, GQA
    rwkv       RWKV-4: 2 blocks of time mix and channel mix (intermediate_size 24),
               blocks.0.pre_ln, rescale_every 0 (transformers' inference halving off)
The Mixture-of-Experts families go through make_hf_fixtures_moe.py's writer and reference
(ids redrawn until every routing decision is clear of a tie; per-expert gradient names):
    qwen3_moe       qwen3 attention (QK-norm per head, head_dim 12), a dense first layer
                    (mlp_only_layers [0]), softmax top-2 of 4 experts with norm_topk_prob
    qwen3_moe_step  decoder_sparse_step 2 (the second layer MoE), norm_topk_prob false
    deepseek_v2       MLA with q_lora_rank, YaRN with mscale != mscale_all_dim, a dense
                      first layer, group_limited_greedy (4 groups -> 2 by their max score),
                      routed_scaling_factor 2.5, one shared expert
    deepseek_v2_lite  plain q_proj, greedy top-2, two shared experts, rms_norm_eps 1e-5
                      (the latent norms keep transformers' 1e-6: mla_norm_eps)
    llama4_text       chunked attention (chunks of 4 < T), a NoPE layer (no_rope_layers
                      [1, 1, 0, 1]: global attention there), L2 QK-norm on the RoPE layers,
                      interleaved dense / MoE layers (step 2), sigmoid top-1 of 4 experts
                      scaling the experts' input, a shared expert, pad_token_id 0 (the
                      embedding's padding_idx); attn_temperature_tuning with floor_scale 2
                      and attn_scale 0.5 (the NoPE layer's queries scaled up to 1.8 by T = 9)
    llama4_text_plain no QK-norm, llama3 RoPE scaling, the default NoPE interval (every 4th
                      layer: layer 3) and chunks of 3, MoE in every layer (top-2 of 4, each
                      expert reading its own gate times x)
    deepseek_v32      deepseek_v3's layers (q_lora_rank, a dense first layer, groups 4 -> 2,
                      a selection bias) with the lightning indexer: 4 heads of 8, top 4 of
                      T = 9 keys; YaRN (its attention factor reaches the indexer's RoPE);
                      the ids redrawn until every indexer choice too is clear of a tie, and
                      the indexer's gradients (None in transformers: no_grad) written as zeros
The state-space families go through make_hf_fixtures_ssm.py's reference:
    mamba2         4 heads of 8, state 8, n_groups 1, chunk_size 4 (< T: the chunked scan)
    mamba2_groups  n_groups 2 (B, C and the gated RMSNorm in two groups), a tied head
Reference: huggingface/transformers src/transformers/models/olmo2/modeling_olmo2.py,
src/transformers/models/gemma2/modeling_gemma2.py,
src/transformers/models/qwen3_moe/modeling_qwen3_moe.py,
src/transformers/models/deepseek_v2/modeling_deepseek_v2.py,
src/transformers/models/llama4/modeling_llama4.py,
src/transformers/models/deepseek_v32/modeling_deepseek_v32.py,
src/transformers/models/mamba2/modeling_mamba2.py,
src/transformers/models/rwkv/modeling_rwkv.py.
"""
import sys
import zlib
from pathlib import Path

import numpy as np
import torch
import transformers

import make_hf_fixtures as dense
import make_hf_fixtures_moe as moe
import make_hf_fixtures_ssm as ssm
from make_hf_fixtures import B, GEOMETRY, OUT, QWEN_SPLIT, T, make_tokenizer, saved_by_scratchllm

DENSE = {
    "olmo2": dict(GEOMETRY, model_type="olmo2", rope_theta=500.0),
    "gemma2": dict(GEOMETRY, model_type="gemma2", head_dim=12, query_pre_attn_scalar=10,
                   sliding_window=4, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                   rope_theta=1000.0),
    "rwkv": dict(model_type="rwkv", hidden_size=16, num_hidden_layers=2, intermediate_size=24,
                 context_length=64, rescale_every=0),
}
_QWEN3_MOE = dict(GEOMETRY, model_type="qwen3_moe", head_dim=12, num_experts=4,
                  num_experts_per_tok=2, moe_intermediate_size=8, rope_theta=1e6)
_DSV2 = dict(model_type="deepseek_v2", hidden_size=16, num_attention_heads=4,
             num_key_value_heads=4, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4,
             v_head_dim=6, intermediate_size=24, moe_intermediate_size=8, n_routed_experts=8,
             num_experts_per_tok=2, rms_norm_eps=1e-6, max_position_embeddings=64)
MOE = {
    "qwen3_moe": dict(_QWEN3_MOE, num_hidden_layers=3, mlp_only_layers=[0],
                      norm_topk_prob=True),
    "qwen3_moe_step": dict(_QWEN3_MOE, num_hidden_layers=2, decoder_sparse_step=2,
                           norm_topk_prob=False),
    "deepseek_v2": dict(_DSV2, num_hidden_layers=3, q_lora_rank=12, first_k_dense_replace=1,
                        topk_method="group_limited_greedy", n_group=4, topk_group=2,
                        n_shared_experts=1, routed_scaling_factor=2.5, rope_parameters=dict(
                            rope_type="yarn", rope_theta=10000.0, factor=4.0,
                            original_max_position_embeddings=16, mscale=1.0,
                            mscale_all_dim=0.5)),
    "deepseek_v2_lite": dict(_DSV2, num_hidden_layers=2, q_lora_rank=None,
                             first_k_dense_replace=0, topk_method="greedy",
                             n_shared_experts=2, routed_scaling_factor=1.5,
                             rms_norm_eps=1e-5),
    "llama4_text": dict(GEOMETRY, model_type="llama4_text", num_hidden_layers=4, head_dim=4,
                        intermediate_size=8, intermediate_size_mlp=24, num_local_experts=4,
                        num_experts_per_tok=1, interleave_moe_layer_step=2,
                        attention_chunk_size=4, no_rope_layers=[1, 1, 0, 1],
                        attn_temperature_tuning=True, floor_scale=2, attn_scale=0.5,
                        pad_token_id=0,
                        rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
    "llama4_text_plain": dict(
        GEOMETRY, model_type="llama4_text", num_hidden_layers=4, head_dim=4,
        intermediate_size=8, intermediate_size_mlp=24, num_local_experts=4,
        num_experts_per_tok=2, attention_chunk_size=3, use_qk_norm=False,
        attn_temperature_tuning=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                             low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=16)),
    "deepseek_v32": dict(_DSV2, model_type="deepseek_v32", num_hidden_layers=2, q_lora_rank=12,
                         first_k_dense_replace=1, n_group=4, topk_group=2, n_shared_experts=1,
                         norm_topk_prob=True, routed_scaling_factor=2.5, index_topk=4,
                         index_head_dim=8, index_n_heads=4, rope_parameters=dict(
                             rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=16, mscale=1.0,
                             mscale_all_dim=0.5)),
}


def routing(router, logits):
    """make_hf_fixtures_moe.routing, and DeepSeek-V2's router (modeling_deepseek_v2.py
    DeepseekV2TopkRouter): softmax scores; with group_limited_greedy the topk_group groups
    of highest max score, then the top-k inside them."""
    if type(router).__name__ != "DeepseekV2TopkRouter":
        return _moe_routing(router, logits)
    s = logits.detach().numpy().reshape(-1, logits.shape[-1])  # (BT, E)
    q = np.exp(s - s.max(-1, keepdims=True))
    q /= q.sum(-1, keepdims=True)
    k, E = router.top_k, router.num_experts
    margin = np.full(len(q), np.inf)
    if router.topk_method == "group_limited_greedy":
        n, tg = router.num_group, router.topk_group
        groups = q.reshape(len(q), n, E // n).max(-1)  # (BT, n)
        margin = moe._margin(groups, tg)
        keep = np.zeros((len(q), n), bool)
        np.put_along_axis(keep, np.argsort(-groups, axis=-1)[:, :tg], True, axis=-1)
        q = np.where(np.repeat(keep, E // n, axis=1), q, -np.inf)
    margin = np.minimum(margin, moe._margin(q, k))
    return float(margin.min()), set(np.argsort(-q, axis=-1)[:, :k].ravel().tolist())


_moe_routing, moe.routing = moe.routing, routing  # RoutingLog's hooks call moe.routing
_load_float64 = dense.load_float64


def load_float64(directory):
    """make_hf_fixtures.load_float64; RWKV's forward without its state (use_cache false: the
    state's in-place updates would break autograd; generate still decodes with the state)."""
    model = _load_float64(directory)
    if model.config.model_type == "rwkv":
        model.config.use_cache = False
    return model


dense.load_float64 = load_float64  # make_hf_fixtures.reference loads by this name


def llama4_routing(router, logits):
    """Llama 4's router (modeling_llama4.py Llama4Router): the top-k of the logits."""
    s = logits.detach().numpy().reshape(-1, logits.shape[-1])  # (BT, E)
    return (float(moe._margin(s, router.top_k).min()),
            set(np.argsort(-s, axis=-1)[:, :router.top_k].ravel().tolist()))


class RoutingLog(moe.RoutingLog):
    """make_hf_fixtures_moe.RoutingLog, and Llama 4's routers (their forward returns
    (scores, logits): the decisions are read from the logits)."""

    def __init__(self, model):
        super().__init__(model)
        llama4 = [m for m in model.modules() if type(m).__name__ == "Llama4Router"]
        for i, r in enumerate(llama4, len(self.routers)):
            r.register_forward_hook(lambda mod, inp, out, i=i: self.calls.append(
                (i, *llama4_routing(mod, out[1]))))
        self.routers += llama4


moe.RoutingLog = RoutingLog  # moe.reference builds its log by this name


def index_margin(scores, k):
    """The smallest gap, over the rows of a DeepSeek-V3.2 indexer's scores (B, S, T), between
    the k-th and (k+1)-th largest unmasked score (inf where a row has <= k of them)."""
    s = scores.detach().numpy().reshape(-1, scores.shape[-1])
    valid = s > -1e300  # the causal mask adds finfo.min (or -inf)
    margins = [np.inf if v.sum() <= k else -np.diff(np.sort(r[v])[::-1][k - 1:k + 1])[0]
               for r, v in zip(s, valid)]
    return float(min(margins))


def log_indexers(model, calls):
    """Record in `calls` (as RoutingLog does, router -1, no experts) the margin of every top-k
    choice of the model's DeepseekV32Indexer modules: their forward runs unchanged, with
    Tensor.topk watched while it runs."""
    for m in model.modules():
        if type(m).__name__ != "DeepseekV32Indexer":
            continue

        def forward(*args, _inner=m.forward, **kwargs):
            topk = torch.Tensor.topk

            def watched(t, k, *a, **kw):
                calls.append((-1, index_margin(t, k), set()))
                return topk(t, k, *a, **kw)
            torch.Tensor.topk = watched
            try:
                return _inner(*args, **kwargs)
            finally:
                torch.Tensor.topk = topk
        m.forward = forward


class IndexedRoutingLog(RoutingLog):
    """RoutingLog, and the indexers' choices."""

    def __init__(self, model):
        super().__init__(model)
        log_indexers(model, self.calls)


moe.RoutingLog = IndexedRoutingLog
_checkpoint_grads = moe.checkpoint_grads


def checkpoint_grads(model):
    """make_hf_fixtures_moe.checkpoint_grads, a parameter without a gradient (DeepSeek-V3.2's
    indexer, run under no_grad) given zeros."""
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return _checkpoint_grads(model)


moe.checkpoint_grads = checkpoint_grads


SSM = {  # the state-space families: make_hf_fixtures_ssm.py's reference
    "mamba2": dict(model_type="mamba2", hidden_size=16, num_hidden_layers=2, num_heads=4,
                   head_dim=8, expand=2, state_size=8, n_groups=1, conv_kernel=4,
                   chunk_size=4, layer_norm_epsilon=1e-5, tie_word_embeddings=False),
    "mamba2_groups": dict(model_type="mamba2", hidden_size=16, num_hidden_layers=2,
                          num_heads=4, head_dim=8, expand=2, state_size=8, n_groups=2,
                          conv_kernel=4, chunk_size=4, layer_norm_epsilon=1e-5,
                          tie_word_embeddings=True),
}


def randomize_mamba2(model, seed):
    """make_hf_fixtures.randomize, then A_log = log(1..H) + N(0, 0.2^2), dt_bias
    N(-1, 0.5^2) (Δ ~ 0.3) and D 1 + N(0, 0.3^2), as make_hf_fixtures_ssm.py draws Mamba's."""
    dense.randomize(model, seed)
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.arange(1, p.shape[0] + 1.0)) + 0.2 * noise)
            elif name.endswith("dt_bias"):
                p.copy_(-1 + 0.5 * noise)
            elif name.endswith(".D"):
                p.copy_(1 + 0.3 * noise)


def write_ssm(family, fields, tok):
    """A state-space checkpoint and its expected.npz (ids never pad_token_id 1, nor 0)."""
    d = OUT / family
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    V = tok.get_vocab_size()
    cfg = transformers.AutoConfig.for_model(**{**fields, "vocab_size": V})
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_mamba2(model, len(family))
    model.save_pretrained(d)
    ids = np.random.default_rng(zlib.crc32(family.encode())).integers(2, V, (B, T))
    expected = ssm.reference(d, ids)
    expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected)
    print(f"{family}: {sorted(p.name for p in Path(d).iterdir())}")


def main(names=()):
    tok = make_tokenizer(QWEN_SPLIT)
    V = tok.get_vocab_size()
    for family, fields in {**DENSE, **MOE}.items():
        if names and family not in names:
            continue
        maker = moe if family in MOE else dense
        d = OUT / family
        d.mkdir(parents=True, exist_ok=True)
        tok.save(str(d / "tokenizer.json"))
        maker.write_checkpoint(d, fields, V, seed=len(family))
        rng = np.random.default_rng(zlib.crc32(family.encode()))  # the ids: own seed each
        expected = maker.reference(d, rng, V)
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(d, expected)
        np.savez_compressed(d / "expected.npz", **expected)
        print(f"{family}: {sorted(p.name for p in Path(d).iterdir())}")
    for family, fields in SSM.items():
        if not names or family in names:
            write_ssm(family, fields, tok)


if __name__ == "__main__":
    main(sys.argv[1:])
