"""benchmarks/gpu_cross_host.py without a GPU: each collective's row is set against the raw socket
moving the bytes that busbw counts per direction of a link between the hosts."""

from __future__ import annotations

import types

MB = 1 << 20


def test_link_bytes_are_what_busbw_counts_per_direction(bench_script):
    b = bench_script("gpu_cross_host")
    assert b.link_bytes("all_reduce", 2, 64 * MB) == 64 * MB
    assert b.link_bytes("all_gather", 2, 64 * MB) == 32 * MB
    assert b.link_bytes("all_reduce", 4, 64 * MB) == 96 * MB
    assert b.link_bytes("all_gather", 4, 64 * MB) == 48 * MB


def _result(process: int, raw: dict, times: dict) -> dict:
    keys = list(times)
    return {
        "process": process,
        "jax": "x",
        "jax_rccl": "y",
        "device": "cpu",
        "hosts": ["hostA", "hostB"],
        "raw": raw,
        "times": times,
        "errors": dict.fromkeys(keys, 0),
        "stats": {},
        "net": {},
    }


def _args(raw_socket_counts: list[int], colls: list[str]) -> types.SimpleNamespace:
    """The parsed command line report() reads: 2 processes, one 64 MB size."""
    return types.SimpleNamespace(
        nprocs=2,
        command_buffers=False,
        algo="",
        proto="",
        repeat=1,
        iters=3,
        iter_bytes="1G",
        raw_socket_counts=raw_socket_counts,
        coll_list=colls,
        size_list=[64 * MB],
    )


def test_each_row_is_set_against_raw_at_its_own_bytes(capsys, bench_script):
    b = bench_script("gpu_cross_host")
    args = _args([4], ["all_reduce", "all_gather"])
    # 64 MB each way at 16 GB/s, 32 MB each way at 8 GB/s (the raw rate grows with the bytes).
    raw = {f"{64 * MB}x4": 64 * MB / 16e9, f"{32 * MB}x4": 32 * MB / 8e9}
    # busbw 12.8 GB/s for both: all_reduce moves 64 MB each way, all_gather 32 MB.
    times = {f"all_reduce/{64 * MB}": 64 * MB / 12.8e9, f"all_gather/{64 * MB}": 32 * MB / 12.8e9}
    res = {"cross": [_result(0, raw, times), _result(1, raw, times)], "ipc": None}
    b.report(args, res, types.SimpleNamespace(state="off"))
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("64MB")]
    assert len(rows) == 2
    cells = [[c.strip() for c in row.split("|")] for row in rows]
    # size | cross ms busbw | ipc | raw4 | ratio | net | errors
    assert cells[0][3] == "16.00" and cells[0][4] == "0.80"  # all_reduce: raw at 64 MB
    assert cells[1][3] == "8.00" and cells[1][4] == "1.60"  # all_gather: raw at 32 MB


def test_the_ratio_is_against_the_fastest_socket_count(capsys, bench_script):
    b = bench_script("gpu_cross_host")
    args = _args([1, 4, 8], ["all_reduce"])
    # 4, 16 and 20 GB/s on 1, 4 and 8 sockets; the path at 16 GB/s: 0.80 of the fastest.
    raw = {f"{64 * MB}x{k}": 64 * MB / (g * 1e9) for k, g in ((1, 4), (4, 16), (8, 20))}
    times = {f"all_reduce/{64 * MB}": 64 * MB / 16e9}
    res = {"cross": [_result(0, raw, times), _result(1, raw, times)], "ipc": None}
    b.report(args, res, types.SimpleNamespace(state="off"))
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("64MB")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].split("|")]
    # size | cross ms busbw | ipc | raw1 raw4 raw8 | ratio | net | errors
    assert cells[3].split() == ["4.00", "16.00", "20.00"]
    assert cells[4] == "0.80"
