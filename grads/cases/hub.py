"""Gradient-check cases of the Hugging Face families the hub reads: for each, a tiny
config.json dict (the geometry and options of the family's test checkpoint in
tests/fixtures/hf, which tests/hub compares with transformers) turned into an LM by the hub's
own config mapping, with random weights drawn from a seed of the family's own; then
d loss / d every Param in float64 by finite differences. No file is read."""
import zlib

import numpy as np

from grads.cases._common import case, module_loss_pair
from grads.check import check

_GEOMETRY = dict(vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=24, rms_norm_eps=1e-5,
                 max_position_embeddings=64)
_DSV3 = dict(_GEOMETRY, model_type="deepseek_v3", num_key_value_heads=4, kv_lora_rank=8,
             qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, moe_intermediate_size=8,
             n_routed_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6)
HF_CONFIGS = {  # family label -> config.json fields
    "llama": dict(_GEOMETRY, model_type="llama", rope_parameters=dict(
        rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=16)),
    "llama_yarn": dict(_GEOMETRY, model_type="llama", rope_parameters=dict(
        rope_type="yarn", rope_theta=500.0, factor=4.0, original_max_position_embeddings=16)),
    "llama_linear": dict(_GEOMETRY, model_type="llama", rope_parameters=dict(
        rope_type="linear", rope_theta=10000.0, factor=2.0)),
    "llama_dynamic": dict(_GEOMETRY, model_type="llama", max_position_embeddings=8,
                          rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0,
                                               factor=2.0)),
    "mistral": dict(_GEOMETRY, model_type="mistral", sliding_window=4, head_dim=8),
    "qwen2": dict(_GEOMETRY, model_type="qwen2", tie_word_embeddings=True, rope_theta=1e6),
    "qwen3": dict(_GEOMETRY, model_type="qwen3", head_dim=12, tie_word_embeddings=True),
    "gemma3": dict(_GEOMETRY, model_type="gemma3_text", head_dim=12, query_pre_attn_scalar=10,
                   sliding_window=4, tie_word_embeddings=True,
                   layer_types=["sliding_attention", "full_attention"],
                   rope_parameters={"sliding_attention": dict(rope_type="default",
                                                              rope_theta=100.0),
                                    "full_attention": dict(rope_type="linear", factor=2.0,
                                                           rope_theta=10000.0)}),
    "gpt2": dict(model_type="gpt2", vocab_size=300, n_embd=16, n_layer=2, n_head=4,
                 n_positions=64, n_inner=24, activation_function="gelu_new",
                 layer_norm_epsilon=1e-5),
    "mamba": dict(model_type="mamba", vocab_size=300, hidden_size=16, num_hidden_layers=2,
                  state_size=4, expand=2, conv_kernel=4, time_step_rank=3,
                  layer_norm_epsilon=1e-5),
    "jamba": dict(_GEOMETRY, model_type="jamba", num_hidden_layers=5, num_experts=4,
                  num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=0,  # attention
                  expert_layer_period=3, expert_layer_offset=1,  # at 0, 2, 4; MoE at 1, 4
                  mamba_d_state=4, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=3),
    "mixtral": dict(_GEOMETRY, model_type="mixtral", num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=4, rope_theta=1e6),
    "deepseek_v3": dict(_DSV3, num_hidden_layers=3, q_lora_rank=12, first_k_dense_replace=1,
                        n_group=4, topk_group=2, n_shared_experts=1, norm_topk_prob=True,
                        routed_scaling_factor=2.5, rope_interleave=True, rope_parameters=dict(
                            rope_type="yarn", rope_theta=10000.0, factor=4.0,
                            original_max_position_embeddings=16, mscale=1.0,
                            mscale_all_dim=0.5)),
    "deepseek_v3_plain": dict(_DSV3, q_lora_rank=None, first_k_dense_replace=0, n_group=1,
                              topk_group=1, n_shared_experts=2, norm_topk_prob=False,
                              routed_scaling_factor=1.5, rope_interleave=False),
    "gpt_oss": dict(_GEOMETRY, model_type="gpt_oss", head_dim=8, num_local_experts=4,
                    num_experts_per_tok=2, sliding_window=4, swiglu_limit=1.2,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters=dict(rope_type="yarn", factor=4.0, beta_fast=32.0,
                                         beta_slow=1.0, truncate=False, rope_theta=500.0,
                                         original_max_position_embeddings=16)),
}
HF_CONFIGS["olmo2"] = dict(_GEOMETRY, model_type="olmo2", rope_theta=500.0)
HF_CONFIGS["qwen3_moe"] = dict(_GEOMETRY, model_type="qwen3_moe", head_dim=12,
                               num_local_experts=4, num_experts_per_tok=2,
                               moe_intermediate_size=8, num_hidden_layers=3,
                               mlp_only_layers=[0], norm_topk_prob=True)
