"""The README's example, as a new user runs it: saved as a script in the repository root and
run with the environment's Python (no -P), after `make install`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Example\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the README's Example section holds one Python block"
    return blocks[0]


def test_readme_example_runs_from_the_repository_root(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_example())
    r = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,  # the checkout's jax_rccl/ comes first on sys.path
        capture_output=True,
        text=True,
        timeout=300,
        env=None,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "[3.5]", lines[:3]
    # explain's plan and profile's row: jax.lax.pmean is a psum and a division
    assert "[0] jax.lax.psum over ('data',): all_reduce" in r.stdout, r.stdout[-2000:]
    row = next(ln for ln in lines if ln.startswith("jax.lax.psum over"))
    assert row.split()[4:6] == ["1", "8"], row  # one call, run by each of the 8 devices
