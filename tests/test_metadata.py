"""The package metadata: the range of jax releases it declares is the tested one (0.10.2 and
0.11.x, the releases jax_rccl/_compat.py keeps), the same for the build, the package and the
Makefile's first install, and the installed jax is in it."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import requires, version
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
TESTED = Requirement("jax>=0.10.2,<0.12")


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _jax(specs: list[str]) -> Requirement:
    (req,) = [Requirement(s) for s in specs if Requirement(s).name == "jax"]
    return req


def test_the_declared_jax_range_is_the_tested_one():
    d = _pyproject()
    assert _jax(d["project"]["dependencies"]).specifier == TESTED.specifier
    assert _jax(d["build-system"]["requires"]).specifier == TESTED.specifier
    makefile = (ROOT / "Makefile").read_text()
    pinned = re.findall(r'"(jax[<>=!~][^"]*)"', makefile)
    assert pinned and all(Requirement(p).specifier == TESTED.specifier for p in pinned), pinned


def test_the_range_holds_the_tested_releases_only():
    for v, inside in [
        ("0.10.1", False),
        ("0.10.2", True),
        ("0.11.0", True),
        ("0.11.9", True),
        ("0.12.0", False),
    ]:
        assert TESTED.specifier.contains(Version(v)) == inside, v


def test_the_installed_package_says_so_and_jax_is_in_range():
    assert TESTED.specifier.contains(Version(version("jax")))
    installed = _jax(requires("jax_rccl") or [])
    assert installed.specifier == TESTED.specifier
