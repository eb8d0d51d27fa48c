"""The notebooks: one per component, stored without outputs, and each executes cleanly."""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

FOLDER = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = ["01_bpe", "02_rope_yarn", "03_attention_gqa_kv_cache", "04_mla_absorption",
            "05_moe_balance_loss", "06_ssm_zoh_fft", "07_selective_scan", "08_tiny_lm",
            "11_one_recurrence_many_names"]


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


@pytest.mark.parametrize("name", _present())
def test_notebook_executes_without_error(name, tmp_path):
    nb = nbformat.read(FOLDER / f"{name}.ipynb", as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs)
    assert "FAIL" not in text, f"{name}: a gradient check printed FAIL"
