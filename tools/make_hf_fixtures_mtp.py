"""Write tests/fixtures/hf/deepseek_v3_mtp/: a tiny DeepSeek-V3 checkpoint with two
multi-token-prediction (MTP) layers, as DeepSeek-V3's release stores them, and what
transformers computes with them.

    PYTHONPATH=$PWD python tools/make_hf_fixtures_mtp.py

The checkpoint: transformers' save_pretrained of a random all-MoE DeepseekV3ForCausalLM of
N + 2 layers (so the MTP blocks carry transformers' own per-expert names and layouts), its
config.json then set to num_hidden_layers = N and num_nextn_predict_layers = 2, and per MTP
layer model.layers.{N + k}. the tensors an MTP layer adds: enorm, hnorm, eh_proj,
shared_head.norm (random), and embed_tokens and shared_head.head (copies of the trunk's).

What transformers does with it (recorded in expected.npz and asserted here):
  * DeepseekV3ForCausalLM.from_pretrained drops the MTP layers: every model.layers.{N + k}.*
    tensor comes back as an unexpected key (its _keys_to_ignore_on_load_unexpected names
    layer 61 only, the full model's), so its forward never runs them;
  * its MtpModel (modeling_layers.py, generate(use_mtp=True)) loads them once the main
    model's ignore-pattern names layers N and N + 1. MtpModel.forward_layer(0, ...) runs
    module 1 as DeepSeek-V3 defines it: mtp1_logits. For module 2 MtpModel feeds module 1's
    output after its norm (shared_head.norm) where DeepSeek-V3's equations feed h^1 before
    it: mtp2_logits is MtpLayer 1 run on h^1 taken before the norm (a forward hook on module
    1's block), the equations' chain; hf_chain_mtp2_logits is MtpModel's own chain, kept to
    show the two differ.
  * a hand NumPy computation from the safetensors alone (no transformers) of module 1's
    block input eh_proj [enorm(E t_{i+1}); hnorm(h_i)] (hand_block_input1) and of its
    logits from the hooked block output (agreeing with MtpModel's to 1e-12).

expected.npz: ids (B, T), trunk_hidden (B, T, D) (the last decoder layer's output, before
the final norm), logits (B, T, V) of the main model, mtp1_logits (B, T - 1, V),
mtp2_logits (B, T - 2, V), hf_chain_mtp2_logits, hand_block_input1 (B, T - 1, D),
unexpected_on_load (the names DeepseekV3ForCausalLM dropped), saved_by_scratchllm_rel_err
(scratchllm's save_pretrained of the loaded checkpoint, read back by transformers'
MtpModel: module 1's float64 logits' largest relative difference).
Reference: huggingface/transformers src/transformers/modeling_layers.py (MtpLayer,
MtpModel), src/transformers/models/deepseek_v3/modeling_deepseek_v3.py; DeepSeek-AI 2024,
arXiv 2412.19437, sec. 2.2.
"""
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file as load_np
from safetensors.numpy import save_file as save_np
from transformers.modeling_layers import MtpModel

from make_hf_fixtures import B, OUT, ROOT, T, float64_everywhere
from make_hf_fixtures_moe import _DSV3, RoutingLog, load_float64, randomize_moe

N, DEPTH, V = 2, 2, 48
FIELDS = dict(_DSV3, q_lora_rank=12, first_k_dense_replace=0, n_group=2, topk_group=1,
              n_shared_experts=1, norm_topk_prob=True, routed_scaling_factor=2.5,
              rope_interleave=True, vocab_size=V, rms_norm_eps=1e-6)


def write_checkpoint(directory, seed=7):
    """The N-layer checkpoint with DEPTH MTP layers (module docstring), float32."""
    cfg = transformers.AutoConfig.for_model(**FIELDS, num_hidden_layers=N + DEPTH,
                                            num_nextn_predict_layers=DEPTH)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_moe(model, seed)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tensors = load_np(Path(tmp) / "model.safetensors")
        hf = json.loads((Path(tmp) / "config.json").read_text())
    rng = np.random.default_rng(seed)
    D = FIELDS["hidden_size"]
    for k in range(DEPTH):
        layer = f"model.layers.{N + k}."
        for norm in ("enorm", "hnorm", "shared_head.norm"):
            tensors[f"{layer}{norm}.weight"] = (1 + 0.1 * rng.standard_normal(D)).astype(
                np.float32)
        tensors[f"{layer}eh_proj.weight"] = (rng.standard_normal((D, 2 * D))
                                             * (2 * D) ** -0.5).astype(np.float32)
        tensors[f"{layer}embed_tokens.weight"] = tensors["model.embed_tokens.weight"].copy()
        tensors[f"{layer}shared_head.head.weight"] = tensors["lm_head.weight"].copy()
    hf.update(num_hidden_layers=N, num_nextn_predict_layers=DEPTH)
    directory.mkdir(parents=True, exist_ok=True)
    save_np(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(hf, indent=2) + "\n")


