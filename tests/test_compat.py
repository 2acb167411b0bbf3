"""jax_rccl/_compat.py is the one module that imports JAX internals (``jax._src``), and its table
names every internal module it imports: a new JAX release means reading that file only."""

from __future__ import annotations

import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("jax_rccl", "jax_rccl_plugin")


def _internal_imports(path: str) -> set[str]:
    """The ``jax._src`` modules a source file imports, at any depth (lazy imports included)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            names = names if node.module.startswith("jax._src") else [node.module]
        else:
            continue
        found.update(n for n in names if n == "jax._src" or n.startswith("jax._src."))
    return found


def _sources():
    for package in PACKAGES:
        for name in sorted(os.listdir(os.path.join(ROOT, package))):
            if name.endswith(".py"):
                yield os.path.join(package, name)


def test_only_compat_imports_jax_internals():
    offenders = {
        rel: sorted(_internal_imports(os.path.join(ROOT, rel)))
        for rel in _sources()
        if rel != os.path.join("jax_rccl", "_compat.py")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert offenders == {}, f"import JAX internals through jax_rccl/_compat.py: {offenders}"


def _table(doc: str) -> set[str]:
    """The modules the docstring's table names: ``a.b`` or ``a.b / c`` (a.b and a.c)."""
    out = set()
    for first, second in re.findall(r"^``([\w.]+)(?: / ([\w.]+))?``", doc, re.M):
        out.add(first)
        if second:
            out.add(f"{first.rsplit('.', 1)[0]}.{second}" if "." in first else second)
    return out


def test_compat_table_names_every_internal_module_it_imports():
    path = os.path.join(ROOT, "jax_rccl", "_compat.py")
    with open(path) as f:
        doc = ast.get_docstring(ast.parse(f.read()))
    table = _table(doc)
    assert {"core", "interpreters.mlir", "lib.mlir.dialects.hlo"} <= table, table
    missing = []
    for name in _internal_imports(path):
        m = name[len("jax._src.") :] if name != "jax._src" else ""
        # Covered: a module of the table, a package holding one, or a name inside one.
        if not m or any(m == t or t.startswith(m + ".") or m.startswith(t + ".") for t in table):
            continue
        missing.append(m)
    assert not missing, f"jax_rccl/_compat.py imports {sorted(missing)} without a line in its table"
