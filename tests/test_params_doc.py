"""The README's environment table is the parameter list (ffi/core/params.h) as jax_rccl.params() shows
it; tools and docs generate it with jax_rccl._params_doc."""

from __future__ import annotations

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