HF_CONFIGS["gemma2"] = dict(_GEOMETRY, model_type="gemma2", head_dim=12,
                            query_pre_attn_scalar=10, sliding_window=4,
                            attn_logit_softcapping=2.0, final_logit_softcapping=3.0)
HF_CONFIGS["llama4_text"] = dict(  # chunks of 3, layer 1 NoPE, L2 QK-norm, MoE at 1 and 2
    _GEOMETRY, model_type="llama4_text", num_hidden_layers=3, head_dim=4, intermediate_size=8,
    intermediate_size_mlp=24, num_local_experts=4, num_experts_per_tok=1, moe_layers=[1, 2],
    attention_chunk_size=3, no_rope_layers=[1, 0, 1], attn_temperature_tuning=True,
    floor_scale=2, attn_scale=0.5)
HF_CONFIGS["deepseek_v32"] = dict(  # deepseek_v3 with the indexer: top 3 of the 7 keys
    _DSV3, model_type="deepseek_v32", num_hidden_layers=2, q_lora_rank=12,
    first_k_dense_replace=1, n_group=4, topk_group=2, n_shared_experts=1, index_topk=3,
    index_head_dim=8, index_n_heads=2)
HF_CONFIGS["rwkv"] = dict(model_type="rwkv", vocab_size=300, hidden_size=16,  # RWKV-4, halved
                          num_hidden_layers=2, intermediate_size=24, rescale_every=1)
HF_CONFIGS["bert"] = dict(model_type="bert", vocab_size=50, hidden_size=16, num_hidden_layers=2,
                          num_attention_heads=4, intermediate_size=24, type_vocab_size=2,
                          max_position_embeddings=64)
HF_CONFIGS["deepseek_v2"] = dict(
    _DSV3, model_type="deepseek_v2", num_hidden_layers=3, q_lora_rank=12,
    first_k_dense_replace=1, topk_method="group_limited_greedy", n_group=4, topk_group=2,
    n_shared_experts=1, routed_scaling_factor=2.5, rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=16,
        mscale=1.0, mscale_all_dim=0.5))
# qwen3_next: a gated DeltaNet layer (2 key heads of 16, 4 value heads) and a gated attention
# layer, dense FFNs (its MoE is qwen3_moe's with the shared gate, checked against transformers'
# gradients in tests/hub; here it cost 7 s). Key heads of 16: the l2 norms of q and k curve
# sharply at short heads, and with 4 or 8 the differences at h = 1e-5 were off by up to
# 1.3e-6 on some seeds (falling as h^2: truncation, not a wrong gradient); with 16, below
# 2e-8 on 6 seeds.
HF_CONFIGS["qwen3_next"] = dict(
    _GEOMETRY, model_type="qwen3_next", head_dim=8,
    layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=6, num_experts=0,
    rope_parameters=dict(rope_type="default", rope_theta=1000.0, partial_rotary_factor=0.5))
HF_CONFIGS["mamba2"] = dict(model_type="mamba2", vocab_size=300, hidden_size=16,
                            num_hidden_layers=2, num_heads=4, head_dim=8, expand=2,
                            state_size=8, n_groups=1, conv_kernel=4, layer_norm_epsilon=1e-5)
HF_FIXTURES = tuple(f for f in HF_CONFIGS if f != "gpt_oss")  # the families lm_hub checks


def hub_model(family, rng):
    """The float64 model (the record's model_class) of HF_CONFIGS[family] (through its record
    in the hub's registry), its weights drawn from rng so that every path matters: matrices N(0, 1/fan_in) (routers x 3,
    for decisive routing), embeddings and sink logits N(0, 1), norm gains 1 + N(0, 0.1^2),
    other vectors N(0, 0.1^2); Mamba's A_log = log(1..N) + N(0, 0.2^2), b_dt N(-1, 0.5^2)
    (Δ ~ 0.3), D 1 + N(0, 0.3^2), conv_w N(0, 1/kernel); the buffers the family saves
    (DeepSeek-V3's selection bias) N(0, 0.1^2)."""
    from scratchllm.hub import config_from_flat, family_named, flat_of
    record = family_named(HF_CONFIGS[family]["model_type"])
    cfg = config_from_flat(record.from_hf(HF_CONFIGS[family]))
    model = record.model_class(cfg, rng=rng, dtype=np.float64)
    for name, p in model.named_parameters():
        leaf, shape = name.rsplit(".", 1)[-1], p.data.shape
        noise = rng.standard_normal(shape)
        if leaf == "A_log":
            value = np.log(np.arange(1, shape[-1] + 1)) + 0.2 * noise
        elif leaf in ("b_dt", "D"):
            value = (-1 + 0.5 * noise) if leaf == "b_dt" else 1 + 0.3 * noise
        elif leaf in ("conv_w", "sinks") or name.startswith("embed."):
            value = noise * (shape[-1] ** -0.5 if leaf == "conv_w" else 1.0)
        elif p.data.ndim >= 2 and not leaf.endswith("_b"):  # not gpt-oss's (E, n) biases
            value = noise * shape[-2] ** -0.5 * (3 if leaf == "w_router" else 1)
        else:
            value = 1 + 0.1 * noise if "norm" in name else 0.1 * noise
        p.data[...] = value
    saved = {lib for e in record.names(model, flat_of(cfg)) if e.buffer for lib in e.lib}
    for name, b in model.named_buffers():
        if name in saved:
            b[...] = 0.1 * rng.standard_normal(b.shape)
    return model


