"""Every public function of jax_rccl (and of its planner) has a docstring at jax.lax's level:
its arguments, its result, where it differs from jax.lax (the collectives), and an example;
and the examples run, as doctests, on the 8 CPU devices of this folder."""

from __future__ import annotations

import doctest
import inspect

import pytest

import jax_rccl
from jax_rccl import planner


def _public_functions() -> dict[str, object]:
    out = {}
    for name in jax_rccl.__all__:
        obj = getattr(jax_rccl, name)
        if inspect.isfunction(obj):
            out[f"jax_rccl.{name}"] = obj
    for name in planner.__all__:
        obj = getattr(planner, name)
        if inspect.isfunction(obj) or (inspect.isclass(obj) and obj.__module__.startswith("jax_")):
            out[f"jax_rccl.planner.{name}"] = obj
    return out


PUBLIC = _public_functions()
CHECKED = sorted(PUBLIC)
#: The collectives, the functions over mesh axes (an `axis_name` argument): their docstrings
#: also say how they differ from jax.lax.
COLLECTIVES = {
    n
    for n in jax_rccl.__all__
    if inspect.isfunction(getattr(jax_rccl, n))
    and "axis_name" in inspect.signature(getattr(jax_rccl, n)).parameters
}
#: The classes jax_rccl's functions return (Explanation, Profile): documented, with every public
#: method; their examples are those of the functions that make them.
RESULT_CLASSES = {
    f"jax_rccl.{n}": getattr(jax_rccl, n)
    for n in jax_rccl.__all__
    if inspect.isclass(getattr(jax_rccl, n))
}


def test_the_public_api_is_listed():
    assert "jax_rccl.psum" in PUBLIC and "jax_rccl.planner.plan" in PUBLIC
    assert "jax_rccl.planner.Topology" in PUBLIC
    assert len(CHECKED) >= 25, CHECKED
    assert {"psum", "all_to_all", "psend", "ragged_all_to_all", "preduce"} <= COLLECTIVES


@pytest.mark.parametrize("name", CHECKED)
def test_every_public_function_has_a_full_docstring(name):
    obj = PUBLIC[name]
    doc = inspect.getdoc(obj) or ""
    assert "Example:" in doc and ">>> " in doc, f"{name}: no Example section"
    if not inspect.isclass(obj):  # a class's docstring says what its fields are
        params = [
            p
            for p in inspect.signature(obj).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if params:
            assert "Args:" in doc, f"{name}: no Args section"
            for p in params:
                assert f"{p.name}" in doc.split("Args:", 1)[1], f"{name}: argument {p.name}"
        assert "Returns:" in doc or "Yields:" in doc, f"{name}: no Returns section"
    if name.rsplit(".", 1)[1] in COLLECTIVES:
        assert "Differences from jax.lax" in doc, f"{name}: no comparison with jax.lax"


def test_the_result_classes_are_listed():
    assert set(RESULT_CLASSES) == {"jax_rccl.Explanation", "jax_rccl.Profile"}


@pytest.mark.parametrize("name", sorted({**PUBLIC, **RESULT_CLASSES}))
def test_the_public_methods_have_docstrings(name):
    obj = {**PUBLIC, **RESULT_CLASSES}[name]
    if not inspect.isclass(obj):
        return
    assert inspect.getdoc(obj), f"{name} has no docstring"
    for attr, member in vars(obj).items():
        if attr.startswith("_") or not callable(getattr(obj, attr)):
            continue
        func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
        assert inspect.getdoc(func), f"{name}.{attr} has no docstring"


def test_preduce_says_what_it_reduces():
    doc = inspect.getdoc(jax_rccl.preduce)
    assert "op" not in inspect.signature(jax_rccl.preduce).parameters
    assert "sum only" in doc and "all_reduce" in doc


@pytest.mark.parametrize("name", [n for n in CHECKED if ">>>" in (inspect.getdoc(PUBLIC[n]) or "")])
def test_the_examples_run(name):
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    tests = finder.find(PUBLIC[name], name, globs={})
    assert tests and tests[0].examples, name
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
