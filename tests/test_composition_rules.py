"""The composition layer's rules, checked on the AST of scratchllm/ (and shown to fail on small
synthetic modules that break each one):

- no public function or method outside Numba kernels takes more than 8 parameters (self and
  cls not counted): options travel as specs, a layer's arrays as one NamedTuple;
- no `locals()` (an argument bag no reader or tool can follow);
- no `importlib.import_module` / `__import__` between library modules (the CLI's lazy command
  table is the one door, and it names modules of cli/ only);
- every package's `__all__` resolves (`from scratchllm.<package> import *` works);
- no public name is defined in two modules (one definition, one place to read it).
"""
import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

from test_layering import synthetic_tree

ROOT = Path(__file__).resolve().parents[1]
MAX_PARAMS = 8
NUMBA = {"njit", "jit", "vectorize", "guvectorize", "overload", "generated_jit", "stencil"}
IMPORT_DOORS = {"cli/__init__.py"}  # the lazy command table: cli.<command> modules
PROTOCOL = {"main", "build_parser"}  # every cli command module defines both (the command table)


def python_files(root):
    """(path relative to the package folder scratchllm/, Path) of every module."""
    package = root / "scratchllm"
    return [(p.relative_to(package).as_posix(), p) for p in sorted(package.rglob("*.py"))]


def _decorator_names(node):
    for d in node.decorator_list:
        d = d.func if isinstance(d, ast.Call) else d
        yield d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")


def _n_params(fn):
    a = fn.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def _functions(tree):
    """(qualified name, node) of module-level functions and methods of module-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield f"{node.name}.{item.name}", item


def _is_public(qualname):
    return all(not part.startswith("_") or part == "__init__" for part in qualname.split("."))


def long_signatures(root):
    """['path:line name (n parameters)'] of public functions over MAX_PARAMS parameters (paths
    relative to scratchllm/, as in every list below)."""
    found = []
    for rel, path in python_files(root):
        for qualname, fn in _functions(ast.parse(path.read_text(encoding="utf-8"))):
            if (_is_public(qualname) and _n_params(fn) > MAX_PARAMS
                    and not NUMBA & set(_decorator_names(fn))):
                found.append(f"{rel}:{fn.lineno} {qualname} ({_n_params(fn)} parameters)")
    return found


def _calls(root, predicate):
    found = []
    for rel, path in python_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and predicate(rel, node.func):
                found.append(f"{rel}:{node.lineno}")
    return found


def locals_calls(root):
    return _calls(root, lambda rel, f: isinstance(f, ast.Name) and f.id == "locals")


def import_doors(root):
    """Calls of import_module / __import__ outside the CLI's command table."""
    def is_door(rel, f):
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return name in ("import_module", "__import__") and rel not in IMPORT_DOORS
    return _calls(root, is_door)


def private_imports(root):
    """['path:line name'] of private names (_x) imported from another module of the
    library: a helper used in two modules is public, or one of them owns it."""
    found = []
    for rel, path in python_files(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scratchllm"):
                found += [f"{rel}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def _module_names(tree):
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            yield from (t.id for t in targets if isinstance(t, ast.Name))


def names_defined_twice(root):
    """{public name: [files]} for names defined at module level in more than one module."""
    where = defaultdict(list)
    for rel, path in python_files(root):
        for name in set(_module_names(ast.parse(path.read_text(encoding="utf-8")))):
            command = rel.startswith("cli/") and name in PROTOCOL
            if not name.startswith("_") and not command:
                where[name].append(rel)
    return {name: files for name, files in sorted(where.items()) if len(files) > 1}


def packages(root):
    return sorted(p.parent.relative_to(root).as_posix().replace("/", ".")
                  for p in (root / "scratchllm").rglob("__init__.py"))


# ---------------------------------------------------------------------------- the library
def test_no_public_function_takes_more_than_eight_parameters():
    assert long_signatures(ROOT) == []


def test_no_locals_bags():
    assert locals_calls(ROOT) == []


def test_no_import_module_between_library_modules():
    assert import_doors(ROOT) == []


def test_no_private_name_is_imported_across_modules():
    assert private_imports(ROOT) == []


def test_no_public_name_is_defined_in_two_modules():
    assert names_defined_twice(ROOT) == {}


@pytest.mark.parametrize("package", packages(ROOT))
def test_every_package_all_resolves(package):
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", []):
        assert hasattr(module, name), f"{package}.__all__ names {name!r}, which is not bound"
    exec(f"from {package} import *", {})


# ---------------------------------------------------------------------------- the checker fails
BAD = {
    "a/wide.py": "def wide(a, b, c, d, e, f, g, h, i):\n    return a\n"
                 "class M:\n    def __init__(self, a, b, c, d, e, f, g, h, *, i):\n        pass\n"
                 "def _private(a, b, c, d, e, f, g, h, i):\n    return a\n"
                 "@njit(cache=True)\ndef kernel(a, b, c, d, e, f, g, h, i):\n    return a\n",
    "a/bag.py": "def f(x, y):\n    return g(locals())\n",
    "a/door.py": "import importlib\n_m = importlib.import_module('scratchllm.b')\n",
    "b/twice.py": "def wide(x):\n    return x\n",
    "cli/__init__.py": "import importlib\n_m = importlib.import_module('scratchllm.cli.x')\n",
    "cli/x.py": "def main(argv):\n    return 0\n",
    "cli/y.py": "def main(argv):\n    return 0\n",
    "b/peek.py": "from scratchllm.a.bag import _helper, f\n",
}


def test_checkers_catch_each_broken_rule(tmp_path):
    root = synthetic_tree(tmp_path, BAD)
    assert long_signatures(root) == ["a/wide.py:1 wide (9 parameters)",
                                     "a/wide.py:4 M.__init__ (9 parameters)"]
    assert locals_calls(root) == ["a/bag.py:2"]
    assert import_doors(root) == ["a/door.py:2"]
    assert private_imports(root) == ["b/peek.py:1 _helper"]
    assert names_defined_twice(root) == {"wide": ["a/wide.py", "b/twice.py"]}


def test_checkers_accept_a_clean_tree(tmp_path):
    root = synthetic_tree(tmp_path, {"a/ok.py": "def f(a, b, *, c=1):\n    return a\n",
                            "cli/x.py": "def main(argv):\n    return 0\n",
                            "cli/y.py": "def main(argv):\n    return 0\n"})
    assert long_signatures(root) == locals_calls(root) == import_doors(root) == []
    assert private_imports(root) == []
    assert names_defined_twice(root) == {}


def test_specs_stay_small_and_the_trunk_short():
    """No spec dataclass over 16 fields; ModelConfig's trunk under ~20."""
    import dataclasses

    from scratchllm import specs
    from scratchllm.specs import vision
    classes = {c for m in (specs, vision) for c in vars(m).values()
               if isinstance(c, type) and dataclasses.is_dataclass(c)}
    sizes = {c.__name__: len(dataclasses.fields(c)) for c in classes}
    assert {n: k for n, k in sizes.items() if k > 16} == {}
    assert sizes["ModelConfig"] <= 20
