"""What several benchmark scripts share: their sizes, their local jobs, their alternating timings.

The scripts run as ``python -P benchmarks/<script>.py``, which leaves their folder off sys.path;
each appends it before it imports this module. JAX is imported where it is used, so that a parent
that only launches processes (benchmarks/multiprocess.py) never imports it.
"""

from __future__ import annotations

import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    """A byte count: "4096", "64K", "1.5M", "1GB" (K, M, G: powers of 1024)."""
    s = s.strip().upper().rstrip("B")
    return int(float(s[:-1]) * UNITS[s[-1]]) if s[-1] in UNITS else int(s)


def sizes(lo: int, hi: float) -> list[int]:
    """lo, 4 lo, 16 lo, ... while at most hi."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (for a local job's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def join_local_job(port: int, nprocs: int, process: int, *, gloo: bool = True) -> None:
    """This process as process `process` of a JAX job of `nprocs` processes on this machine,
    its coordinator at 127.0.0.1:`port`; `gloo`: jax.lax's CPU collectives across the
    processes run over gloo."""
    import jax

    if gloo:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=nprocs,
        process_id=process,
        initialization_timeout=60,
    )


def time_pair(
    fa: Callable,
    fb: Callable,
    args: tuple,
    min_iters: int,
    min_seconds: float,
    wait: Callable[[Any], object],
) -> tuple[float, float]:
    """The median time of a call of each, `wait(f(*args))`, their calls alternating so that a
    drift of the machine's load falls on both alike: 3 warm-up calls each, then at least
    `min_iters` calls and `min_seconds`, at most 200 calls."""
    for _ in range(3):
        wait(fa(*args))
        wait(fb(*args))
    times: tuple[list[float], list[float]] = ([], [])
    t_end = time.perf_counter() + min_seconds
    while len(times[0]) < min_iters or time.perf_counter() < t_end:
        for f, out in ((fa, times[0]), (fb, times[1])):
            t0 = time.perf_counter()
            wait(f(*args))
            out.append(time.perf_counter() - t0)
        if len(times[0]) >= 200:
            break
    return statistics.median(times[0]), statistics.median(times[1])


def print_head(head: str, say: Callable[[str], object] = print) -> None:
    """A table's column heads and the rule under them."""
    say(head)
    say("-" * len(head))
