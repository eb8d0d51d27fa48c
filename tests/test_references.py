"""Every reference resolves. A `Reference:` in a docstring names, item by item (`;` between),
a paper (an arXiv id), an upstream file (`owner/repo path/to/file.ext`), or a file of this
repository that exists; every repository path mentioned anywhere in the code, tests,
notebooks, benchmarks or README exists; nothing cites the design notes outside it; and no file
says "issue N" (a tracker number the repository does not hold: say what the thing is)."""
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARXIV = re.compile(r"arXiv \d{4}\.\d{4,5}")
UPSTREAM = re.compile(r"\b[\w.-]+/[\w.-]+ [\w./-]+\.[A-Za-z]\w*\b")
LOCAL = re.compile(r"(?<![\w/.-])((?:scratchllm|tests|notebooks|grads|benchmarks|tools)/"
                   r"[\w/.-]*[\w/])")
NOTES = re.compile(r"\bREFERENCE(\.md)?\b|\bDESIGN(\.md)?\b")
TRACKER = re.compile(r"\bissues? ?[#-]?\d+", re.I)  # issue 14, Issue 17's, issue #4, issue-18
DATA = ("scratchllm/data/", "tests/fixtures/")  # corpora and fixtures: other people's words
GENERATED = tuple(line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                  if line.strip().endswith("/"))  # folders the code writes (benchmarks/data/)


def exists(path, root=ROOT):
    return (root / path).exists() or (path + "/").startswith(GENERATED)


def sources():
    """The text files of the project that a reader follows references in."""
    files = [ROOT / "README.md"]
    for folder, pattern in (("scratchllm", "*.py"), ("grads", "*.py"), ("tests", "*.py"),
                            ("benchmarks", "*.py"), ("benchmarks", "*.md"),
                            ("notebooks", "*.ipynb"), ("tools", "*.py")):
        files += sorted((ROOT / folder).rglob(pattern))
    return [f for f in files if "__pycache__" not in f.parts and f != Path(__file__).resolve()]


def tracked_text_files():
    """(path, text) of every text file git tracks, less the data the project ships."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split("\0")
    for rel in listed:
        path = ROOT / rel
        if rel.startswith(DATA) or not path.is_file() or path == Path(__file__).resolve():
            continue
        try:
            yield rel, path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file
            continue


def tracker_numbers(text):
    """Every "issue N" in text."""
    return [m.group(0) for m in TRACKER.finditer(text)]


def reference_items(text):
    """The `;`-separated items of every `Reference:` clause (up to a blank line or the end of
    the docstring), whitespace collapsed."""
    items = []
    for match in re.finditer(r"Reference:(.*?)(?:\n\s*\n|\"\"\"|$)", text, re.S):
        clause = " ".join(match.group(1).split()).rstrip(".")
        items += [item.strip() for item in clause.split(";") if item.strip()]
    return items


def unresolved(item, root=ROOT):
    """Why a reference item does not resolve, or None when it does."""
    local = LOCAL.findall(item)
    missing = [p for p in local if not exists(p, root)]
    if missing:
        return f"{missing} do not exist"
    if ARXIV.search(item) or UPSTREAM.search(item) or local:
        return None
    return "names no arXiv id, upstream owner/repo file or repository file"


def test_every_reference_item_resolves():
    bad = [(str(f.relative_to(ROOT)), item, unresolved(item))
           for f in ROOT.joinpath("scratchllm").rglob("*.py")
           for item in reference_items(f.read_text(encoding="utf-8")) if unresolved(item)]
    assert bad == []


def test_the_library_has_references_to_check():
    n = sum(len(reference_items(f.read_text(encoding="utf-8")))
            for f in ROOT.joinpath("scratchllm").rglob("*.py"))
    assert n >= 15


def test_every_repository_path_mentioned_exists():
    bad = sorted({(str(f.relative_to(ROOT)), p) for f in sources()
                  for p in LOCAL.findall(f.read_text(encoding="utf-8"))
                  if not exists(p)})
    assert bad == []


def test_nothing_cites_the_design_notes():
    bad = [(str(f.relative_to(ROOT)), m.group(0)) for f in sources()
           for m in NOTES.finditer(f.read_text(encoding="utf-8"))]
    assert bad == []


def test_the_rules_fail_on_bad_references(tmp_path):
    assert unresolved("Su et al. 2021 (arXiv 2104.09864) §3.4") is None
    assert unresolved("huggingface/transformers src/transformers/modeling_rope_utils.py") is None
    assert unresolved("the derivation in tests/test_references.py") is None
    assert unresolved("REFERENCE §5") is not None
    assert unresolved("HF repeat_kv") is not None
    assert unresolved("the derivation in notebooks/99_missing.ipynb") is not None
    assert reference_items('"""x.\n    Reference: A (arXiv 1234.56789); B.\n    """') == \
        ["A (arXiv 1234.56789)", "B"]


def test_no_file_cites_a_tracker_number():
    bad = [(rel, hit) for rel, text in tracked_text_files() for hit in tracker_numbers(text)]
    assert bad == []


def test_the_tracker_rule_fails_on_a_synthetic_text():
    text = "Flash attention (issue 14); Issue 17's rerun; issues #4 and 5; the issue-18 branch."
    assert tracker_numbers(text) == ["issue 14", "Issue 17", "issues #4", "issue-18"]
    assert tracker_numbers("the reported case; 64k characters; a tissue 3 mm thick") == []