def mtp_model(main, directory):
    """transformers' MtpModel of the checkpoint, float64 (its embedding, head and rotary
    the float64 main model's), once the main model's ignore pattern names the MTP layers
    (N .. N + DEPTH - 1)."""
    main.config.name_or_path = str(directory)
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{N + k}\..*"
                                               for k in range(DEPTH)]
    mtp = MtpModel.from_pretrained(main)  # outside float64_everywhere: it reads float32
    return mtp.double().eval()


def _rms(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def reference(directory, ids):
    """expected.npz's arrays (module docstring)."""
    _, info = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, output_loading_info=True)
    unexpected = sorted(info["unexpected_keys"])
    assert unexpected and all(re.match(rf"model\.layers\.({N}|{N + 1})\.", n)
                              for n in unexpected), unexpected
    main = load_float64(directory)
    log = RoutingLog(main)
    mtp = mtp_model(main, directory)
    grabbed = {}
    main.model.layers[-1].register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("h0", o[0] if isinstance(o, tuple) else o))
    mtp.layers[0].mtp_block.register_forward_hook(
        lambda m, i, o: grabbed.__setitem__("h1", o[0] if isinstance(o, tuple) else o))
    mtp.layers[0].mtp_block.register_forward_pre_hook(
        lambda m, args, kw: grabbed.__setitem__("a1", args[0] if args else
                                                 kw["hidden_states"]), with_kwargs=True)
    x = torch.tensor(ids)
    pos = torch.arange(T)[None].repeat(B, 1)
    with float64_everywhere(), torch.no_grad():
        logits = main(x).logits
        h0 = grabbed["h0"]
        out1 = mtp.forward_layer(0, h0[:, :-1], pos[:, 1:], None, input_ids=x[:, 1:])
        h1 = grabbed["h1"]
        logits1 = mtp._project_to_logits(out1)
        logits2 = mtp._project_to_logits(mtp.forward_layer(1, h1[:, :-1], pos[:, 2:], None,
                                                           input_ids=x[:, 2:]))
        hf_chain = mtp._project_to_logits(mtp.forward_layer(1, out1[:, :-1], pos[:, 2:], None,
                                                            input_ids=x[:, 2:]))
    assert min(m for _, m, _ in log.calls) > 1e-6, "a routing decision near a tie"
    w = load_np(directory / "model.safetensors")
    eps, L = FIELDS["rms_norm_eps"], f"model.layers.{N}."
    e = w["model.embed_tokens.weight"].astype(np.float64)[ids[:, 1:]]
    hand = np.concatenate([_rms(e, w[L + "enorm.weight"], eps),
                           _rms(h0[:, :-1].numpy(), w[L + "hnorm.weight"], eps)], -1) \
        @ w[L + "eh_proj.weight"].astype(np.float64).T  # (B, T - 1, D)
    assert np.abs(hand - grabbed["a1"].numpy()).max() < 1e-12
    hand_logits = _rms(h1.numpy(), w[L + "shared_head.norm.weight"], eps) \
        @ w[L + "shared_head.head.weight"].astype(np.float64).T  # (B, T - 1, V)
    assert np.abs(hand_logits - logits1.numpy()).max() < 1e-12
    assert np.abs(hf_chain - logits2).max() > 1e-3  # the two chains differ
    return dict(ids=ids, trunk_hidden=h0.numpy(), logits=logits.numpy(),
                mtp1_logits=logits1.numpy(), mtp2_logits=logits2.numpy(),
                hf_chain_mtp2_logits=hf_chain.numpy(), hand_block_input1=hand,
                unexpected_on_load=np.array(unexpected))


def saved_by_scratchllm(directory, expected):
    """scratchllm's save_pretrained of the loaded checkpoint, its MTP layers read back by
    transformers' MtpModel: module 1's largest relative logit difference."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        main = load_float64(saved)
        mtp = mtp_model(main, Path(saved))
        x = torch.tensor(expected["ids"])
        with float64_everywhere(), torch.no_grad():
            h0 = torch.tensor(expected["trunk_hidden"])
            pos = torch.arange(T)[None].repeat(B, 1)
            out = mtp.forward_layer(0, h0[:, :-1], pos[:, 1:], None, input_ids=x[:, 1:])
            logits1 = mtp._project_to_logits(out).numpy()
    want = expected["mtp1_logits"]
    err = float(np.abs(logits1 - want).max() / np.abs(want).max())
    assert err < 1e-6, err
    return err


def main():
    d = OUT / "deepseek_v3_mtp"
    write_checkpoint(d)
    for seed in range(100):  # ids whose routing is clear of ties
        try:
            expected = reference(d, np.random.default_rng(seed).integers(0, V, (B, T)))
            break
        except AssertionError as e:
            if "tie" not in str(e):
                raise
    else:
        raise RuntimeError("no ids with routing away from ties in 100 draws")
    err = saved_by_scratchllm(d, expected)
    np.savez_compressed(d / "expected.npz", **expected, saved_by_scratchllm_rel_err=err)
    print(f"deepseek_v3_mtp: DeepseekV3ForCausalLM dropped {len(expected['unexpected_on_load'])}"
          f" MTP tensors; saved by scratchllm, read by MtpModel: {err:.1e}")


if __name__ == "__main__":
    main()
