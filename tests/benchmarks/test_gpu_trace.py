"""benchmarks/gpu_trace.py without a GPU: its phases of a block's timeline, one work or several
(--tasks), and its refusal of a task count the timeline cannot hold."""

from __future__ import annotations

import pytest


def _events(names_and_times):
    return [(n, float(t)) for n, t in names_and_times]


def test_phases_of_one_work_are_untagged(bench_script):
    ev = _events([("start", 0), ("work", 1), ("elem", 3), ("piece", 4), ("ready", 8), ("end", 9)])
    ph = bench_script("gpu_trace").phases(ev)
    assert ph == {
        "start -> work": [1.0],
        "work -> elem": [2.0],
        "elem -> piece": [1.0],
        "piece -> ready": [4.0],
        "ready -> end": [1.0],
        "start -> end (block)": [9.0],
    }


def test_phases_of_several_works_are_told_apart(bench_script):
    ev = _events(
        [
            ("start", 0),
            ("work", 1),
            ("elem", 2),
            ("posted", 5),
            ("work", 6),
            ("elem", 6.5),
            ("posted", 7),
            ("end", 8),
        ]
    )
    ph = bench_script("gpu_trace").phases(ev)
    assert ph == {
        "start -> work": [1.0],
        "w0: work -> elem": [1.0],
        "w0: elem -> posted": [3.0],
        "posted -> work": [1.0],
        "w1: work -> elem": [0.5],
        "w1: elem -> posted": [0.5],
        "w1: posted -> end": [1.0],
        "start -> end (block)": [8.0],
    }


@pytest.mark.parametrize("tasks", [0, 11])
def test_task_count_outside_the_timeline_is_refused(tasks, capsys, bench_script):
    with pytest.raises(SystemExit) as e:
        bench_script("gpu_trace").main([f"--tasks={tasks}"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--tasks must be in [1, 10]" in err and f"got {tasks}" in err
