"""benchmarks/net_trace.py on hand-written timelines: each stage from the two ends of a step, the
wire only between ends on one machine, and a folder without timelines refused."""

from __future__ import annotations

HEADER = (
    "# jax_rccl network proxy timeline: group 7, process {pid}, host {host}, 3 events, "
    "the last 3 kept\n"
)


def _write(path, pid: int, host: str, links: list[str], events: list[tuple[int, int, int, int]]):
    lines = [HEADER.format(pid=pid, host=host)] + [f"link {ln}\n" for ln in links]
    lines += [f"{ns} {link} {kind} {step}\n" for ns, link, kind, step in events]
    path.write_text("".join(lines))


def _pair(tmp_path, receiver_host: str):
    # Rank 0 sends to rank 1 on channel 3: step 0 posted at 1 us, handed over at 2, sent at 5;
    # its receive posted at 0, landed at 7, freed at 10.
    _write(
        tmp_path / "net-trace.7.1.0.txt",
        1,
        "m1",
        ["0 3 send 0 1"],
        [(1000, 0, 0, 0), (2000, 0, 1, 0), (5000, 0, 2, 0)],
    )
    _write(
        tmp_path / "net-trace.7.2.1.txt",
        2,
        receiver_host,
        ["0 3 recv 1 0"],
        [(0, 0, 3, 0), (7000, 0, 4, 0), (10000, 0, 5, 0)],
    )


def test_stages_of_one_step(tmp_path, bench_script):
    nt = bench_script("net_trace")
    _pair(tmp_path, "m1")
    st = nt.stages([nt.read(str(p)) for p in sorted(tmp_path.glob("*.txt"))], skip=0)
    assert st["kernel post -> to network"] == [1.0]
    assert st["to network -> sent"] == [3.0]
    assert st["sent -> landed"] == [2.0]
    assert st["receive posted -> landed"] == [7.0]
    assert st["landed -> freed by the kernel"] == [3.0]


def test_no_wire_time_between_machines(tmp_path, bench_script, capsys):
    nt = bench_script("net_trace")
    _pair(tmp_path, "m2")
    st = nt.stages([nt.read(str(p)) for p in sorted(tmp_path.glob("*.txt"))], skip=0)
    assert "sent -> landed" not in st and st["to network -> sent"] == [3.0]
    assert nt.main([str(tmp_path), "--skip", "0"]) == 0
    assert "landed -> freed by the kernel" in capsys.readouterr().out


def test_a_folder_without_timelines_is_refused(tmp_path, bench_script, capsys):
    assert bench_script("net_trace").main([str(tmp_path)]) == 1
    assert "no net-trace" in capsys.readouterr().err
