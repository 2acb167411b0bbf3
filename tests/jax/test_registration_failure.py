"""A broken registration fails the suite: it never reads as skipped tests."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_registration_that_fails_fails_the_tests():
    """A setting the runtime refuses makes jax_rccl's registration fail: the tests that need
    the runtime then fail with that error instead of being skipped."""
    env = {**os.environ, "JAX_RCCL_TIMEOUT": "abc"}
    r = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/jax/test_lax_backend.py::test_uninstall_restores_xla",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "JAX_RCCL_TIMEOUT" in out, out[-3000:]
    assert "1 error" in out and "skipped" not in out, out[-3000:]
