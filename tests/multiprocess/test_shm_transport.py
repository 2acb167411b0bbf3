"""The shared-memory transport across processes, without JAX.

Each test starts plain Python processes (this file run as a script) that load the native module
directly and call ``_jax_rccl_testing.run_plan_process`` for their ranks of one replica group:
the plan runs through the runtime's real communicator, which (with a world table spanning
processes) maps one shared-memory segment per rank and moves the data through FIFOs in them.
Every process checks its own outputs against numpy and reports in JSON on stdout.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

HERE = os.path.abspath(__file__)


def load_native():
    """The test-only extension module, imported without running jax_rccl/__init__ (and so
    without jax)."""
    import types

    spec = importlib.util.find_spec("jax_rccl")
    pkg = types.ModuleType("jax_rccl")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["jax_rccl"] = pkg
    return importlib.import_module("jax_rccl._jax_rccl_testing")


def publish(folder: str, name: str, text: str) -> None:
    """Writes `text` to folder/name at once (a rename), for processes that wait for it."""
    tmp = os.path.join(folder, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(folder, name))


def wait_file(path: str, deadline: float) -> str:
    """The text of `path` once it exists (TimeoutError past the monotonic `deadline`)."""
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


# ---- the worker (one process) ----


def world_of(process: int, nprocs: int, per: int, session: str, host_of=None) -> dict:
    devices = []
    for p in range(nprocs):
        for k in range(per):
            host = host_of(p) if host_of else "localhost"
            devices.append({"id": p * per + k, "process": p, "host": host})
    # The run's secret: every process of one test run derives the same one from its session.
    secret = hashlib.sha256(f"secret of {session}".encode()).digest()
    return {
        "process": process,
        "nprocesses": nprocs,
        "session": session,
        "devices": devices,
        "secret": secret,
    }


def rank_input(case: int, rank: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * case + rank)
    return rng.standard_normal(count).astype(np.float32)


def case_tasks(coll: str, count: int, n: int, rank: int):
    """(tasks of `rank`, its input arrays by task)."""
    if coll == "all_to_all":
        tasks, ins = [], []
        for j in range(n):
            tasks.append({"coll": "send", "count": count, "dtype": "float32", "peer": j})
            tasks.append({"coll": "recv", "count": count, "dtype": "float32", "peer": j})
        return tasks, ins
    t = {"coll": coll, "count": count, "dtype": "float32", "op": "sum"}
    if coll in ("broadcast", "reduce"):
        t["root"] = n - 1
    return [t], None


def time_all_reduce(native, world, group, local, args, algorithm, protocol) -> dict:
    """args["repeat"] float32 all_reduces of args["count"] ones: {"ok": every element == the
    group size, "seconds": the runtime's time per call}."""
    count = args["count"]
    task = [{"coll": "all_reduce", "count": count, "dtype": "float32", "op": "sum"}]
    inputs = [[np.ones(count, np.float32).tobytes()] for _ in local]
    outs, secs = native.run_plan_process(
        world,
        group,
        local,
        task,
        inputs,
        timeout_s=60.0,
        algorithm=algorithm,
        protocol=protocol,
        call_site=77,
        repeat=args["repeat"],
    )
    got = np.frombuffer(outs[0][0], np.float32)
    return {"ok": bool(np.all(got == len(group))), "seconds": secs}


def run_cases(native, world, group, local, cases, timeout) -> list[str]:
    """Runs `cases` and returns the failures seen by this process's ranks."""
    n = len(group)
    failures = []
    for ci, case in enumerate(cases):
        coll, count = case["coll"], case["count"]
        per_rank_tasks = [case_tasks(coll, count, n, r)[0] for r in range(n)]
        full = {
            r: rank_input(ci, r, count * (n if coll in ("reduce_scatter", "all_to_all") else 1))
            for r in range(n)
        }
        inputs = []
        for r in local:
            if coll == "all_to_all":
                blocks = full[r].reshape(n, count)
                inputs.append([b for j in range(n) for b in (blocks[j].tobytes(), b"")])
            else:
                inputs.append([full[r].tobytes()])
        outs, _ = native.run_plan_process(
            world,
            group,
            local,
            per_rank_tasks,
            inputs,
            timeout_s=timeout,
            algorithm=case.get("algo", ""),
            protocol=case.get("proto", ""),
            call_site=case.get("call_site", 1000 + ci),
        )
        world = None  # set once
        for li, r in enumerate(local):
            label = f"{coll} {case.get('algo')}/{case.get('proto')} x{count} rank {r}"
            if coll == "all_to_all":
                got = np.concatenate(
                    [np.frombuffer(outs[li][2 * j + 1], np.float32) for j in range(n)]
                )
                want = np.concatenate([full[j].reshape(n, count)[r] for j in range(n)])
            else:
                got = np.frombuffer(outs[li][0], np.float32)
                total = sum(full[q].astype(np.float64) for q in range(n))
                if coll == "all_reduce":
                    want = total
                elif coll == "all_gather":
                    want = np.concatenate([full[q] for q in range(n)])
                elif coll == "reduce_scatter":
                    want = total[r * count : (r + 1) * count]
                elif coll == "broadcast":
                    want = full[n - 1]
                elif coll == "reduce":
                    if r != n - 1:
                        continue
                    want = total
            if got.shape != np.shape(want) or not np.allclose(got, want, rtol=1e-5, atol=1e-4):
                failures.append(f"{label}: wrong result")
    return failures


def worker(args: dict) -> dict:
    native = load_native()
    p, nprocs, per = args["process"], args["nprocs"], args["per"]
    world = world_of(p, nprocs, per, args["session"])
    group = list(range(nprocs * per))
    local = [p * per + k for k in range(per)]
    mode = args["mode"]
    out = {"process": p}
    try:
        if mode == "cases":
            out["failures"] = run_cases(native, world, group, local, args["cases"], args["timeout"])
        elif mode == "absent":
            # Process `absent` never joins; the others must fail in time.
            if p == args["absent"]:
                out["skipped"] = True
            else:
                run_cases(native, world, group, local, args["cases"], args["timeout"])
        elif mode == "mismatch":
            cases = [dict(c) for c in args["cases"]]
            if p == nprocs - 1:
                for c in cases:
                    c["count"] += 3
            run_cases(native, world, group, local, cases, args["timeout"])
        elif mode == "killed":
            # Everyone runs one collective; the last process then dies; the others run the same
            # call site again (checked already: they wait in the FIFOs).
            run_cases(native, world, group, local, args["cases"], args["timeout"])
            if p == nprocs - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            run_cases(native, None, group, local, args["cases"], args["timeout"])
        elif mode == "stall":
            # Everyone runs one collective; the last process then stalls. Process 0 gives up after
            # a short deadline; the others have a long one and must stop soon after process 0
            # fails (it tells them through the segments), not at their own deadline.
            run_cases(native, world, group, local, args["cases"], args["timeout"])
            if p == nprocs - 1:
                time.sleep(args["stall"])
            else:
                deadline = args["short"] if p == 0 else args["long"]
                t0 = time.monotonic()
                try:
                    run_cases(native, None, group, local, args["cases"], deadline)
                finally:
                    out["elapsed"] = time.monotonic() - t0
        elif mode == "kill_early":
            # The last process creates its segments, waits for the others, and dies before they
            # come; the others then find its segment and must unlink it after timing out.
            if p == nprocs - 1:
                import threading

                threading.Thread(
                    target=run_cases,
                    daemon=True,
                    args=(native, world, group, local, args["cases"], 30.0),
                ).start()
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(1.5)
            run_cases(native, world, group, local, args["cases"], args["timeout"])
        elif mode == "time":
            out.update(time_all_reduce(native, world, group, local, args, "Ring", "Simple"))
        out["pending"] = [
            s for s in os.listdir("/dev/shm") if s.startswith("jrccl.") and args["session"] in s
        ]
    except Exception as e:  # noqa: BLE001 - reported to the driver
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# ---- the driver ----


def spawn(
    script: str,
    nprocs: int,
    per: int,
    mode: str,
    *,
    timeout_s: float,
    env_extra: dict | None = None,
    session: str | None = None,
    check_left: bool = True,
    **kw,
) -> list[dict]:
    """Runs `script` as `nprocs` processes of `per` ranks each (one session, new unless given)
    and returns each process's last JSON line ({"killed": True} for a process killed by
    SIGKILL); no segment of the session may be left in /dev/shm (unless not `check_left`)."""
    session = session or uuid.uuid4().hex
    env = dict(os.environ)
    env.pop("JAX_RCCL_ALGO", None)
    env.pop("JAX_RCCL_PROTO", None)
    env.update(env_extra or {})
    procs = []
    for p in range(nprocs):
        args = {"process": p, "nprocs": nprocs, "per": per, "session": session, "mode": mode, **kw}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-P", script, json.dumps(args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        )
    results = []
    t0 = time.monotonic()
    for pr in procs:
        left = max(1.0, timeout_s - (time.monotonic() - t0))
        try:
            so, se = pr.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError(f"{mode}: a process hung past {timeout_s} s") from None
        lines = [ln for ln in so.decode().splitlines() if ln.startswith("{")]
        if pr.returncode == -signal.SIGKILL:
            results.append({"killed": True})
            continue
        assert pr.returncode == 0 and lines, f"exit {pr.returncode}: {se.decode()[-3000:]}"
        results.append(json.loads(lines[-1]))
    leftover = [s for s in os.listdir("/dev/shm") if s.startswith("jrccl.") and session in s]
    assert not check_left or not leftover, f"segments left in /dev/shm: {leftover}"
    return results


def launch(nprocs: int, per: int, mode: str, timeout_s: float = 120, **kw) -> list[dict]:
    return spawn(HERE, nprocs, per, mode, timeout_s=timeout_s, **kw)


def all_cases(count: int) -> list[dict]:
    cases = []
    for proto in ("LL", "Simple"):
        for algo in ("Ring", "Tree"):
            cases.append({"coll": "all_reduce", "count": count, "algo": algo, "proto": proto})
        for coll in ("all_gather", "reduce_scatter", "broadcast", "reduce"):
            cases.append({"coll": coll, "count": count, "algo": "Ring", "proto": proto})
    cases.append({"coll": "all_to_all", "count": count})
    return cases


@pytest.mark.parametrize("nprocs,per", [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_collectives_against_numpy(nprocs, per):
    cases = all_cases(70001) + all_cases(5)
    for i, c in enumerate(cases):
        c["call_site"] = 100 + i
    res = launch(nprocs, per, "cases", cases=cases, timeout=30.0)
    for r in res:
        assert "error" not in r, r["error"]
        assert r["failures"] == [], r["failures"]
        assert r["pending"] == []


def test_absent_process_times_out_naming_it():
    cases = [{"coll": "all_reduce", "count": 1000, "algo": "Ring", "proto": "Simple"}]
    t0 = time.monotonic()
    res = launch(2, 1, "absent", absent=1, cases=cases, timeout=2.0, timeout_s=30)
    assert time.monotonic() - t0 < 20
    err = res[0].get("error", "")
    assert "TimeoutError" in err, res
    assert "rank 1 (device 1, process 1, host '" in err and "never arrived" in err, err
    assert "JAX_RCCL_TIMEOUT" in err


def test_mismatched_tasks_raise_clear_error():
    cases = [{"coll": "all_reduce", "count": 1000, "algo": "Ring", "proto": "Simple"}]
    res = launch(2, 1, "mismatch", cases=cases, timeout=10.0)
    for r in res:
        err = r.get("error", "")
        # The process that finds it raises ValueError; a slow peer that had not mapped the
        # segments yet may instead time out carrying the same text (named in the note).
        assert ("ValueError" in err or "TimeoutError" in err) and "mismatched calls" in err, r
        assert "all_reduce float32 x1000" in err and "all_reduce float32 x1003" in err, err


@pytest.mark.parametrize("nprocs", [2, 3])
def test_killed_peer_gives_timeout_and_no_leftovers(nprocs):
    cases = [{"coll": "all_reduce", "count": 100000, "algo": "Ring", "proto": "Simple"}]
    t0 = time.monotonic()
    res = launch(nprocs, 1, "killed", cases=cases, timeout=2.0, timeout_s=60)
    assert time.monotonic() - t0 < 30
    assert res[-1].get("killed")
    errs = [r.get("error", "") for r in res[:-1]]
    assert all("TimeoutError" in e for e in errs), errs
    # Every survivor names the dead peer: the first to see it gone (its pid, within a fraction of
    # a second), the others in the reason that survivor posted in the segments.
    dead = nprocs - 1
    for e in errs:
        assert f"rank {dead} (device {dead}, process {dead}, host '" in e, e
        assert "exited (its process is gone)" in e, e


def test_killed_before_first_collective_leaves_nothing():
    cases = [{"coll": "all_reduce", "count": 1000, "algo": "Ring", "proto": "Simple"}]
    res = launch(2, 1, "kill_early", cases=cases, timeout=2.0, timeout_s=60)
    assert res[-1].get("killed")
    assert "TimeoutError" in res[0].get("error", ""), res[0]


def test_a_failure_in_one_process_stops_the_others():
    cases = [{"coll": "all_reduce", "count": 1000, "algo": "Ring", "proto": "Simple"}]
    res = launch(3, 1, "stall", cases=cases, timeout=30.0, short=1.0, long=25.0, stall=8.0)
    assert "TimeoutError" in res[0].get("error", ""), res[0]
    assert res[0]["elapsed"] < 5.0
    # Process 1 would wait 25 s on its own; process 0's failure stops it within a few seconds.
    assert "process 0 reported its communicator failed" in res[1].get("error", ""), res[1]
    assert res[1]["elapsed"] < 6.0, res[1]


def test_all_reduce_timing_4_processes():
    """Ring/Simple all_reduce of 1 MB and 64 MB float32 across 4 processes (1 rank each)."""
    for nbytes, repeat in ((1 << 20, 20), (64 << 20, 3)):
        res = launch(4, 1, "time", count=nbytes // 4, repeat=repeat)
        for r in res:
            assert "error" not in r, r["error"]
            assert r["ok"]
        print(
            f"all_reduce {nbytes >> 20} MB x 4 processes: "
            f"{max(r['seconds'] for r in res) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))), flush=True)
