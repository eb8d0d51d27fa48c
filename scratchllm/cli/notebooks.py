"""python -m scratchllm notebooks --html DIR: the course's notebooks, executed, as HTML pages
with their figures (for readers without Jupyter), in the order of notebooks/README.md.

    python -m scratchllm notebooks --html site/                 # every notebook, + index.html
    python -m scratchllm notebooks --html site/ --only 02_rope_yarn,05_moe_balance_loss

Each notebook runs in a fresh kernel with DIR as its working directory (so its PNGs land
there too); nbconvert writes DIR/NAME.html with the figures embedded. Needs the `notebooks`
extra: pip install "scratchllm[notebooks]" (nbclient, nbconvert, ipykernel).
"""
import html
import re
import time
from pathlib import Path

from scratchllm.cli.common import Parser, run

SOURCE = Path(__file__).resolve().parents[2] / "notebooks"  # the repository's notebooks/


def course_order(folder):
    """Notebook names in the order of folder/README.md's table, then any it does not list."""
    names = sorted(p.stem for p in folder.glob("*.ipynb"))
    readme = folder / "README.md"
    listed = re.findall(r"^\| *\d+ *\| *\[`([\w.]+)`\]", readme.read_text(encoding="utf-8"),
                        re.M) if readme.exists() else []
    return [n for n in listed if n in names] + [n for n in names if n not in listed]


def build_parser():
    parser = Parser("notebooks", __doc__)
    parser.add_argument("--html", required=True, metavar="DIR", help="folder for the pages")
    parser.add_argument("--source", default=str(SOURCE), help="folder of the .ipynb files")
    parser.add_argument("--only", help="comma-separated notebook names (default: all)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (300)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.timeout < 1:
        parser.error(f"--timeout must be >= 1, got {args.timeout}")
    return run("notebooks", _notebooks, args)


def _notebooks(args):
    source, out = Path(args.source), Path(args.html)
    if not source.is_dir():
        raise FileNotFoundError(f"no notebooks folder {source}: pass --source DIR")
    names = course_order(source)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise ValueError(f"--only: no notebook named {unknown} in {source}; "
                             f"known: {', '.join(names)}")
        names = [n for n in names if n in wanted]
    try:
        render = _renderer(args.timeout)
    except ImportError as e:
        raise OSError(f"{e.name} is not installed: pip install \"scratchllm[notebooks]\"") from e
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        start = time.perf_counter()
        (out / f"{name}.html").write_text(render(source / f"{name}.ipynb", out), encoding="utf-8")
        print(f"{out / name}.html  ({time.perf_counter() - start:.0f} s)", flush=True)
    links = "\n".join(f'<li><a href="{n}.html">{html.escape(n)}</a></li>' for n in names)
    (out / "index.html").write_text(f"<!doctype html><title>scratchllm notebooks</title>\n"
                                    f"<h1>scratchllm notebooks</h1>\n<ol>\n{links}\n</ol>\n",
                                    encoding="utf-8")
    print(f"{out / 'index.html'}: {len(names)} notebooks")
    return 0


def _renderer(timeout):
    """render(path, workdir) -> HTML of the executed notebook; ImportError without the extra."""
    import nbformat  # optional dependency (the notebooks extra)
    from nbclient import NotebookClient  # optional dependency (the notebooks extra)
    from nbclient.exceptions import CellExecutionError  # optional dependency (as above)
    from nbconvert import HTMLExporter  # optional dependency (the notebooks extra)

    def render(path, workdir):
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(workdir)}})
        try:
            client.execute()
        except CellExecutionError as e:
            raise ValueError(f"{path.name}: a cell failed: {str(e).strip().splitlines()[-1]}")
        return HTMLExporter().from_notebook_node(nb)[0]
    return render
