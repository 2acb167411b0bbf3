"""The socket transport between processes, without JAX.

Plain Python processes (this file run as a script) load the native module, start their TCP
listener (``_jax_rccl.socket_listen``), swap endpoints through files in a temporary folder, and
run their ranks of one replica group through the runtime's communicator with
``JAX_RCCL_TRANSPORT=socket`` (sockets between all processes over loopback), or with per-process
host names (``host_of``) so that some pairs share memory and others use sockets. Each process
checks its own outputs against numpy (test_shm_transport.py's cases) and reports in JSON.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_shm_transport import (  # noqa: E402
    all_cases,
    load_native,
    run_cases,
    spawn,
    world_of,
)

HERE = os.path.abspath(__file__)


def exchange_endpoints(native, world, folder: str, process: int, nprocs: int, deadline: float):
    native.set_session_secret(world["secret"])
    port = native.socket_listen("127.0.0.1")
    tmp = os.path.join(folder, f"{process}.tmp")
    with open(tmp, "w") as f:
        f.write(f"127.0.0.1:{port}")
    os.rename(tmp, os.path.join(folder, f"{process}.ep"))
    eps = []
    for p in range(nprocs):
        path = os.path.join(folder, f"{p}.ep")
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"process {p} published no endpoint")
            time.sleep(0.01)
        with open(path) as f:
            eps.append(f.read())
    return eps


def worker(args: dict) -> dict:
    native = load_native()
    p, nprocs, per = args["process"], args["nprocs"], args["per"]
    hosts = args.get("hosts")
    world = world_of(p, nprocs, per, args["session"], (lambda q: hosts[q]) if hosts else None)
    world["endpoints"] = exchange_endpoints(
        native, world, args["folder"], p, nprocs, time.monotonic() + 20
    )
    group = list(range(nprocs * per))
    local = [p * per + k for k in range(per)]
    mode = args["mode"]
    out = {"process": p}
    t0 = time.monotonic()
    try:
        if mode == "cases":
            out["failures"] = run_cases(native, world, group, local, args["cases"], args["timeout"])
        elif mode == "killed":
            # One collective connects everyone; then the last process dies while its peers wait
            # inside the next one.
            cases = args["cases"]
            run_cases(native, world, group, local, cases[:1], args["timeout"])
            if p == nprocs - 1:
                threading.Thread(
                    target=lambda: (time.sleep(0.5), os.kill(os.getpid(), signal.SIGKILL))
                ).start()
                time.sleep(1.5)
            t0 = time.monotonic()
            run_cases(native, None, group, local, cases[1:], args["timeout"])
    except Exception as e:  # noqa: BLE001 - reported to the driver
        out["error"] = f"{type(e).__name__}: {e}"
    out["elapsed"] = time.monotonic() - t0
    out["threads"] = threading.active_count()
    return out


def launch(
    nprocs: int, per: int, mode: str, *, transport="socket", timeout_s: float = 60, **kw
) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        return spawn(
            HERE,
            nprocs,
            per,
            mode,
            timeout_s=timeout_s,
            env_extra={"JAX_RCCL_TRANSPORT": transport},
            folder=folder,
            **kw,
        )


def _check(res):
    for r in res:
        assert "error" not in r, r["error"]
        assert r["failures"] == [], r["failures"]


@pytest.mark.parametrize("nprocs,per", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_collectives_over_sockets(nprocs, per):
    """Every collective, Ring and Tree, LL and Simple, large and tiny, over loopback sockets."""
    cases = all_cases(70001) + all_cases(5)
    for i, c in enumerate(cases):
        c["call_site"] = 100 + i
    _check(launch(nprocs, per, "cases", cases=cases, timeout=30.0))


def test_mixed_placement():
    """Two fake hosts of two processes each: shared memory within a host, sockets between."""
    cases = all_cases(70001)
    for i, c in enumerate(cases):
        c["call_site"] = 100 + i
    hosts = ["hostA", "hostA", "hostB", "hostB"]
    _check(launch(4, 2, "cases", transport="auto", hosts=hosts, cases=cases, timeout=30.0))


def test_killed_peer_over_sockets_fails_fast():
    """A process dies inside a collective: the survivors fail well before their deadline, and at
    least one names the dead rank and its process."""
    cases = [
        {"coll": "all_reduce", "count": 100000, "algo": "Ring", "proto": "Simple", "call_site": c}
        for c in (1, 2)
    ]
    t0 = time.monotonic()
    res = launch(3, 1, "killed", cases=cases, timeout=20.0, timeout_s=60)
    assert time.monotonic() - t0 < 15
    assert res[-1].get("killed")
    errs = [r.get("error", "") for r in res[:-1]]
    assert all("TimeoutError" in e for e in errs), errs
    assert all(r["elapsed"] < 5 for r in res[:-1]), res
    assert any("rank 2 (device 2, process 2" in e for e in errs), errs


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))), flush=True)
