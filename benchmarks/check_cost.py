"""What the per-call check costs, measured inside the same processes: two groups of 4 ranks over
the same 4 processes, one formed with the check (JAX_RCCL_CHECK_CALLS=1, the default) and one
without (0), their all-reduces interleaved block by block.

    .venv/bin/python -P benchmarks/check_cost.py [--nprocs 4] [--blocks 40] [--calls 200]
        [--transport shm|socket] [--sizes 1024,65536,1048576]
        [--against OTHER_PYTHON --rounds 10]

Plain Python processes (no JAX) run the runtime's communicator directly
(``jax_rccl._jax_rccl_testing.run_plan_process``), each owning two devices: device 2p in the checked
group, 2p+1 in the unchecked one. Each block times `--calls` float32 sum all-reduces of one
group, then of the other (their order alternating from block to block); a block's time is its
slowest process's. The table gives each group's median block time per call and the median of
the per-block ratios: interleaving cancels what the machine does to both (the scheduler, other
load), which decides most of the figure when 4 processes share 2 cores.

With ``--against OTHER_PYTHON`` it compares two builds instead of the check on and off: the same
job (the checked group only, default settings) runs alternately under this interpreter's build
and under OTHER_PYTHON's (e.g. a venv holding a build before authenticated sockets), `--rounds`
times each; the table gives each build's median per-call time over its jobs and the median of
the per-round ratios (this build over the other). Jobs cannot share processes across builds, so
this ratio is noisier than the interleaved one: use more rounds on a busy machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

SIZES = (1024, 65536, 1 << 20)
GROUPS = ("checked", "unchecked")


def world_of(p: int, nprocs: int, session: str) -> dict:
    devices = [
        {"id": 2 * q + k, "process": q, "host": "localhost"} for q in range(nprocs) for k in (0, 1)
    ]
    secret = hashlib.sha256(f"benchmark {session}".encode()).digest()
    return {
        "process": p,
        "nprocesses": nprocs,
        "session": session,
        "devices": devices,
        "secret": secret,
    }


def _run(native, world, group: list[int], p: int, size: int, name: str, repeat: int) -> float:
    """`repeat` all-reduces of `size` bytes on `group` (this process's rank p); seconds per call."""
    run = getattr(native, "run_plan_process", None) or native.internal.run_plan_process
    _, secs = run(
        world,
        group,
        [p],
        [{"coll": "all_reduce", "count": size // 4, "dtype": "float32", "op": "sum"}],
        [[bytes(size)]],
        timeout_s=60.0,
        algorithm="Ring",
        protocol="Simple",
        call_site=size * 2 + (name == "checked"),
        repeat=repeat,
    )
    return secs


def worker(args: dict) -> dict:
    try:
        from jax_rccl import _jax_rccl_testing as native
    except ImportError:  # a build before the test module (--against an older build)
        from jax_rccl import _jax_rccl as native

    p, n = args["process"], args["nprocs"]
    world = world_of(p, n, args["session"])
    if args["transport"] == "socket":
        if hasattr(native, "set_session_secret"):
            native.set_session_secret(world["secret"])
            port = native.socket_listen("127.0.0.1")
        else:  # a build before authenticated sockets (to compare against it)
            port = native.socket_listen()
        folder = args["folder"]
        with open(os.path.join(folder, f"{p}.tmp"), "w") as f:
            f.write(f"127.0.0.1:{port}")
        os.rename(os.path.join(folder, f"{p}.tmp"), os.path.join(folder, f"{p}.ep"))
        eps = []
        for q in range(n):
            path = os.path.join(folder, f"{q}.ep")
            while not os.path.exists(path):
                time.sleep(0.01)
            with open(path) as f:
                eps.append(f.read())
        world["endpoints"] = eps
    every = {"checked": [2 * q for q in range(n)], "unchecked": [2 * q + 1 for q in range(n)]}
    groups = {name: every[name] for name in args["groups"]}
    out: dict = {"process": p, "times": {}}
    first = True
    for size in args["sizes"]:
        times: dict[str, list[float]] = {name: [] for name in groups}

        for name in groups:  # form both communicators (the setting is read then)
            os.environ["JAX_RCCL_CHECK_CALLS"] = "1" if name == "checked" else "0"
            _run(native, world if first else None, groups[name], p, size, name, 1)
            first = False
        for b in range(args["blocks"]):
            order = list(groups) if b % 2 == 0 else list(groups)[::-1]  # interleaved
            for name in order:
                times[name].append(_run(native, None, groups[name], p, size, name, args["calls"]))
        out["times"][str(size)] = times
    return out


def human(b: int) -> str:
    return f"{b // 2**20} MB" if b >= 2**20 else f"{b // 1024} KB"


def job(python: str, args, sizes: list[int], groups: tuple[str, ...]) -> list[dict] | None:
    """One run of `args.nprocs` worker processes under `python`; their results, or None."""
    session = uuid.uuid4().hex
    env = dict(os.environ, JAX_RCCL_TRANSPORT=args.transport)
    with tempfile.TemporaryDirectory() as folder:
        procs = []
        for p in range(args.nprocs):
            a = {
                "process": p,
                "nprocs": args.nprocs,
                "session": session,
                "blocks": args.blocks,
                "calls": args.calls,
                "transport": args.transport,
                "folder": folder,
                "sizes": sizes,
                "groups": list(groups),
            }
            procs.append(
                subprocess.Popen(
                    [python, "-P", os.path.abspath(__file__), "--worker", json.dumps(a)],
                    stdout=subprocess.PIPE,
                    env=env,
                )
            )
        results = []
        for pr in procs:
            so, _ = pr.communicate(timeout=3000)
            if pr.returncode != 0:
                print(f"a process of {python} failed (exit {pr.returncode})", file=sys.stderr)
                return None
            results.append(json.loads(so.decode().splitlines()[-1]))
    return results


def block_times(results: list[dict], size: int, name: str) -> list[float]:
    """Per block, the slowest process's time per call."""
    blocks = zip(*(r["times"][str(size)][name] for r in results), strict=True)
    return [max(b) for b in blocks]


def spread(ratios: list[float]) -> str:
    if len(ratios) < 2:
        return f"{ratios[0]:10.3f}x"
    q = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):10.3f}x (IQR {q[0]:.3f}-{q[2]:.3f})"


def against(args, sizes: list[int]) -> int:
    """This build against `args.against`'s, jobs alternating."""
    per: dict[str, dict[int, list[float]]] = {"this": {}, "other": {}}
    pythons = {"this": sys.executable, "other": args.against}
    for r in range(args.rounds):
        order = ("this", "other") if r % 2 == 0 else ("other", "this")
        for name in order:
            results = job(pythons[name], args, sizes, ("checked",))
            if results is None:
                return 1
            for size in sizes:
                per[name].setdefault(size, []).append(
                    statistics.median(block_times(results, size, "checked"))
                )
    print(
        f"all-reduce (sum, float32, Ring/Simple), {args.nprocs} processes, transport "
        f"{args.transport}; this build ({sys.executable}) against {args.against}: {args.rounds} "
        f"jobs each, alternating, {args.blocks} blocks of {args.calls} calls per size and job; "
        "per call, median over jobs of each job's median block (slowest process)"
    )
    print(f"{'size':>6}  {'this':>10}  {'other':>10}  {'ratio (median of rounds)':>26}")
    for size in sizes:
        ratios = [a / b for a, b in zip(per["this"][size], per["other"][size], strict=True)]
        print(
            f"{human(size):>6}  {statistics.median(per['this'][size]) * 1e6:8.1f}us"
            f"  {statistics.median(per['other'][size]) * 1e6:8.1f}us  {spread(ratios)}"
        )
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="")
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--transport", choices=("shm", "socket"), default="shm")
    ap.add_argument(
        "--sizes", default=",".join(str(s) for s in SIZES), help="bytes, comma-separated"
    )
    ap.add_argument("--against", default="", help="another build's Python to compare this one with")
    ap.add_argument("--rounds", type=int, default=10, help="jobs per build with --against")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    t0 = time.monotonic()
    sizes = [int(v) for v in args.sizes.split(",")]
    if any(v <= 0 or v % 4 for v in sizes):
        ap.error("--sizes: positive multiples of 4 bytes")
    if args.against:
        rc = against(args, sizes)
        print(f"({time.monotonic() - t0:.0f} s)")
        return rc
    results = job(sys.executable, args, sizes, GROUPS)
    if results is None:
        return 1
    print(
        f"all-reduce (sum, float32, Ring/Simple), {args.nprocs} processes x 1 rank per group, "
        f"transport {args.transport}; {args.blocks} blocks of {args.calls} calls per group, "
        "interleaved; per call, median block (slowest process)"
    )
    print(f"{'size':>6}  {'checked':>10}  {'unchecked':>10}  {'ratio (median of blocks)':>26}")
    for size in sizes:
        per = {name: block_times(results, size, name) for name in GROUPS}
        ratios = [c / u for c, u in zip(per["checked"], per["unchecked"], strict=True)]
        print(
            f"{human(size):>6}  {statistics.median(per['checked']) * 1e6:8.1f}us"
            f"  {statistics.median(per['unchecked']) * 1e6:8.1f}us  {spread(ratios)}"
        )
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
