"""Gradient-check cases of whole tiny models: d loss / d every Param of the LM presets
(dense, MoE, MLA, sliding window, hybrid, position and block options, recurrent mixers, the
config options of released checkpoints) and of the encoder models, in float64.
LM_TINY and lm_tiny(name) are the sizes and presets the tests share."""
import numpy as np

from grads.cases._common import case, module_loss_pair
from grads.check import check


LM_TINY = dict(vocab_size=23, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=12,
               n_experts=4, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4,
               v_head_dim=6, d_state=4, expand=2)
LM_TINY_EXTRA = {"swa": dict(window=3, n_sink=1), "mamba2_hybrid": dict(layer_pattern="SFAF",
                                                                         n_layers=4),
                 # the tiny hybrid keeps RoPE, plain Mamba and renormalised gates; Jamba's
                 # options (the preset's own) are checked in LM_CHECKPOINTS' "jamba"
                 "hybrid": dict(layer_pattern="MA", positions="rope", mamba_inner_norms=False,
                                norm_topk_prob=True),
                 **{name: dict(layer_pattern=2 * letter) for name, letter in (
                     ("linear", "L"), ("deltanet", "D"), ("mamba2", "S"), ("rwkv", "W"))}}


def lm_tiny(name, **overrides):
    """A model preset shrunk to LM_TINY sizes (tests share it)."""
    from scratchllm.lm import preset
    return preset(name, **{**LM_TINY, **LM_TINY_EXTRA.get(name, {}), **overrides})


def _lm(name, rng, label=None, **overrides):
    """d loss / d every Param of a whole tiny model (CE + weighted MoE aux terms), along 2
    random directions per Param, float64.
    Mamba layers: at init the step-size path (W_x, W_dt, b_dt, A_log) moves the loss by only
    ~1e-5 per unit step, so round-off swamps h = 1e-5 there. The check point takes b_dt + 2
    (Δ ~ 2) and W_out x 4, and that path is checked in a second report at h = 3e-4."""
    from scratchllm.lm import LM, loss_pair
    model = LM(lm_tiny(name, **overrides), rng=rng, dtype=np.float64)
    forward, backward, params = loss_pair(model)
    for n in params:
        if n.endswith(".W_out"):
            params[n] = 4.0 * params[n]
        if n.endswith(".b_dt"):
            params[n] = params[n] + 2.0
    V = model.cfg.vocab_size
    data = dict(ids=rng.integers(0, V, (2, 7)), targets=rng.integers(0, V, (2, 7)), **params)
    slow = [n for n in params if n.rsplit(".", 1)[-1] in ("W_x", "W_dt", "b_dt", "A_log")]
    fast = [n for n in params if n not in slow]
    reports = [check(forward, backward, rng=rng, max_full=0, n_directions=2, wrt=fast,
                     label=label or name, **data)]
    if slow:
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             wrt=slow, fd_step=3e-4,
                             label=f"{label or name}, mamba dt path, h=3e-4",
                             **data))
    return reports


@case
def lm_dense(rng):
    return _lm("dense", rng) + _lm("dense", rng, "dense, tied", tie_embeddings=True)


@case
def lm_mtp(rng):
    """Multi-token prediction (lm/mtp.py) on whole tiny models: CE + (lambda / D) sum_k L^k
    with D = 2 modules, every Param (the shared embedding and head get the trunk's and the
    modules' gradients); untied, tied, and an MoE trunk whose modules end in MoE blocks."""
    from dataclasses import replace

    from scratchllm.lm import LM, loss_pair
    from scratchllm.specs import MTPSpec
    reports = []
    for label, cfg in (("dense, D=2", replace(lm_tiny("dense"), mtp=MTPSpec(2, 0.5))),
                       ("dense tied, D=1", replace(lm_tiny("dense", tie_embeddings=True),
                                                   mtp=MTPSpec(1))),
                       ("moe, D=2", replace(lm_tiny("moe"), mtp=MTPSpec(2)))):
        model = LM(cfg, rng=rng, dtype=np.float64)
        forward, backward, params = loss_pair(model)
        V = cfg.vocab_size
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             label=label, ids=rng.integers(0, V, (2, 7)),
                             targets=rng.integers(0, V, (2, 7)), **params))
    return reports


@case
def lm_moe(rng):
    return _lm("moe", rng)


@case
def lm_mla(rng):
    return _lm("mla", rng)


@case
def lm_swa(rng):
    return _lm("swa", rng)


@case
def lm_hybrid(rng):
    return _lm("hybrid", rng)


@case
def lm_mamba2_hybrid(rng):
    """MLP-only layers (F) between Mamba-2 and attention layers, one sub-layer each."""
    return _lm("mamba2_hybrid", rng)


@case
def lm_positions(rng):
    """Attention options in a whole model: ALiBi with flash attention on a sliding
    window with sinks, sinusoidal positions, NoPE."""
    return (_lm("swa", rng, "swa, alibi, flash", positions="alibi", attn_impl="flash")
            + _lm("dense", rng, "dense, sinusoidal", positions="sinusoidal")
            + _lm("dense", rng, "dense, nope", positions="nope"))


