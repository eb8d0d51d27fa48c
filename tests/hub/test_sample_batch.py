"""Several prompts as one padded batch: generate_batch_ids on an encoder-decoder's padded
sources (t5; switch in the slow tier) gives each row what generate_seq2seq_ids gives the
source alone, greedy and sampled (row b with its own Generator) (Switch's sources padded on the right, as its
tokenizer pads them: its experts' capacity goes to a sequence's tokens in order, so left
padding would take capacity before the real tokens, in transformers too); and `sample --hf DIR
--prompt A --prompt B` prints, for a decoder (left padding) and an encoder-decoder, what
`sample` prints for each prompt alone."""
import numpy as np
import pytest

from scratchllm import cli
from scratchllm.hub import load_pretrained
from scratchllm.lm import generate_batch_ids, generate_seq2seq_ids, pad_rows
from hub_fixtures import HF

CASES = [("t5", False), ("t5", True), pytest.param("switch", False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("name, left", CASES)
def test_a_padded_source_batch_samples_what_each_source_alone_samples(name, left):
    model = load_pretrained(HF / name, dtype=np.float64)
    rng = np.random.default_rng(0)
    rows = [rng.integers(3, model.cfg.vocab_size, n).tolist() + [1] for n in (6, 2, 4)]
    ids, mask = pad_rows(rows, left=left)
    greedy = generate_batch_ids(model, ids, mask, 6, None, temperature=0)
    drawn = generate_batch_ids(model, ids, mask, 6, [np.random.default_rng(s) for s in
                                                       (1, 2, 3)], temperature=1.0)
    for b, row in enumerate(rows):
        assert greedy[b] == list(generate_seq2seq_ids(model, row, 6, None, temperature=0))
        assert drawn[b] == list(generate_seq2seq_ids(model, row, 6, np.random.default_rng(
            b + 1), temperature=1.0))


def _printed(capsys, name, prompts, *flags):
    argv = ["sample", "--hf", str(HF / name), "--max-tokens", "6", *flags]
    assert cli.main(argv + [a for p in prompts for a in ("--prompt", p)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("name", ["t5", "llama", "mamba", "rwkv"])  # rwkv: one by one
@pytest.mark.parametrize("flags", [("--temperature", "0"), ("--seed", "3")])
def test_sample_with_several_prompts_prints_each_as_alone(capsys, name, flags):
    prompts = ["the cat is here.", "a", "def f(x): return"]
    batch = _printed(capsys, name, prompts, *flags).splitlines()
    assert len(batch) == len(prompts)
    for b, prompt in enumerate(prompts, 1):
        alone = _printed(capsys, name, [prompt], *flags).rstrip("\n")
        assert batch[b - 1] == f"[{b}] {alone}"


def test_several_prompts_refuse_chat_and_heal(capsys):
    for flags in (["--heal"], ["--chat", "hi"]):
        assert cli.main(["sample", "--hf", str(HF / "llama"), "--prompt", "a", "--prompt",
                         "b", *flags]) != 0
        assert "several --prompt values" in capsys.readouterr().err
