"""The family switch_transformers (SwitchTransformersForConditionalGeneration; Fedus et al. 2021,
arXiv 2101.03961): T5's encoder-decoder (families/t5.py) whose FFN is, every sparse_step-th
layer, the Switch layer of moe/switch.py (top-1 softmax router without renormalising, the
expert_capacity first tokens of each expert in each sequence kept, the rest passed through
unchanged by the residual, ReLU experts), a dense ReLU MLP elsewhere.

    sparse_step = num_layers // num_sparse_encoder_layers (the decoder's likewise; num_layers
    when 0 sparse layers are asked); layer i is sparse when i % sparse_step == 1 or
    sparse_step == 1 (transformers' rule, kept as it is)
    library                         transformers (switch_transformers), in a block's FFN
                                    sub-layer <S>.block.i.layer.k (k = 1 encoder, 2 decoder)
    ffn.W1, ffn.W2 (dense)          <...>.mlp.wi, .mlp.wo .weight                            T
    ffn.w_router (D, E) (+ b)       <...>.mlp.router.classifier.weight (E, D) (+ .bias)      T
    ffn.w1[e], ffn.w2[e]            <...>.mlp.experts.expert_e.wi, .wo .weight                T
The rest is T5's names; the head is tied (scaled by d_model^-1/2) unless tie_word_embeddings
is false. Router losses (output_router_logits): each stack's z-loss and balance loss over its
sparse layers together (moe/switch.py), weighted by router_z_loss_coef and
router_aux_loss_coef; transformers adds a stack's losses only when its sparse_step > 1, so a
stack of sparse layers only (sparse_step 1) gets coefficients 0. The model adds them to its
loss only when asked (Seq2SeqLM.backward's dloss_aux, loss(aux=True)). The router's jitter
noise acts in training only, and this model is transformers' in eval mode.

Reference: huggingface/transformers
src/transformers/models/switch_transformers/modeling_switch_transformers.py and
src/transformers/models/switch_transformers/configuration_switch_transformers.py.
Glossary: D model width, E experts.
"""
from scratchllm.hub.families.base import fail_config
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.families.t5 import (T5_UNUSED, block_entries, common_hf, refuse_shape,
                                        seq2seq_config, top_entries)
from scratchllm.hub.layout import Entry
from scratchllm.lm.seq2seq import Seq2SeqLM
from scratchllm.specs import ExpertsSpec, FFNSpec, MoESpec, RouterSpec
from scratchllm.specs.seq2seq import Seq2SeqConfig


def sparse_step(n_layers, n_sparse):
    """transformers' step between sparse layers of a stack."""
    return n_layers // n_sparse if n_sparse > 0 else n_layers


def is_sparse(i, step):
    return (i % step == 1 or step == 1) if step > 0 else False


def _from_hf(hf):
    act = hf.get("dense_act_fn", "relu")
    if act != "relu":
        fail_config(f"dense_act_fn = {act!r} is not implemented for switch_transformers "
                    f"(only 'relu')")
    if "feed_forward_proj" in hf and hf["feed_forward_proj"] != "relu":
        fail_config(f"feed_forward_proj = {hf['feed_forward_proj']!r} is not implemented for "
                    f"switch_transformers (only 'relu')")
    L = hf["num_layers"]
    Ld = hf.get("num_decoder_layers") or L
    steps = {False: sparse_step(L, hf.get("num_sparse_encoder_layers", 3)),
             True: sparse_step(Ld, hf.get("num_sparse_decoder_layers", 3))}
    router = RouterSpec(hf.get("num_experts", 8), 1, "softmax", bias=bool(
        hf.get("router_bias", False)), norm_topk_prob=False)

    def ffn(i, decoder):
        step = steps[decoder]
        if not is_sparse(i, step):
            return FFNSpec("relu_mlp", hf["d_ff"])
        on = step > 1  # transformers adds a stack's router losses only then
        return MoESpec(router, ExpertsSpec("relu", hf["d_ff"]),
                       expert_capacity=hf.get("expert_capacity", 64),
                       balance_coef=float(hf.get("router_aux_loss_coef", 0.001)) if on else 0.0,
                       z_coef=float(hf.get("router_z_loss_coef", 0.001)) if on else 0.0)

    return seq2seq_config(hf, "switch_transformers", ffn)  # scaled exactly when tied


def _sparse_specs(cfg):
    return [layer.ffn for layer in cfg.encoder + cfg.decoder if isinstance(layer.ffn, MoESpec)]


