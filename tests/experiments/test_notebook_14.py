"""Notebook 14 is written by notebooks/make_14_inside_a_model.py: the committed notebook is
what the committed generator writes, byte for byte (edit the generator, re-run it)."""
import runpy
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent.parent / "notebooks"


def test_the_generator_writes_the_committed_notebook(tmp_path):
    make = runpy.run_path(str(NOTEBOOKS / "make_14_inside_a_model.py"))["main"]
    written = make(tmp_path / "14.ipynb")
    assert written.read_bytes() == (NOTEBOOKS / "14_inside_a_model.ipynb").read_bytes()