@case
def lm_hub(rng):
    """d loss / d every Param of a tiny model of each Hugging Face family of HF_FIXTURES, in
    float64 (2 random directions per Param; weights, ids and directions from a seed of the
    family's own: `rng` is not used)."""
    return [lm_hub_family(family) for family in HF_FIXTURES]


def lm_hub_family(family):
    """lm_hub's check of one family (tests/hub/test_hub_grads.py runs them one test each)."""
    from scratchllm.hub import flat_of
    from scratchllm.lm import loss_pair
    # Each family draws its weights, ids and directions from its own seed, so adding a
    # family does not change the others' checks.
    fam_rng = np.random.default_rng(zlib.crc32(family.encode()))
    model = hub_model(family, fam_rng)
    forward, backward, params = loss_pair(model)
    f = flat_of(model.cfg)
    # Without RoPE (GPT-2, BERT) a key bias adds q . bk to every score of a query's row, which
    # softmax ignores: d loss / d bk = 0 exactly, so there is nothing to compare.
    wrt = [n for n in params if not (n.endswith(".bk") and f.positions != "rope")]
    # DeepSeek-V3.2's indexer only chooses keys (a discrete top-k): its weights get 0.
    wrt = [n for n in wrt if ".mixer.idx_" not in n]
    # Mamba layers: the dt path (W_dt, A_log, b_dt, ...) moves the loss little, so at
    # h = 1e-5 round-off reaches ~1e-7 of those gradients (Mamba-1's W_dt: kinks at
    # 1e-7 to 5e-7 on 2 of 4 seeds, and at 3e-5 on 1 of 4); with attention layers, at
    # 1e-4 the curvature of Jamba's attention does (kinks near 1.5e-7 on 2 of 4 seeds).
    # So h = 1e-4 for Mamba layers alone (below 3e-8 on 8 seeds) and 3e-5 with
    # attention (below 6e-8 on 4 seeds). Jamba's gradients equal torch autograd to 2e-14
    # (tests/hub/test_ssm_families.py).
    kinds = f.layer_pattern or ""  # None: attention only
    h = (1e-4 if set(kinds) == {"M"} else 3e-5) if "M" in kinds else 1e-5
    # RWKV-4: round-off in the WKV scan's exponentials reaches 1.4e-7 of embed.E's
    # gradient at h = 1e-5 (5e-7 at 1e-6); at 1e-4 every Param is below 3e-8.
    h = 1e-4 if f.ffn == "channel_mix" else h
    # DeepSeek-V3.2 (the indexer's Params are left out above): round-off reaches 1.18e-7
    # of layer 1's q_norm gradient at h = 1e-5, while at 2e-5, 3e-5 and 5e-5 every Param is
    # below 3e-8 (the error falls as h grows: round-off, not a wrong gradient).
    h = 3e-5 if any(".mixer.idx_" in n for n in params) else h
    return check(forward, backward, rng=fam_rng, max_full=0, n_directions=2, wrt=wrt,
                 label=family, fd_step=h, **_hub_ids(model, fam_rng), **params)


def _index_margin(model, blocks):
    """The smallest gap between the k-th and (k+1)-th indexer score of any query of the MLA
    layers with DeepSeek-V3.2's indexer (inf without one): the mixer's input is the x of its
    kv projection's linear cache."""
    from scratchllm.attention import lightning_indexer_forward, make_rope
    from scratchllm.attention.dsa import indexer_project
    gaps = [np.inf]
    for c, layer in zip(blocks, model.layers):
        spec = getattr(layer.mixer, "spec", None)
        if getattr(spec, "indexer", None) is None:
            continue
        x = c.mixer.inner.proj.kv.x  # (B, T, D)
        rope = make_rope(spec.rope, spec.qk_rope_head_dim, np.arange(x.shape[1]))
        scores = lightning_indexer_forward(*indexer_project(
            x, layer.mixer._weights(), spec=spec, rope=rope))[0]  # (B, T, T)
        k = spec.indexer.top_k
        for t in range(k, x.shape[1]):  # rows with more than k causal keys
            row = np.sort(scores[:, t, :t + 1], axis=-1)  # (B, t + 1)
            gaps.append(float(np.min(row[:, -k] - row[:, -k - 1])))
    return min(gaps)


