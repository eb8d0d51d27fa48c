"""The layout's rules on the import graph of scratchllm/, parsed with ast (function-level
imports count too), and a synthetic tree that shows each rule can fail.

    specs                         the standard library only (the configs, read by every layer)
    core                          specs; nothing else of scratchllm
    tokenizer, attention, moe, ssm, linear_attention
                                  core, and each other where the math needs it
    lm                            the component packages
    vision                        lm (the Vision Transformer is built from lm's Block)
    hub                           lm and vision (Hugging Face checkpoints), beside them
    dist                          core (process groups, collectives; mpi4py optional)
    train                         lm, hub and dist (and what they stand on)
    serve                         lm (the serving engine, paged and quantised caches)
    teach/arch, teach/sizing, teach/rules, teach/serving
                                  the standard library and specs only
    teach/drills, teach/exercises the component packages and grads
    experiments                   lm, hub, train, teach (the claims measured, and the tools)
    cli                           everything; nothing imports cli (but __main__)
No cycles; a package's __init__ re-exports only its own modules' names; a function-level
import is an optional dependency (matplotlib; the notebooks extra; mpi4py, the dist extra)
with a comment saying so, or one of the few LAZY library modules that would otherwise load
numpy where it is not needed.
"""
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = {"tokenizer", "attention", "moe", "ssm", "linear_attention"}
ALLOWED = {  # top-level part of scratchllm -> the parts it may import
    "specs": set(),
    "core": {"specs"},
    "tokenizer": {"core", "specs"},
    "attention": {"core", "specs"} | COMPONENTS,
    "moe": {"core", "specs"} | COMPONENTS,
    "ssm": {"core", "specs"} | COMPONENTS,
    "linear_attention": {"core", "specs"} | COMPONENTS,
    "lm": {"core", "specs"} | COMPONENTS,
    "vision": {"core", "specs", "lm"} | COMPONENTS,
    "hub": {"core", "specs", "lm", "vision"} | COMPONENTS,
    "dist": {"core", "specs"},
    "train": {"core", "specs", "lm", "hub", "vision", "dist"} | COMPONENTS,
    "serve": {"core", "specs", "lm"} | COMPONENTS,
    "teach": {"core", "specs"} | COMPONENTS,
    "experiments": {"core", "specs", "lm", "hub", "train", "teach"} | COMPONENTS,
    "cli": {"core", "specs", "lm", "train", "teach", "hub", "vision", "dist", "serve",
            "experiments"} | COMPONENTS,
    "__main__": {"cli"},
    "__init__": set(),
}
STDLIB_ONLY = ("scratchllm.teach.sizing", "scratchllm.teach.rules", "scratchllm.teach.arch",
               "scratchllm.teach.serving", "scratchllm.specs")
# ... each of these modules (and every module of the specs package) imports only the standard
# library and the others of them
OPTIONAL = {"matplotlib", "sentencepiece", "mpi4py", "PIL",  # the only modules a function may
            "nbformat", "nbclient", "nbconvert"}  # (the notebooks extra: cli/notebooks.py)
LAZY = {("scratchllm.cli.size", "scratchllm.cli.hardware"),  # (importer, library module) a
        ("scratchllm.core.fp8", "ml_dtypes")}  # function may import: `size --hw this`
# measures with numpy, every other `size` loads none; ml_dtypes comes with the first FP8 cast


def modules(root, package="scratchllm"):
    """{dotted module name: path} of every .py file under root/package."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name, path, mods=()):
    """[(imported module, line number, is_top_level)] of one module, relative imports
    resolved; `from M import n` is module M.n when that is in `mods`, else M."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in mods else base, node.lineno, id(node) in top))
    return out


def import_graph(root, package="scratchllm"):
    """{module: {modules of the package it imports}}."""
    mods = modules(root, package)
    return {name: {t for t, _, _ in imports(name, path, mods) if t in mods} - {name}
            for name, path in mods.items()}


def find_cycles(graph):
    """Every import cycle, each as a list of modules (first == last)."""
    cycles, state = [], {}

    def visit(v, path):
        state[v] = "open"
        for w in sorted(graph.get(v, ())):
            if state.get(w) == "open":
                cycles.append(path[path.index(w):] + [w])
            elif w not in state:
                visit(w, path + [w])
        state[v] = "done"

    for v in sorted(graph):
        if v not in state:
            visit(v, [v])
    return cycles


