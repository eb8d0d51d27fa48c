"""`sample --hf DIR --image PNG` on a vision-language checkpoint: the llava fixture with the
SigLIP processor of tests/fixtures/hf/siglip_vision and the llama fixture's tokenizer (the
same 300 ids); greedy sampling prints what a full-forward argmax loop over the image's
tokens and the prompt picks. Qwen2-VL's images of any size become their blocks of ids."""
import shutil

import numpy as np
import pytest

from scratchllm import cli
from scratchllm.cli.images import bind_images
from scratchllm.hub import load_pretrained, load_tokenizer
from scratchllm.vision import load_image_processor
from scratchllm.vision.vlm import image_block
from hub_fixtures import HF

IMAGES = HF.parent / "images"


@pytest.fixture
def llava_dir(tmp_path):
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        shutil.copy(HF / "llava" / f, tmp_path)
    shutil.copy(HF / "siglip_vision" / "preprocessor_config.json", tmp_path)
    shutil.copy(HF / "llama" / "tokenizer.json", tmp_path)
    return tmp_path


def test_sample_with_an_image_is_greedy_over_its_tokens(llava_dir, capsys):
    prompt, png = "def f(x):", str(IMAGES / "rgb.png")
    assert cli.main(["sample", "--hf", str(llava_dir), "--image", png, "--prompt", prompt,
                     "--max-tokens", "5", "--temperature", "0", "--top-p", "1"]) == 0
    model, tok = load_pretrained(llava_dir, np.float64), load_tokenizer(llava_dir)
    images, counts = model.image_inputs([png], load_image_processor(llava_dir))
    assert counts == [9]  # a 12 x 12 image in 4 x 4 patches, all kept ("full")
    ids = [model.cfg.image_token_id] * 9 + tok.encode_ordinary(prompt)
    for _ in range(5):
        logits, _ = model.forward(input_ids=np.array([ids]), **images)
        ids.append(int(np.argmax(logits[0, -1])))
    assert capsys.readouterr().out == prompt + tok.decode(ids[-5:]) + "\n"