def _hub_ids(model, rng, margin=1e-3):
    """ids, targets (2, 7); with MoE layers (or DeepSeek-V3.2's indexer), drawn again until
    every router's (indexer's) top-k choice is at least `margin` from a tie (no
    finite-difference step flips it)."""
    from scratchllm.hub import flat_of
    from scratchllm.moe import MoE, selection_margin
    V = flat_of(model.cfg).vocab_size
    while True:
        data = dict(ids=rng.integers(0, V, (2, 7)), targets=rng.integers(0, V, (2, 7)))
        moe = [layer.ffn for layer in model.layers if isinstance(layer.ffn, MoE)]
        if not moe:
            return data
        blocks = model.forward(data["ids"])[1].blocks
        if _index_margin(model, blocks) < margin:
            continue
        routers = [c.ffn.inner.router for c, layer in zip(blocks, model.layers)
                   if isinstance(layer.ffn, MoE)]
        if all(selection_margin(r.score_cache.y + f.selection_bias, f.spec.router.top_k,
                                f.spec.router.n_group, f.spec.router.topk_group,
                                f.spec.router.group_top).min() > margin
               for r, f in zip(routers, moe)):
            return data


@case
def hub_gpt_oss(rng):
    """d loss / d every Param of a tiny gpt-oss model in float64 (sliding and full layers,
    q/k/v/o biases, sink logits, clamped experts with a router bias, YaRN), on ids whose
    routing is at least 1e-3 from a top-k tie."""
    from scratchllm.lm import loss_pair
    model = hub_model("gpt_oss", rng)
    forward, backward, params = loss_pair(model)
    return check(forward, backward, rng=rng, max_full=0, n_directions=2, label="gpt_oss",
                 **_hub_ids(model, rng), **params)


SEQ2SEQ_CONFIGS = {  # label -> config.json fields of a tiny encoder-decoder checkpoint
    "t5": dict(model_type="t5", vocab_size=13, d_model=8, d_kv=3, d_ff=10, num_layers=2,
               num_heads=2, relative_attention_num_buckets=8,
               relative_attention_max_distance=12, feed_forward_proj="relu"),
}
SEQ2SEQ_CONFIGS["t5_v11"] = dict(SEQ2SEQ_CONFIGS["t5"], feed_forward_proj="gated-gelu",
                                 num_decoder_layers=3, tie_word_embeddings=False)
SEQ2SEQ_CONFIGS["switch"] = dict(SEQ2SEQ_CONFIGS["t5"], model_type="switch_transformers",
                                 num_decoder_layers=2, num_sparse_encoder_layers=1,
                                 num_sparse_decoder_layers=1, num_experts=3, expert_capacity=3,
                                 router_z_loss_coef=0.1, router_aux_loss_coef=0.2)


@case
def lm_seq2seq(rng):
    """d loss / d every Param of a tiny model of each encoder-decoder config of
    SEQ2SEQ_CONFIGS (T5: relu with the tied, scaled head and the shared relative bias
    tables; T5 v1.1: gated-gelu, untied, a deeper decoder; Switch: a sparse layer in each
    stack, capacity 3 of 7 source tokens, with its router losses), teacher-forced, float64;
    T5's sources padded (rows of 7 and 4 tokens, attention_mask)."""
    from scratchllm.hub import family_named
    from scratchllm.lm import Seq2SeqLM
    reports = []
    for label, hf in SEQ2SEQ_CONFIGS.items():
        cfg = family_named(hf["model_type"]).from_hf(hf)
        model = Seq2SeqLM(cfg, rng=np.random.default_rng(zlib.crc32(label.encode())),
                          dtype=np.float64)
        for _, p in model.named_parameters():  # the tables start at zero: give them values
            p.data = p.data + 0.1 * rng.standard_normal(p.data.shape)
        V = cfg.vocab_size
        data = (rng.integers(0, V, (2, 7)), rng.integers(0, V, (2, 5)),  # source, target in
                rng.integers(0, V, (2, 5)))  # labels
        mask = None if label == "switch" else (  # padded rows of 7 and 4 tokens: (2, 7)
            np.arange(7)[None] < np.array([[7], [4]])).astype(np.int64)
        forward, backward, params = module_loss_pair(model, *data, aux=label == "switch",
                                                      attention_mask=mask)
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             label=label, **params))
    return reports
