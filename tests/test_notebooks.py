"""The notebooks: one per component, stored without outputs, each opens with the course's
import lines, executes cleanly within its time budget and saves its figures as PNGs; the
course index notebooks/README.md lists every one of them. Executing them is the slow tier's
(`python -m pytest -q -m slow`); their structure and the course index are checked in both."""
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).resolve().parent.parent / "notebooks"
HEADER = "import numpy as np\nimport matplotlib.pyplot as plt\n\nimport grads\n"
# Each notebook must run in under 60 s on 2 cores (a quiet machine; notebooks/README.md has
# the measured times). CI machines share their cores (up to 8 jobs here, load averages of 15
# seen), which stretches wall time 5-8x but CPU time little. So the test bounds the kernel's
# CPU seconds (user + system, its threads and child processes), with twice the budget as
# headroom for what a loaded machine still adds (cache misses, BLAS threads spinning): over
# 120 CPU seconds a notebook is too slow on any machine.
BUDGET_S, HEADROOM = 60, 2
CPU_CELL = ("import resource as _r\n"
            "print('cpu seconds', sum(u.ru_utime + u.ru_stime for u in "
            "(_r.getrusage(_r.RUSAGE_SELF), _r.getrusage(_r.RUSAGE_CHILDREN))))")
EXPECTED = ["01_bpe", "02_rope_yarn", "03_attention_gqa_kv_cache", "04_mla_absorption",
            "05_moe_balance_loss", "06_ssm_zoh_fft", "07_selective_scan", "08_tiny_lm",
            "09_flash_attention", "10_positions",
            "11_one_recurrence_many_names", "12_serving", "13_parallelism",
            "14_inside_a_model"]


def _present():
    return sorted(p.stem for p in FOLDER.glob("*.ipynb"))


def test_every_component_has_its_notebook():
    assert _present() == EXPECTED


@pytest.mark.parametrize("name", _present())
def test_notebook_is_stored_without_outputs(name):
    nb = nbformat.read(FOLDER / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert any(c.cell_type == "markdown" and "$" in c.source for c in nb.cells), \
        "a notebook derives its backward in Markdown math"


@pytest.mark.slow  # executing the 14 notebooks is most of a minute: the exhaustive tier
@pytest.mark.parametrize("name", _present())
def test_notebook_executes_without_error(name, tmp_path):
    nb = nbformat.read(FOLDER / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=600, startup_timeout=600,  # hung kernels only: a loaded
                            kernel_name="python3",  # machine can take over 60 s to start one
                            resources={"metadata": {"path": str(tmp_path)}})
    nb.cells.append(nbformat.v4.new_code_cell(CPU_CELL))
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    seconds = time.perf_counter() - start
    cpu = float(nb.cells.pop().outputs[0]["text"].split()[-1])
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "FAIL" not in text, f"{name}: a gradient check printed FAIL"
    assert cpu < BUDGET_S * HEADROOM, \
        f"{name} took {cpu:.0f} CPU s ({seconds:.0f} s wall; budget {BUDGET_S} s)"
    shown = sum(c.source.count("plt.show()") for c in nb.cells if c.cell_type == "code")
    saved = sorted(p.name for p in tmp_path.glob("*.png"))
    assert shown and len(saved) == shown and all(s.startswith(name) for s in saved), saved


@pytest.mark.parametrize("name", _present())
def test_notebook_opens_with_the_course_imports(name):
    nb = nbformat.read(FOLDER / f"{name}.ipynb", as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    assert first.source.startswith(HEADER), first.source[:200]


def _readme_rows():
    """{notebook: row cells} of the course table in notebooks/README.md, in course order."""
    rows = {}
    for line in (FOLDER / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\| *\d+ *\| *\[`([\w.]+)`\]\(([^)]+)\)", line)
        if m:
            assert m.group(2) == f"{m.group(1)}.ipynb", line
            rows[m.group(1)] = [cell.strip() for cell in line.strip("|").split("|")]
    return rows


def test_readme_lists_every_notebook_once():
    rows = _readme_rows()
    assert sorted(rows) == _present()


def test_readme_names_only_drills_exercises_and_prerequisites_that_exist():
    from scratchllm.teach.drills.bank import DRILLS
    from scratchllm.teach.exercises import EXERCISES
    rows = _readme_rows()
    order = list(rows)
    for name, (_, _, _, prereq, runs, drills, exercises) in rows.items():
        for p in re.findall(r"\d\d", prereq):
            earlier = [n for n in order[:order.index(name)] if n.startswith(p)]
            assert earlier, f"{name}: prerequisite {p} is not an earlier notebook"
        assert re.fullmatch(r"\d+ s", runs), f"{name}: run time {runs!r}, expected e.g. '9 s'"
        assert int(runs[:-2]) < BUDGET_S, f"{name}: measured {runs}, budget {BUDGET_S} s"
        for d in re.findall(r"`(\w+)`", drills):
            assert d in DRILLS, f"{name}: unknown drill {d}"
        for e in re.findall(r"Ex\. (\d+)", exercises):
            assert int(e) in EXERCISES, f"{name}: unknown exercise {e}"
    listed = {d for _, *_, drills, _ in rows.values() for d in re.findall(r"`(\w+)`", drills)}
    assert listed == set(DRILLS), f"drills in no notebook's row: {set(DRILLS) - listed}"


@pytest.mark.slow
def test_html_command_writes_executed_pages_with_figures(tmp_path, capsys):
    from scratchllm.cli import notebooks as notebooks_cli
    site = tmp_path / "site"
    assert notebooks_cli.main(["--html", str(site), "--only", "02_rope_yarn"]) == 0
    page = (site / "02_rope_yarn.html").read_text(encoding="utf-8")
    assert "data:image/png;base64," in page and "max rel err" in page  # figure, check table
    assert (site / "02_rope_yarn.png").read_bytes()[:4] == b"\x89PNG"
    assert '<a href="02_rope_yarn.html">' in (site / "index.html").read_text()
    assert notebooks_cli.main(["--html", str(site), "--only", "99_nope"]) == 1
    assert "no notebook named ['99_nope']" in capsys.readouterr().err


def test_html_command_follows_the_readme_order():
    from scratchllm.cli import notebooks as notebooks_cli
    assert notebooks_cli.course_order(FOLDER) == list(_readme_rows())
