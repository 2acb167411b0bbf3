"""What the per-call check costs, measured inside the same processes: two groups of 4 ranks over
the same 4 processes, one formed with the check (JAX_RCCL_CHECK_CALLS=1, the default) and one
without (0), their all-reduces interleaved block by block.

    .venv/bin/python -P benchmarks/check_cost.py [--nprocs 4] [--blocks 40] [--calls 200]
        [--transport shm|socket]

Plain Python processes (no JAX) run the runtime's communicator directly
(``_jax_rccl.internal.run_plan_process``), each owning two devices: device 2p in the checked
group, 2p+1 in the unchecked one. Each block times `--calls` float32 sum all-reduces of one
group, then of the other (their order alternating from block to block); a block's time is its
slowest process's. The table gives each group's median block time per call and the median of
the per-block ratios: interleaving cancels what the machine does to both (the scheduler, other
load), which decides most of the figure when 4 processes share 2 cores.
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
    _, secs = native.internal.run_plan_process(
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
    groups = {"checked": [2 * q for q in range(n)], "unchecked": [2 * q + 1 for q in range(n)]}
    out: dict = {"process": p, "times": {}}
    first = True
    for size in SIZES:
        times = {"checked": [], "unchecked": []}

        for name in groups:  # form both communicators (the setting is read then)
            os.environ["JAX_RCCL_CHECK_CALLS"] = "1" if name == "checked" else "0"
            _run(native, world if first else None, groups[name], p, size, name, 1)
            first = False
        for b in range(args["blocks"]):
            order = list(groups) if b % 2 == 0 else list(groups)[::-1]
            for name in order:
                times[name].append(_run(native, None, groups[name], p, size, name, args["calls"]))
        out["times"][str(size)] = times
    return out


def human(b: int) -> str:
    return f"{b // 2**20} MB" if b >= 2**20 else f"{b // 1024} KB"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="")
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--transport", choices=("shm", "socket"), default="shm")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    t0 = time.monotonic()
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
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-P", os.path.abspath(__file__), "--worker", json.dumps(a)],
                    stdout=subprocess.PIPE,
                    env=env,
                )
            )
        results = []
        for pr in procs:
            so, _ = pr.communicate(timeout=3000)
            if pr.returncode != 0:
                print(f"a process failed (exit {pr.returncode})", file=sys.stderr)
                return 1
            results.append(json.loads(so.decode().splitlines()[-1]))
    print(
        f"all-reduce (sum, float32, Ring/Simple), {args.nprocs} processes x 1 rank per group, "
        f"transport {args.transport}; {args.blocks} blocks of {args.calls} calls per group, "
        "interleaved; per call, median block (slowest process)"
    )
    print(f"{'size':>6}  {'checked':>10}  {'unchecked':>10}  {'ratio (median of blocks)':>26}")
    for size in SIZES:
        per = {}
        for name in ("checked", "unchecked"):
            blocks = zip(*(r["times"][str(size)][name] for r in results), strict=True)
            per[name] = [max(b) for b in blocks]
        ratios = [c / u for c, u in zip(per["checked"], per["unchecked"], strict=True)]
        med = statistics.median(ratios)
        q = statistics.quantiles(ratios, n=4)
        print(
            f"{human(size):>6}  {statistics.median(per['checked']) * 1e6:8.1f}us"
            f"  {statistics.median(per['unchecked']) * 1e6:8.1f}us"
            f"  {med:10.3f}x (IQR {q[0]:.3f}-{q[2]:.3f})"
        )
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
