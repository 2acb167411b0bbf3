"""benchmarks/gpu_net.py without a GPU: its dry run on CPU prints one table per collective with
every figure and no errors; each run's processes see NCCL's settings of that run alone, and each
ratio of ours to jax.lax is taken within one run."""

from __future__ import annotations

import os
import subprocess
import sys
import types

from nets import ucx_absent

MB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _tables(out: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each table of the output by its collective: its heads and its rows' cells."""
    tables, lines = {}, out.splitlines()
    for i, ln in enumerate(lines):
        if ln.startswith("## "):
            heads = [c.strip() for c in lines[i + 1].split("|")]
            rows = []
            for row in lines[i + 3 :]:
                if not row.strip():
                    break
                rows.append([c.strip() for c in row.split("|")])
            tables[ln[3:].split(",")[0]] = (heads, rows)
    return tables


def test_the_dry_run_on_cpu_has_every_figure_and_no_errors():
    cmd = [sys.executable, "-P", os.path.join(ROOT, "benchmarks", "gpu_net.py")]
    cmd += ["--platform", "cpu", "--nprocs", "2", "--sizes", "64K,256K", "--repeat", "1"]
    cmd += ["--iters", "3", "--raw-sockets", "1", "--timeout", "100"]
    # One CPU device per process whatever the caller's XLA_FLAGS say (a test run may ask for 8).
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    tables = _tables(r.stdout)
    assert set(tables) == {"all_reduce", "all_gather"}, r.stdout
    ucx = ucx_absent() is None
    for heads, rows in tables.values():
        assert heads[:5] == ["size", "lax gloo", "ours TCP", "ours UCX", "raw"], heads
        assert heads[-1] == "errors"
        assert [row[0] for row in rows] == ["64KB", "256KB"]
        for row in rows:
            assert len(row) == len(heads) and row[-1] == "0", row
            cells = dict(zip(heads, row, strict=True))
            for col in ("lax gloo", "ours TCP", "raw", "TCP/lax", "TCP/raw"):
                assert float(cells[col]) > 0, (col, row)
            for col in ("ours UCX", "UCX/lax", "UCX/raw"):
                assert (float(cells[col]) > 0) if ucx else cells[col] == "-", (col, row)
    assert "errors 0" in r.stdout.splitlines()[-1]


def _args(**kw) -> types.SimpleNamespace:
    base = dict(nprocs=2, platform="gpu", one_host_each=False, rccl_timeout=60, ucx_tls="tcp")
    return types.SimpleNamespace(**{**base, **kw})


def test_each_run_sets_nccl_apart(bench_script, monkeypatch):
    g = bench_script("gpu_net")
    monkeypatch.setenv("NCCL_SOCKET_NTHREADS", "8")  # the caller's: not in the default run
    args = _args(nprocs=4)
    envs = {run: [g.run_env(args, run, p, {}) for p in range(4)] for run in g.RUNS}
    for run, es in envs.items():
        assert len({e["NCCL_HOSTID"] for e in es}) == 4
        assert [e["JAX_RCCL_HOSTNAME"] for e in es] == ["hostA", "hostA", "hostB", "hostB"]
        for e in es:
            assert e["NCCL_P2P_DISABLE"] == e["NCCL_SHM_DISABLE"] == "1"
            assert e["NCCL_NVLS_ENABLE"] == "0"
            tuned = run != "default"
            assert e.get("NCCL_SOCKET_NTHREADS") == ("4" if tuned else None), run
            assert e.get("NCCL_NSOCKS_PERTHREAD") == ("4" if tuned else None), run
            assert e["JAX_RCCL_NET"] == ("ucx" if run == "ucx" else "socket")
            assert e.get("UCX_TLS") == ("tcp" if run == "ucx" else os.environ.get("UCX_TLS"))
    cpu = g.run_env(_args(platform="cpu", one_host_each=True), "tuned", 1, {})
    assert cpu["JAX_PLATFORMS"] == "cpu" and cpu["JAX_RCCL_HOSTNAME"] == "host1"
    assert "NCCL_HOSTID" not in cpu


def _result(lax: float, ours: float) -> dict:
    """A process's result: 64 MB all_reduce at these busbw (n = 2: busbw = S / t)."""
    key = f"all_reduce/{64 * MB}"
    times = {f"lax/{key}": 64 * MB / (lax * 1e9), f"ours/{key}": 64 * MB / (ours * 1e9)}
    raw = {f"{64 * MB}x1": 64 * MB / 10e9}  # 10 GB/s
    return {"process": 0, "device": "d", "jax_rccl": "v", "raw": raw, "times": times,
            "errors": dict.fromkeys(times, 0)}  # fmt: skip


def test_ratios_are_within_one_run(bench_script, capsys):
    g = bench_script("gpu_net")
    args = _args(coll_list=["all_reduce"], size_list=[64 * MB], repeat=1, raw_socket_counts=[1])
    res = {"default": [_result(2, 4)], "tuned": [_result(4, 6)], "ucx": [_result(5, 8)]}
    assert g.report(args, res, {}) == 0
    heads, rows = _tables(capsys.readouterr().out)["all_reduce"]
    cells = dict(zip(heads, rows[0], strict=True))
    assert cells["NCCL dflt"] == "2.00" and cells["NCCL tuned"] == "4.00"
    assert cells["ours TCP"] == "6.00" and cells["ours UCX"] == "8.00"
    assert cells["TCP/tuned"] == "1.50" and cells["UCX/tuned"] == "1.60"
    assert cells["TCP/raw"] == "0.60" and cells["UCX/raw"] == "0.80" and cells["raw"] == "10.00"
