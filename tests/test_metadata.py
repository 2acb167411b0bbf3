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


def test_the_ucx_wheel_is_the_ucx_extra_the_tests_and_the_build_take():
    """The UCX network backend's UCX: the [ucx] extra (only on the platforms the wheel exists
    for), which the [test] extra takes, so the tests run on UCX; its headers are a build
    requirement (no library is linked: a build of a wheel has the backend), and the Makefile
    installs it before its first build, so that build has the backend too."""
    d = _pyproject()
    (ucx,) = [Requirement(r) for r in d["project"]["optional-dependencies"]["ucx"]]
    assert ucx.name == "libucx-cu13" and ucx.marker is not None
    assert ucx.marker.evaluate({"sys_platform": "linux", "platform_machine": "x86_64"})
    assert not ucx.marker.evaluate({"sys_platform": "darwin", "platform_machine": "arm64"})
    assert "jax_rccl[ucx]" in d["project"]["optional-dependencies"]["test"]
    assert str(ucx) in [str(Requirement(r)) for r in d["build-system"]["requires"]]
    assert "$(UCX_WHEEL)" in (ROOT / "Makefile").read_text()