CHAT = ("{% for m in messages %}{{ m['role'] }}: {% for c in m['content'] %}"
        "{% if c['type'] == 'image' %}<|endoftext|>{% else %}{{ c['text'] }}{% endif %}"
        "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def test_chat_with_an_image_expands_the_templates_placeholder(llava_dir, capsys):
    """--chat sends [image, text] as the user's content; the one placeholder the template
    writes (here <|endoftext|>, id 0, made the image token) becomes the image's 9 tokens, and
    greedy sampling continues those ids."""
    import json
    hf = json.loads((llava_dir / "config.json").read_text())
    (llava_dir / "config.json").write_text(json.dumps(dict(hf, image_token_index=0)))
    (llava_dir / "chat_template.jinja").write_text(CHAT)
    png = str(IMAGES / "rgb.png")
    assert cli.main(["sample", "--hf", str(llava_dir), "--image", png, "--chat", "def f(x):",
                     "--max-tokens", "4", "--temperature", "0", "--top-p", "1"]) == 0
    model, tok = load_pretrained(llava_dir, np.float64), load_tokenizer(llava_dir)
    from scratchllm.tokenizer import chat_template_of
    _, ids = bind_images(_args(hf=str(llava_dir), image=[png], chat="def f(x):"), model, tok,
                         chat_template_of(llava_dir))
    start = ids.index(0)
    assert ids[start:start + 9] == [0] * 9 and ids.count(0) == 9
    images, _ = model.image_inputs([png], load_image_processor(llava_dir))
    for _ in range(4):
        logits, _ = model.forward(input_ids=np.array([ids]), **images)
        ids.append(int(np.argmax(logits[0, -1])))
    assert capsys.readouterr().out == tok.decode(ids[-4:]) + "\n"


def test_chat_with_a_start_placeholder_gets_the_whole_block(llava_dir):
    """A template that writes only the image start id (Gemma 3's <start_of_image>): that id
    becomes the image's whole block, start and end ids around its tokens."""
    import json
    from scratchllm.tokenizer import chat_template_of
    hf = json.loads((llava_dir / "config.json").read_text())
    (llava_dir / "config.json").write_text(json.dumps(dict(hf, boi_token_index=0,
                                                           eoi_token_index=1)))
    (llava_dir / "chat_template.jinja").write_text(CHAT)
    model, tok = load_pretrained(llava_dir), load_tokenizer(llava_dir)
    _, ids = bind_images(_args(hf=str(llava_dir), chat="hi"), model, tok,
                         chat_template_of(llava_dir))
    start = ids.index(0)
    assert ids[start:start + 11] == [0] + [299] * 9 + [1] and ids.count(299) == 9


def test_what_does_not_fit_is_named(llava_dir, capsys):
    png = str(IMAGES / "rgb.png")
    assert cli.main(["sample", "--hf", str(HF / "llama"), "--image", png, "--prompt", "x"]) != 0
    assert "does not read images; the families that do: llava, qwen2_vl, gemma3" in \
        capsys.readouterr().err
    with pytest.raises(ValueError, match="--image with --heal is not implemented"):
        bind_images(_args(hf=str(llava_dir), heal=True), load_pretrained(llava_dir), None)
    with pytest.raises(ValueError, match="has no chat template"):
        bind_images(_args(hf=str(llava_dir), chat="hi"), load_pretrained(llava_dir), None)
    with pytest.raises(ValueError, match="--image goes with --hf DIR"):
        bind_images(_args(), None, None)


def _args(**given):
    from types import SimpleNamespace
    base = dict(hf=None, image=[str(IMAGES / "rgb.png")], chat=None, heal=False, prompt="x",
                allow_special=False, system=None)
    return SimpleNamespace(**{**base, **given})


def test_qwen2_vl_images_of_any_size_become_their_blocks():
    """Two PNGs (13 x 17, 37 x 29) through the fixture's Qwen2-VL processor (patch 4, merge
    2): their rows of patches, and a prompt of their blocks that prefill reads."""
    model = load_pretrained(HF / "qwen2_vl", np.float64)
    spec = load_image_processor(HF / "qwen2_vl_processor")
    images, counts = model.image_inputs([IMAGES / "rgb.png", IMAGES / "rgb_large.png"], spec)
    grid = images["image_grid_thw"]
    assert counts == (grid.prod(axis=1) // 4).tolist()
    assert images["pixel_values"].shape == (grid.prod(axis=1).sum(), 96)
    ids = [i for n in counts for i in image_block(60, n, (62, 63))] + [5, 6]
    state = model.init_state(1, len(ids) + 1)
    logits = model.prefill(np.array([ids]), state, **images)
    full, _ = model.forward(input_ids=np.array([ids]), **images)
    assert np.abs(logits - full).max() < 1e-12


def test_projector_only_finetune_trains_the_projector_alone(llava_dir, tmp_path, capsys):
    """LLaVA's stage 1 on two image-caption pairs: the caption loss falls, the saved
    checkpoint differs from the original in multi_modal_projector's tensors only, and it
    loads."""
    from safetensors.numpy import load_file
    data = tmp_path / "captions" / "pairs.jsonl"
    data.parent.mkdir()
    for name in ("rgb.png", "gray.png"):
        shutil.copy(IMAGES / name, data.parent)
    data.write_text('{"image": "rgb.png", "text": "a red square"}\n'
                    '{"image": "gray.png", "text": "a grey thing"}\n')
    out = tmp_path / "out"
    assert cli.main(["finetune", "--hf", str(llava_dir), "--projector-only", "--data",
                     str(data), "--out", str(out), "--steps", "12", "--batch-size", "2",
                     "--lr", "3e-3", "--no-progress"]) == 0
    before, after = load_file(llava_dir / "model.safetensors"), load_file(
        out / "model.safetensors")
    changed = sorted(n for n in before if not np.array_equal(before[n], after[n]))
    assert changed == sorted(n for n in before if n.startswith("multi_modal_projector."))
    printed = capsys.readouterr().out
    assert "training the projector only: " in printed and "AutoModelForImageTextToText" in printed
    assert (out / "tokenizer.json").is_file() and (out / "preprocessor_config.json").is_file()
    from scratchllm.cli.projector import caption_example, read_captions
    losses = []
    for directory in (llava_dir, out):
        model, tok = load_pretrained(directory, np.float64), load_tokenizer(directory)
        spec = load_image_processor(directory)
        total = 0.0
        for image, text in read_captions(data):
            inputs, ids, targets = caption_example(model, tok, image, text, (spec, (None, None),
                                                                             None))
            logits, _ = model.forward(input_ids=ids, **inputs)
            logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            keep = targets[0] >= 0
            total -= logp[0, keep, targets[0, keep]].mean()
        losses.append(total)
    assert losses[1] < losses[0] - 0.5


def test_projector_only_refuses_what_does_not_apply(llava_dir, tmp_path, capsys):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"image": "missing.png", "text": "x"}\n')
    assert cli.main(["finetune", "--hf", str(llava_dir), "--projector-only", "--data",
                     str(data), "--out", str(tmp_path / "o")]) != 0
    assert "entry 1: no image file" in capsys.readouterr().err
    assert cli.main(["finetune", "--hf", str(HF / "llama"), "--projector-only", "--data",
                     str(data), "--out", str(tmp_path / "o")]) != 0
    assert "is not a vision-language checkpoint" in capsys.readouterr().err


def test_finetune_on_text_trains_the_language_model_alone(llava_dir, tmp_path, capsys):
    from safetensors.numpy import load_file
    out = tmp_path / "out"
    assert cli.main(["finetune", "--hf", str(llava_dir), "--data",
                     str(HF.parent / "python-docs-slice.txt"), "--out", str(out), "--steps", "2",
                     "--seq-len", "16", "--batch-size", "2", "--eval-every", "2",
                     "--no-progress"]) == 0
    before, after = load_file(llava_dir / "model.safetensors"), load_file(
        out / "model.safetensors")
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed and all(n.startswith("language_model.") for n in changed)
    assert "AutoModelForImageTextToText" in capsys.readouterr().out


def test_llava_s_own_caption_file_reads_as_pairs(tmp_path):
    import json
    from scratchllm.cli.projector import read_captions
    shutil.copy(IMAGES / "rgb.png", tmp_path)
    (tmp_path / "chat.json").write_text(json.dumps([{"id": "0", "image": "rgb.png",
                                                     "conversations": [
        {"from": "human", "value": "<image>\nRender a clear and concise summary."},
        {"from": "gpt", "value": "a red square"}]}]))
    assert read_captions(tmp_path / "chat.json") == [(tmp_path / "rgb.png", "a red square")]
    (tmp_path / "bad.json").write_text(json.dumps([{"image": "rgb.png", "conversations": []}]))
    with pytest.raises(ValueError, match="entry 1 must be a JSON object"):
        read_captions(tmp_path / "bad.json")


@pytest.mark.parametrize("name", ["llava", "qwen2_vl", "gemma3_vl"])
def test_a_frozen_encoder_skips_its_backward_and_keeps_the_projectors(name):
    """backward(..., encoder=False) (stage 1's): the projector's and the LM's gradients
    as the full backward's, the image encoder's none."""
    from hub_fixtures import expected
    ref = expected(name)
    model = load_pretrained(HF / name, np.float64)
    keys = ("input_ids", "pixel_values", "image_grid_thw")
    logits, cache = model.forward(**{k: ref[k] for k in keys if k in ref})
    G = np.random.default_rng(0).standard_normal(logits.shape)
    grads = []
    for encoder in (True, False):
        model.zero_grad()
        out = model.backward(G, cache, encoder=encoder)
        assert (out is None) != encoder
        grads.append({n: p.grad.copy() for n, p in model.named_parameters()})
    trained = {n for n, _ in model.projector_parameters()} | {
        n for n, _ in model.named_parameters() if n.startswith("lm.")}
    for n, g in grads[1].items():
        if n in trained:
            np.testing.assert_array_equal(g, grads[0][n])
        else:
            assert not g.any(), n


def test_an_images_block_of_ids():
    from scratchllm.vision import Gemma3VL, Llava, Qwen2VL
    assert image_block(60, 2, (61, 62), ([9], [9])) == [9, 61, 60, 60, 62, 9]
    assert image_block(7, 3) == [7, 7, 7]
    assert Gemma3VL.IMAGE_AROUND == ("\n\n", "\n\n")  # Gemma3Processor's full_image_sequence
    assert Llava.IMAGE_AROUND == Qwen2VL.IMAGE_AROUND == ("", "")
