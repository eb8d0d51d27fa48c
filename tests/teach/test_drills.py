"""Drills: the library's own implementation passes every check; an empty or wrong body fails."""
import numpy as np
import pytest

from scratchllm.cli import drill as drill_cli
from scratchllm.teach.drills.bank import DRILLS
from scratchllm.teach.drills.core import run_checks

REQUIRED = {"rmsnorm_backward": 5, "sdpa_backward": 15, "rope_backward": 10, "gqa_forward": 20,
            "balance_loss_backward": 15, "topk_router_forward": 10, "zoh": 10,
            "ssm_kernel": 10, "fft_conv_backward": 15,
            "selective_scan_backward": 20, "bpe_merge_step": 25,
            "moe_forward": 20, "ssm_recurrent": 10, "selective_scan_forward": 15,
            "flash_attention_forward": 20, "alibi_bias": 5, "sliding_window_mask": 5,
            "linear_attention_recurrent": 10, "delta_rule_step": 15, "ssd_chunk": 25}


def test_the_required_drills_exist_with_their_target_times():
    assert {n: DRILLS[n].minutes for n in REQUIRED if n in DRILLS} == REQUIRED


@pytest.mark.parametrize("name", list(DRILLS))
def test_library_solution_passes_every_check(name):
    results = run_checks(DRILLS[name], DRILLS[name].solution)
    assert len(results) >= 2
    assert all(r.passed for r in results), results


@pytest.mark.parametrize("name", list(DRILLS))
def test_empty_template_fails_every_check(name):
    namespace = {}
    exec(DRILLS[name].template, namespace)
    results = run_checks(DRILLS[name], namespace[name])
    assert not any(r.passed for r in results), results
    assert all("NotImplementedError" in r.detail for r in results)


def _scaled(solution, factor):
    """A wrong body: the right answer with every float output scaled by `factor`."""
    def wrong(*args, **kwargs):
        out = solution(*args, **kwargs)
        if isinstance(out, tuple):
            return tuple(o * factor if np.issubdtype(np.asarray(o).dtype, np.floating) else o
                         for o in out)
        return out * factor
    return wrong


@pytest.mark.parametrize("name", [n for n in DRILLS if n not in ("bpe_merge_step",
                                                                 "token_healing",
                                                                 "document_mask")])
def test_a_slightly_wrong_body_fails_a_check(name):
    results = run_checks(DRILLS[name], _scaled(DRILLS[name].solution, 1.001))
    assert not all(r.passed for r in results), results


def test_token_healing_that_keeps_only_the_exact_token_fails():
    def exact_only(token_bytes, prompt_ids, vocab_size):
        allowed = np.zeros(vocab_size, dtype=bool)
        allowed[prompt_ids[-1]] = True
        return prompt_ids[:-1], allowed
    assert not all(r.passed for r in run_checks(DRILLS["token_healing"], exact_only))


def test_bpe_step_breaking_ties_the_wrong_way_fails():
    def smallest_on_ties(word_counts):
        counts = {}
        for w, c in word_counts.items():
            for pair in zip(w, w[1:]):
                counts[pair] = counts.get(pair, 0) + c
        best = min(counts, key=lambda p: (-counts[p], p))
        return best, DRILLS["bpe_merge_step"].solution(word_counts)[1]

    results = run_checks(DRILLS["bpe_merge_step"], smallest_on_ties)
    assert not results[0].passed and "expected (b's', b't')" in results[0].detail


def test_rmsnorm_without_the_mean_term_fails_the_gradient_check():
    def no_mean_term(dy, x, g, eps=1e-5):
        r = 1 / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
        return dy * g * r, np.sum(dy * x * r, axis=0)

    results = run_checks(DRILLS["rmsnorm_backward"], no_mean_term)
    assert [r.passed for r in results] == [False, False]
    assert "FAIL" in results[0].detail


def test_cli_start_writes_the_template_then_check_reports(tmp_path, capsys):
    folder = str(tmp_path / "drills")
    assert drill_cli.main(["start", "zoh", "--dir", folder]) == 0
    path = tmp_path / "drills" / "zoh.py"
    assert path.read_text() == DRILLS["zoh"].template
    assert drill_cli.main(["check", "zoh", "--dir", folder]) == 1
    out = capsys.readouterr().out
    assert "FAIL  equals scratchllm.ssm.zoh_forward" in out and "0/3 checks pass" in out
    path.write_text("import numpy as np\n\ndef zoh(A, B, delta):\n"
                    "    z = delta[:, None] * A\n"
                    "    safe = np.where(A == 0, 1.0, A)\n"
                    "    b = np.where(A == 0, delta[:, None], np.expm1(z) / safe) * B\n"
                    "    return np.exp(z), b\n")
    assert drill_cli.main(["check", "zoh", "--dir", folder]) == 0
    out = capsys.readouterr().out
    assert "3/3 checks pass" in out and "target 10:00 (within target)" in out


def test_cli_refuses_an_unknown_drill(capsys):
    with pytest.raises(SystemExit):
        drill_cli.main(["start", "no_such_drill"])
    assert "one of: rmsnorm_backward" in capsys.readouterr().err


def test_cli_start_does_not_overwrite_work(tmp_path):
    folder = str(tmp_path)
    assert drill_cli.main(["start", "ssm_kernel", "--dir", folder]) == 0
    (tmp_path / "ssm_kernel.py").write_text("# my work")
    assert drill_cli.main(["start", "ssm_kernel", "--dir", folder]) == 1
    assert (tmp_path / "ssm_kernel.py").read_text() == "# my work"


def test_document_mask_without_restarting_positions_fails():
    """(The drill's outputs are bool and int: the scaled body above cannot plant an error.)"""
    def wrong(doc_ids):
        mask, _ = DRILLS["document_mask"].solution(doc_ids)
        return mask, np.arange(len(doc_ids))
    results = run_checks(DRILLS["document_mask"], wrong)
    assert [r.passed for r in results] == [False, True], results
