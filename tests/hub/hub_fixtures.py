"""What the Hugging Face fixture tests share: the fixtures' folder (written by tools/'s
make_hf_fixtures*.py scripts with transformers), a checkpoint's expected.npz, and the relative
error every comparison with transformers uses."""
from pathlib import Path

import numpy as np

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def expected(name):
    """{name: array} of HF/name/expected.npz (inputs, logits, gradients, greedy ids)."""
    return dict(np.load(HF / name / "expected.npz"))


def rel_err(a, b):
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def assert_names_round_trip(family, model):
    """family.names(model, model.cfg) names every Param once under distinct HF names, and
    writing each Param out and reading it back (layout.to_hf, from_hf) restores it exactly."""
    from scratchllm.hub.layout import from_hf, to_hf
    table = family.names(model, model.cfg)
    assert len({e.hf for e in table}) == len(table)
    arrays = {n: p.data for n, p in model.named_parameters()}
    assert sorted(lib for e in table for lib in e.lib) == sorted(arrays)
    restored = {n: np.zeros_like(a) for n, a in arrays.items()}
    for e in table:
        from_hf(e, to_hf(e, arrays), restored)
    assert all(np.array_equal(restored[n], a) for n, a in arrays.items())


def assert_greedy_and_cached(model, ids, greedy, **images):
    """Greedy decoding after ids (1, T) and its images (the model's prefill keywords) gives
    the ids `greedy`; the prefill's last row and every decoded step equal a full forward over
    the sequence so far."""
    state = model.init_state(1, ids.shape[1] + len(greedy))
    logits = model.prefill(ids, state, **images)[:, -1]  # (1, V)
    seq = ids[0].tolist()
    for _ in greedy:
        full, _ = model.forward(input_ids=np.array([seq]), **images)
        assert rel_err(logits[0], full[0, -1]) < 1e-10
        seq.append(int(np.argmax(logits[0])))
        logits = model.decode(np.array(seq[-1:]), state, len(seq) - 1)
    assert seq[ids.shape[1]:] == list(greedy)
    return state


def assert_saves_bit_identical(directory, saved):
    """save_pretrained of load_pretrained(directory) into `saved` writes every tensor of
    directory's model.safetensors bit-identical, and a config.json its family reads as the
    same config."""
    import json

    from safetensors.numpy import load_file

    from scratchllm.hub import family_named, load_pretrained, save_pretrained
    save_pretrained(load_pretrained(directory), saved)
    original, written = load_file(directory / "model.safetensors"), load_file(
        saved / "model.safetensors")
    assert sorted(written) == sorted(original)
    assert all(np.array_equal(written[n], original[n]) for n in original)
    hf = json.loads((directory / "config.json").read_text())
    family = family_named(hf["model_type"])
    assert family.from_hf(json.loads((saved / "config.json").read_text())) == \
        family.from_hf(hf)


def assert_logits_and_gradients(model, ref, *, key_bias_zero, **inputs):
    """model.forward(**inputs)'s logits within 1e-9 of ref's, and the gradients of
    sum(logits * G) (G from ref's G_seed) within 1e-8, name by name. A gradient transformers
    gives as exactly 0 must be exactly 0. With key_bias_zero, a k_proj.bias gradient is 0 in
    exact arithmetic (softmax is shift-invariant over the keys when no RoPE turns the bias):
    both sides must lie below 1e-12 of the key weight's largest gradient."""
    from scratchllm.hub import grad_dict
    model.zero_grad()
    logits, cache = model.forward(**inputs)
    assert rel_err(logits, ref["logits"]) < 1e-9
    model.backward(np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape),
                   cache)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    for n, g in want.items():
        if not np.abs(g).max() > 0:
            assert not grads[n].any(), n
        elif key_bias_zero and n.endswith("k_proj.bias"):
            scale = np.abs(want[n.replace(".bias", ".weight")]).max()
            assert max(np.abs(grads[n]).max(), np.abs(g).max()) < 1e-12 * scale, n
        else:
            assert rel_err(grads[n], g) < 1e-8, n