def _to_hf(cfg, dtype_name, base=None):
    hf = common_hf(cfg, SWITCH, dtype_name, base)
    hf.pop("scale_decoder_outputs")
    sparse = _sparse_specs(cfg)
    dense = [layer.ffn for layer in cfg.encoder + cfg.decoder if isinstance(layer.ffn, FFNSpec)]
    d_ff = (sparse[0].experts.d_ff if sparse else dense[0].d_ff)
    hf.update(d_ff=d_ff, dense_act_fn="relu",
              num_sparse_encoder_layers=sum(isinstance(x.ffn, MoESpec) for x in cfg.encoder),
              num_sparse_decoder_layers=sum(isinstance(x.ffn, MoESpec) for x in cfg.decoder))
    if sparse:
        m = sparse[0]
        hf.update(num_experts=m.router.n_experts, expert_capacity=m.expert_capacity,
                  router_bias=m.router.bias)
        for spec in sparse:  # a stack with coefficients 0 keeps the file's ones
            if spec.z_coef or spec.balance_coef:
                hf.update(router_z_loss_coef=spec.z_coef, router_aux_loss_coef=spec.balance_coef)
    return hf


def _check(cfg):
    """T5's shape with Switch layers where transformers' sparse step puts them, all alike."""
    refuse_shape(cfg, "switch_transformers", sparse=True)
    sparse = _sparse_specs(cfg)
    problems = []
    for name, stack in (("encoder", cfg.encoder), ("decoder", cfg.decoder)):
        where = tuple(i for i, layer in enumerate(stack) if isinstance(layer.ffn, MoESpec))
        step = sparse_step(len(stack), len(where))
        want = tuple(i for i in range(len(stack)) if is_sparse(i, step))
        if where != want:
            problems.append(f"{name} sparse layers {list(where)} (transformers puts "
                            f"{len(where)} at {list(want)})")
    first = sparse[0] if sparse else None
    if any(s.router != first.router or s.experts != first.experts
           or s.expert_capacity != first.expert_capacity for s in sparse):
        problems.append("sparse layers that differ")
    if sparse and (first.expert_capacity is None or first.experts.kind != "relu"):
        problems.append(f"sparse layers other than Switch's (expert_capacity="
                        f"{first.expert_capacity}, experts {first.experts.kind!r}: Switch's "
                        f"take an expert_capacity and ReLU experts)")
    if sparse and (first.router.routed_scaling_factor != 1.0 or first.router.norm_topk_prob
                   or first.router.bias_gamma):
        problems.append(f"router {first.router!r} (top-1 softmax, norm_topk_prob=False)")
    dense = {layer.ffn.kind for layer in cfg.encoder + cfg.decoder
             if isinstance(layer.ffn, FFNSpec)}
    if dense - {"relu_mlp"}:
        problems.append(f"dense FFNs {sorted(dense)} (relu_mlp only)")
    if not cfg.tie_embeddings == cfg.scale_output:
        problems.append(f"tie_embeddings={cfg.tie_embeddings} with scale_output="
                        f"{cfg.scale_output} (switch scales exactly when tied)")
    if problems:
        raise ValueError(f"save_pretrained: config {cfg.name!r} is a switch_transformers "
                         f"checkpoint only without: {'; '.join(problems)}")


def _ffn_entries(i, blk, rest, prefix, lib):
    """The FFN sub-layer's tensors: a dense ReLU MLP, or the router and each expert."""
    names = {"ffn.W1": "mlp.wi.weight", "ffn.W2": "mlp.wo.weight",
             "ffn.w_router": "mlp.router.classifier.weight",
             "ffn.b_router": "mlp.router.classifier.bias"}
    if rest in names:
        return [Entry(prefix + names[rest], (lib,), rest != "ffn.b_router")]
    if rest in ("ffn.w1", "ffn.w2"):
        hf = "wi" if rest == "ffn.w1" else "wo"
        return [Entry(f"{prefix}mlp.experts.expert_{e}.{hf}.weight", (lib,), True, e)
                for e in range(blk.ffn.spec.router.n_experts)]
    return None


def _names(model, cfg):
    return (top_entries(model) + block_entries(model, "encoder", _ffn_entries)
            + block_entries(model, "decoder", _ffn_entries))


SWITCH = ModuleFamily(
    "switch_transformers", "SwitchTransformersForConditionalGeneration", _from_hf, _to_hf,
    claims=lambda cfg: isinstance(cfg, Seq2SeqConfig) and bool(_sparse_specs(cfg)),
    check=_check, build=Seq2SeqLM, names=_names, unused=T5_UNUSED,
    tied_head=("lm_head.weight", "shared.weight"))