@case
def lm_post(rng):
    """The post-norm block (block="post"), the sandwich block and the output-norm block in a
    whole tiny model."""
    return (_lm("dense", rng, "dense, post-norm", block="post")
            + _lm("dense", rng, "dense, sandwich", block="sandwich", norm_offset=1.0)
            + _lm("dense", rng, "dense, output norms, full QK-norm (OLMo 2)", block="output",
                  qk_norm="full"))


@case
def lm_recurrent(rng):
    """The recurrent mixers inside a whole model: L R G D, then S (Mamba-2) and W (RWKV-4)
    between attention layers."""
    return (_lm("dense", rng, "LRGD", layer_pattern="LRGD", n_layers=4)
            + _lm("dense", rng, "SAWA", layer_pattern="SAWA", n_layers=4))


# Config options of released checkpoints, on tiny models: HF Mamba-1 (mixer-only blocks),
# Jamba's inner Mamba norms (dt rank 3: an RMSNorm over a single number is only its sign),
# DeepSeek-V3 group-limited routing with scaling plus gpt-oss's router logit bias.
LM_CHECKPOINTS = {
    "mamba1": ("hybrid", dict(ffn="none", layer_pattern="MM")),
    "jamba": ("hybrid", dict(mamba_inner_norms=True, dt_rank=3)),
    "routing": ("mla", dict(n_group=2, topk_group=1, routed_scaling_factor=2.5,
                            router_bias=True)),
}


@case
def lm_checkpoint_options(rng):
    return [report for label, (name, overrides) in LM_CHECKPOINTS.items()
            for report in _lm(name, rng, label, **overrides)]


# BERT's shape (post-norm LayerNorm blocks, learned positions, token types, a norm on the
# embeddings, no final norm, the MLM head transform and output bias, tied): the options a
# ModelConfig carries for it, every Param through the masked LM's loss.
BERT_SHAPE = dict(causal=False, block="post", norm="layernorm", positions="learned",
                  type_vocab_size=2, embed_norm=True, final_norm=False, mlm_head=True,
                  ffn="gelu_mlp", gelu_approx="none", qkv_bias=True, o_bias=True,
                  tie_embeddings=True)


@case
def lm_bert_shape(rng):
    from scratchllm.core import ops
    from scratchllm.lm import MaskedLM, mlm_corrupt
    from scratchllm.specs import from_flat
    cfg = from_flat(vocab_size=13, d_model=8, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=10,
                    max_positions=16, **BERT_SHAPE)
    model = MaskedLM(cfg, rng=rng, dtype=np.float64)
    for p in model.parameters():  # norms and biases away from 1 and 0: every path matters
        p.data = p.data + 0.1 * rng.standard_normal(p.data.shape)
    ids = rng.integers(1, 13, (2, 7))
    inputs, targets = mlm_corrupt(ids, rng, mask_id=0, vocab_size=13, rate=0.5)
    targets[0, 0] = ids[0, 0]  # at least one counted position
    types = rng.integers(0, 2, (2, 7))

    # the key bias's exact gradient is 0 without RoPE (q.b_k adds one number to all of a
    # query's scores; softmax ignores it): left out, its backward gives round-off only
    params = {n: p for n, p in model.named_parameters() if not n.endswith("mixer.bk")}

    def forward(**arrays):  # the masked-LM loss with token types
        for name, p in params.items():
            p.data = arrays[name]
        logits, cache = model.forward(inputs, types)
        loss, c_ce = ops.cross_entropy_forward(logits, targets)
        return loss, (cache, c_ce)

    def backward(dloss, cache):
        model.zero_grad()
        dlogits = ops.cross_entropy_backward(np.asarray(dloss), cache[1])["logits"]
        model.backward(dlogits, cache[0])
        return {name: p.grad.copy() for name, p in params.items()}

    return [check(forward, backward, rng=rng, max_full=0, n_directions=2, label="BERT shape",
                  **{n: p.data for n, p in params.items()})]


@case
def lm_encoders(rng):
    """Whole encoder models, every Param: the masked LM (BERT masking) and the
    encoder-decoder (teacher-forced), float64."""
    from scratchllm.lm import EncoderDecoder, MaskedLM, masked_lm_config, mlm_corrupt
    V, D, L, H, F = 13, 8, 2, 2, 10
    mlm = MaskedLM(masked_lm_config(V, D, L, H, F), rng=rng, dtype=np.float64)
    ids = rng.integers(1, V, (2, 7))
    inputs, targets = mlm_corrupt(ids, rng, mask_id=0, vocab_size=V, rate=0.5)
    targets[0, 0] = ids[0, 0]  # at least one counted position
    s2s = EncoderDecoder(V, D, L, H, F, rng=rng, dtype=np.float64)
    src, tgt = rng.integers(0, V, (2, 5)), rng.integers(0, V, (2, 6))
    reports = []
    for label, model, data in (("masked LM", mlm, (inputs, targets)),
                               ("encoder-decoder", s2s, (src, tgt[:, :-1], tgt[:, 1:]))):
        forward, backward, params = module_loss_pair(model, *data)
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             label=label, **params))
    return reports
