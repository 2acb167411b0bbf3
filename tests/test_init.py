"""`import jax_rccl` from a source checkout: a clear error instead of a circular import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "jax_rccl"


def _copy_sources(dest: Path) -> Path:
    """The package's Python sources without any compiled extension, as a checkout holds them."""
    shutil.copytree(
        SOURCE, dest / "jax_rccl", ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__")
    )
    return dest


def _python(cwd: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", "import jax_rccl; print(jax_rccl.__file__)"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_checkout_imports_with_the_installed_extension(tmp_path):
    """From a checkout's root (the current folder first on sys.path), its Python sources import
    with the compiled modules that `make install` put in the environment."""
    checkout = _copy_sources(tmp_path)
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import jax_rccl, jax_rccl._jax_rccl as ext; print(jax_rccl.__file__); "
            "print(ext.__file__); print(jax_rccl.runtime_topology(2)['nRanks'])",
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    init, ext, nranks = r.stdout.split()
    assert Path(init).parent == checkout / "jax_rccl"
    assert Path(ext).parent != checkout / "jax_rccl" and Path(ext).name.startswith("_jax_rccl")
    assert nranks == "2"


def test_without_any_installed_extension_says_what_to_do(tmp_path):
    checkout = _copy_sources(tmp_path)
    r = _python(checkout, "-S")  # no site-packages: nothing installed to borrow from
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert "circular" not in r.stderr
    assert "make install" in r.stderr
    assert str(checkout / "jax_rccl") in r.stderr


def test_same_folder_with_safe_path_imports_the_installed_package(tmp_path):
    checkout = _copy_sources(tmp_path)
    r = _python(checkout, "-P")
    assert r.returncode == 0, r.stderr
    installed = Path(r.stdout.strip()).parent
    assert installed != checkout / "jax_rccl"
    assert any(p.name.startswith("_jax_rccl") for p in installed.iterdir())
