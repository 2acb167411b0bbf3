"""The README's environment table is the parameter list (ffi/core/params.h) as
jax_rccl.params() shows it; tools and docs generate it with jax_rccl._params_doc."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import jax_rccl
from jax_rccl import _params_doc

ROOT = Path(__file__).resolve().parents[1]


def _readme_table() -> str:
    text = (ROOT / "README.md").read_text()
    begin = text.index(_params_doc.BEGIN) + len(_params_doc.BEGIN)
    return text[begin : text.index(_params_doc.END)].strip()


def test_readme_table_matches_the_parameter_list():
    assert _readme_table() == _params_doc.markdown_table(jax_rccl.params()), (
        "README.md's environment table is stale: run "
        "`.venv/bin/python -P -m jax_rccl._params_doc README.md`"
    )


def test_readme_table_has_one_row_per_parameter():
    rows = _readme_table().splitlines()[2:]
    envs = [re.match(r"\| `(JAX_RCCL_\w+)` \|", r).group(1) for r in rows]
    assert envs == [p["env"] for p in jax_rccl.params()]
    for env in ("JAX_RCCL_TRANSPORT", "JAX_RCCL_SOCKET_IFADDR", "JAX_RCCL_HOSTNAME"):
        assert env in envs


def test_every_variable_the_package_reads_is_a_parameter():
    read = set()
    for path in (ROOT / "jax_rccl").rglob("*.py"):
        read |= set(re.findall(r"environ(?:\.get\(|\[)\s*\"(JAX_RCCL_\w+)\"", path.read_text()))
    assert read, "the scan found no environment reads at all"
    assert read <= {p["env"] for p in jax_rccl.params()}


def test_markdown_table_rows_and_escapes():
    table = _params_doc.markdown_table(
        [
            {"env": "JAX_RCCL_A", "default": "", "doc": "a | b"},
            {"env": "JAX_RCCL_B", "default": "3", "doc": "three"},
        ]
    )
    assert table.splitlines() == [
        "| variable | default | meaning |",
        "| --- | --- | --- |",
        "| `JAX_RCCL_A` | (empty) | a \\| b |",
        "| `JAX_RCCL_B` | `3` | three |",
    ]


def test_replace_table_between_markers():
    doc = f"head\n{_params_doc.BEGIN}\nold\n{_params_doc.END}\ntail\n"
    out = _params_doc.replace_table(doc, "NEW")
    assert out == f"head\n{_params_doc.BEGIN}\nNEW\n{_params_doc.END}\ntail\n"
    assert _params_doc.replace_table(out, "NEW") == out


def test_replace_table_without_markers_names_them():
    with pytest.raises(ValueError, match="markers"):
        _params_doc.replace_table("no table here", "NEW")


def test_check_mode_reports_a_stale_document(tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text(f"{_params_doc.BEGIN}\nstale\n{_params_doc.END}\n")
    assert _params_doc.main([str(doc), "--check"]) == 1
    assert "differs" in capsys.readouterr().out
    assert _params_doc.main([str(doc)]) == 0
    assert _params_doc.main([str(doc), "--check"]) == 0
    assert "JAX_RCCL_TIMEOUT" in doc.read_text()


def test_a_misspelt_or_removed_setting_is_named():
    from jax_rccl import _ffi

    messages = _ffi.unknown_settings(
        {
            "JAX_RCCL_TIMEOUTS": "5",  # misspelt
            "JAX_RCCL_WORK_FIFO_DEPTH": "4",  # removed
            "JAX_RCCL_TIMEOUT": "5",  # a setting
            "JAX_RCCL_GPU": "cuda",  # read by the build
            "JAX_RCCL_TEST_ANYTHING": "1",  # the test suite's own
            "XLA_FLAGS": "",
        }
    )
    assert len(messages) == 2, messages
    misspelt, removed = messages  # in name order
    assert "JAX_RCCL_WORK_FIFO_DEPTH is ignored (removed:" in removed
    assert "JAX_RCCL_TIMEOUTS is not a jax_rccl setting" in misspelt
    assert "did you mean JAX_RCCL_TIMEOUT?" in misspelt


def test_the_build_variables_are_the_ones_the_build_reads():
    import tomllib

    from jax_rccl import _ffi

    with open(ROOT / "pyproject.toml", "rb") as f:
        defines = tomllib.load(f)["tool"]["scikit-build"]["cmake"]["define"]
    assert sorted(_ffi.BUILD_VARIABLES) == sorted(v["env"] for v in defines.values())


def test_an_unknown_setting_warns_when_jax_rccl_starts(tmp_path):
    import subprocess
    import sys

    code = (
        "import warnings, jax, jax_rccl\n"
        "from jax_rccl import _ffi\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    _ffi.ensure_registered()\n"
        "print([str(x.message) for x in w])\n"
    )
    env = dict(os.environ, JAX_RCCL_NCHANNEL="4", JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [sys.executable, "-P", "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "JAX_RCCL_NCHANNEL is not a jax_rccl setting" in r.stdout
    assert "did you mean JAX_RCCL_NCHANNELS?" in r.stdout