def part(module):
    """The layer a module belongs to: scratchllm.attention.gqa -> "attention"."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def layer_violations(graph):
    """[(module, imported module)] that break ALLOWED."""
    bad = []
    for src, targets in graph.items():
        for t in targets:
            if part(t) != part(src) and part(t) not in ALLOWED.get(part(src), set()):
                bad.append((src, t))
    return sorted(bad)


def reexports(root, package="scratchllm"):
    """[(package __init__, imported module)] where an __init__ imports from another package."""
    bad = []
    mods = modules(root, package)
    for name, path in mods.items():
        if path.name == "__init__.py":
            bad += [(name, t) for t, _, _ in imports(name, path, mods)
                    if t.startswith(package + ".") and not t.startswith(name + ".")]
    return sorted(set(bad))


def stray_function_imports(root, package="scratchllm"):
    """[(module, line, imported)] of imports inside functions that are not a commented
    optional dependency."""
    bad = []
    for name, path in modules(root, package).items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, lineno, top_level in imports(name, path):
            if top_level:
                continue
            commented = any("#" in lines[i] for i in (lineno - 2, lineno - 1) if i >= 0)
            allowed = target.partition(".")[0] in OPTIONAL or (name, target) in LAZY
            if not allowed or not commented:
                bad.append((name, lineno, target))
    return sorted(set(bad))


def pure_python_modules(root):
    return [m for m in modules(root) if m in STDLIB_ONLY or m.startswith("scratchllm.specs.")]


def non_stdlib_imports(root, module):
    """What `module` imports besides the standard library and the pure-Python modules."""
    mods, pure = modules(root), pure_python_modules(root)
    return sorted({t for t, _, _ in imports(module, mods[module], mods)
                   if t.partition(".")[0] not in sys.stdlib_module_names and t not in pure})


# ---------------------------------------------------------------------------- the library
def test_no_import_cycles():
    assert find_cycles(import_graph(ROOT)) == []


def test_layers_import_only_what_they_stand_on():
    assert layer_violations(import_graph(ROOT)) == []


def test_nothing_imports_cli_but_the_entry_point():
    users = {src for src, ts in import_graph(ROOT).items() for t in ts
             if part(t) == "cli" and part(src) != "cli"}
    assert users == {"scratchllm.__main__"}


def test_packages_reexport_only_their_own_names():
    assert reexports(ROOT) == []


def test_function_level_imports_are_commented_optional_dependencies():
    assert stray_function_imports(ROOT) == []


def test_sizing_rules_arch_and_specs_are_pure_python():
    for module in pure_python_modules(ROOT):
        assert non_stdlib_imports(ROOT, module) == [], module


# ---------------------------------------------------------------------------- the checker fails
def synthetic_tree(tmp_path, files):
    """A scratchllm/ tree of {relative path: source} under tmp_path (the checkers' examples)."""
    for rel, text in files.items():
        path = tmp_path / "scratchllm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_checker_catches_a_cycle_a_layer_breach_a_reexport_and_a_stray_import(tmp_path):
    root = synthetic_tree(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "from scratchllm.lm.model import LM\n",  # re-export, breach
        "core/ops.py": "from scratchllm.core import nn\n",
        "core/nn.py": "from scratchllm.core.ops import x\n",  # cycle ops <-> nn
        "lm/__init__.py": "",
        "lm/model.py": "def f():\n    import numpy\n",  # function-level, not optional
        "teach/__init__.py": "",
        "teach/sizing.py": "import numpy as np\n",  # not the standard library
    })
    graph = import_graph(root)
    assert ["scratchllm.core.nn", "scratchllm.core.ops", "scratchllm.core.nn"] in \
        find_cycles(graph)
    assert ("scratchllm.core", "scratchllm.lm.model") in layer_violations(graph)
    assert ("scratchllm.core.ops", "scratchllm.core.nn") not in layer_violations(graph)
    assert ("scratchllm.core", "scratchllm.lm.model") in reexports(root)
    assert ("scratchllm.lm.model", 2, "numpy") in stray_function_imports(root)
    assert non_stdlib_imports(root, "scratchllm.teach.sizing") == ["numpy"]


def test_checker_accepts_a_clean_tree(tmp_path):
    root = synthetic_tree(tmp_path, {
        "__init__.py": "",
        "core/__init__.py": "from .ops import f\n",
        "core/ops.py": "import math\n",
        "lm/__init__.py": "",
        "lm/model.py": ("from scratchllm.core import ops\n\n\ndef plot():\n"
                        "    # optional dependency\n    import matplotlib\n"),
    })
    graph = import_graph(root)
    assert find_cycles(graph) == [] and layer_violations(graph) == []
    assert reexports(root) == [] and stray_function_imports(root) == []
