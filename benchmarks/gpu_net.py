"""jax.lax (XLA's collectives: NCCL over its socket transport) against jax_rccl on its two networks
(our TCP, UCX) between two fake hosts on one GPU, next to the raw loopback socket, in one command.

    .venv/bin/python -P benchmarks/gpu_net.py [--nprocs 2|4] [--sizes 64K,256K,1M,4M,16M,64M,256M]
        [--colls all_reduce,all_gather] [--runs default,tuned,ucx] [--repeat 3] [--iters 20]
        [--iter-bytes 1G] [--raw-sockets 1,4,8] [--ucx-tls tcp] [--one-host-each] [--timeout 420]
        [--no-mps] [--platform gpu|cpu]

The parent starts --nprocs JAX processes (jax.distributed on a local port) sharing GPU 0 under MPS
(a running daemon, or one this script starts as root and stops again; --no-mps: time-sliced, very
slow), processes [0, n/2) on 'hostA' and the rest on 'hostB' (JAX_RCCL_HOSTNAME; --one-host-each:
every process a host of its own), once per run of --runs, each run a fresh set of processes:

- default: NCCL's defaults, jax_rccl on our TCP (JAX_RCCL_NET=socket);
- tuned: NCCL tuned (NCCL_SOCKET_NTHREADS=4, NCCL_NSOCKS_PERTHREAD=4), jax_rccl on our TCP;
- ucx: NCCL tuned, jax_rccl on UCX (JAX_RCCL_NET=ucx; UCX_TLS=--ucx-tls, default tcp: the fake
  hosts share the machine, and UCX would otherwise move the bytes through shared memory).

NCCL reads its variables when it starts and jax_rccl reads JAX_RCCL_NET when it makes a group, so
each setting needs processes of its own; jax.lax and jax_rccl run in the same processes. NCCL
refuses two ranks of one GPU on one host, so every process says it is a host of its own
(NCCL_HOSTID=fakehost<p>), and NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1, NCCL_NVLS_ENABLE=0,
NCCL_IB_DISABLE=1, NCCL_NET=Socket and NCCL_SOCKET_IFNAME=lo (unless set) leave it its socket
transport over loopback, as ours. n = 2: both cross between the hosts once each way; n = 4:
NCCL's ring crosses the network at every hop, ours twice (ranks 0, 1 | 2, 3; --one-host-each:
ours at every hop too).

Per collective and size S per rank (float32; all_gather: S is its output per rank, as nccl-tests),
both libraries' jitted shard_map calls over a 1-D mesh of the processes' devices: `iters` calls back
to back (min(--iters, --iter-bytes / S), at least 3), then block; time = their wall time / iters,
the median of --repeat loops that start together (a barrier), the slowest process's. The two
libraries' loops alternate (jax.lax first, then jax_rccl first, ...), so both see the same state of
the machine. busbw = S / time x 2(n-1)/n (all_reduce) or (n-1)/n (all_gather), in GB/s. raw: in
every run, beside each row (before its timed loops), processes 0 and n/2 move B = S x 2(n-1)/n
(all_reduce) or S x (n-1)/n (all_gather) bytes each way at once over k plain TCP sockets each way
(benchmarks/gpu_cross_host.py, RawSockets; k of --raw-sockets), GB/s = B / time, one direction;
the column gives the best over k, runs and the two ends. TCP/tuned and UCX/tuned: ours' busbw /
NCCL tuned's, timed in the same processes (the tuned run's, the ucx run's); TCP/raw and UCX/raw:
ours' busbw / raw GB/s at the row's B (the target: 0.8 or more from 16 MB). A column that more
than one run times is the first of them that ran: NCCL tuned the tuned run's (else the ucx
run's), ours TCP the tuned run's (else the default run's). errors: elements of the last result
that differ from the closed form (rank r holds r + 1 everywhere), summed over the processes, both
libraries and every run.

The ucx run is skipped, its columns "-" with the reason, when UCX cannot be loaded (neither the
libucx wheel nor a system libucp) or the build has no UCX backend.
--platform cpu: a dry run of the same logic without a GPU: the processes' CPU devices, no MPS,
jax.lax across the processes over JAX's CPU collectives (gloo); NCCL's variables mean nothing
there, so default and tuned are one run and jax.lax one column, 'lax gloo' (TCP/lax, UCX/lax).
Every child process is ended by this script: each run is bounded by --timeout seconds, after which
the processes still running are killed, and a process dies with the parent. Exit status: 0; 1
when a run failed or a result was wrong; 2 when MPS cannot be started.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import gpu_cross_host as xh  # noqa: E402
from _common import free_port, join_local_job, parse_size  # noqa: E402

from jax_rccl._mps import Mps  # noqa: E402

TUNED = {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "4"}
# name: (NCCL's settings, JAX_RCCL_NET)
RUNS = {"default": ({}, "socket"), "tuned": (TUNED, "socket"), "ucx": (TUNED, "ucx")}
# NCCL only over its socket transport (no CUDA IPC, shared memory, NVLink SHARP, InfiniBand or a
# network plugin).
NCCL_NET_ONLY = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_NVLS_ENABLE": "0",
    "NCCL_IB_DISABLE": "1",
    "NCCL_NET": "Socket",
}
PR_SET_PDEATHSIG = 1


# --- one JAX process ---------------------------------------------------------------------------


def worker(cfg: dict) -> dict:
    import ctypes

    # Dies with the parent, whatever ends it.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg["parent"]:
        raise SystemExit("the parent is gone")
    p, n = cfg["process"], cfg["nprocs"]
    join_local_job(cfg["port"], n, p, gloo=cfg["platform"] == "cpu")
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_rccl
    from jax_rccl import _compat as kv
    from jax_rccl import _jax_rccl

    client = kv.distributed_client()
    barriers = iter(range(1 << 30))

    def barrier() -> None:
        client.wait_at_barrier(f"bench/{next(barriers)}", 600_000)

    devs = jax.devices()
    if devs[0].platform != cfg["platform"]:
        raise SystemExit(f"JAX's devices are {devs[0].platform}, not {cfg['platform']}")
    mesh = Mesh(np.array(devs), ("x",))
    spec = NamedSharding(mesh, P("x"))
    out: dict = {"process": p, "device": devs[0].device_kind, "times": {}, "errors": {}}
    out.update(jax_rccl=jax_rccl.__version__, raw={})
    raw = xh.open_raw_sockets(client, kv, p, n, cfg, out) if cfg["raw"] else None
    barrier()  # the raw sockets are open and warm before the first collective

    def measure(coll: str, size: int) -> None:
        count = size // 4 if coll == "all_reduce" else size // 4 // n  # input per rank
        x = jax.make_array_from_callback((n * count,), spec, lambda idx: xh.fill_block(idx, count))
        fns = {
            lib: xh.collective(mod, coll, mesh)
            for lib, mod in (("lax", jax.lax), ("ours", jax_rccl))
        }
        last = {}
        for name, fn in fns.items():
            for _ in range(2):  # compiles, then one more
                last[name] = fn(x)
                last[name].block_until_ready()
        if cfg["raw"]:  # both ends of the pair or neither, as agreed when they opened
            barrier()
            if raw is not None:
                try:
                    raw.measure(xh.link_bytes(coll, n, size))
                except Exception as e:  # noqa: BLE001 - the table says why the column is empty
                    out["raw_error"] = f"{type(e).__name__}: {e}"
        iters = xh.iterations(size, cfg["iters"], cfg["iter_bytes"])
        times, last = xh.timed_in_turns(fns, x, iters, cfg["repeat"], barrier)
        for name in fns:
            key = f"{name}/{coll}/{size}"
            out["times"][key] = statistics.median(times[name])
            out["errors"][key] = xh.count_errors(coll, n, count, last[name])

    for coll in cfg["colls"]:
        for size in cfg["sizes"]:
            measure(coll, size)
    if raw is not None:
        out["raw"] = raw.close()
    if cfg["net"] == "ucx":
        out["ucx"] = _jax_rccl.net_ucx_info()
    return out


# --- the parent ----------------------------------------------------------------------------------


def ucx_missing() -> str | None:
    """Why jax_rccl cannot run on UCX here (None when it can)."""
    from jax_rccl import _jax_rccl, _ucx

    if not _jax_rccl.net_ucx_info()["built"]:
        return "this build of jax_rccl has no UCX backend"
    if not _ucx.load():
        return "UCX cannot be loaded (neither the libucx wheel nor a system libucp)"
    return None


def run_env(args, run: str, p: int, mps_env: dict) -> dict:
    """Process p's environment in `run`."""
    n, (nccl, net) = args.nprocs, RUNS[run]
    env = {k: v for k, v in os.environ.items() if k not in TUNED}  # NCCL defaults: unset
    host = f"host{p}" if args.one_host_each else xh.HOSTS[0] if p < n // 2 else xh.HOSTS[1]
    env.update(
        JAX_RCCL_HOSTNAME=host,
        JAX_RCCL_NET=net,
        JAX_RCCL_TIMEOUT=str(args.rccl_timeout),
        PYTHONFAULTHANDLER="1",
    )
    if net == "ucx" and args.ucx_tls:
        env["UCX_TLS"] = args.ucx_tls
    if args.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"  # one device per process
        return env
    env.update(mps_env)
    env.update(NCCL_NET_ONLY, **nccl)
    env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env.update(
        NCCL_HOSTID=f"fakehost{p}",
        CUDA_VISIBLE_DEVICES="0",
        XLA_PYTHON_CLIENT_PREALLOCATE="false",
        XLA_FLAGS="--xla_gpu_enable_command_buffer=",
    )
    return env


def launch(args, run: str, mps_env: dict, live: list) -> tuple[list | None, str]:
    """One run of --nprocs processes; (every process's result, "") or (None, what went wrong)."""
    n, port = args.nprocs, free_port()
    jobs = []
    for p in range(n):
        cfg = {
            "process": p,
            "nprocs": n,
            "port": port,
            "parent": os.getpid(),
            "platform": args.platform,
            "net": RUNS[run][1],
            "sizes": args.size_list,
            "colls": args.coll_list,
            "iters": args.iters,
            "iter_bytes": parse_size(args.iter_bytes),
            "repeat": args.repeat,
            "raw": bool(args.raw_socket_counts),
            "raw_sockets": args.raw_socket_counts,
            "raw_sizes": sorted(
                {xh.link_bytes(c, n, s) for c in args.coll_list for s in args.size_list}
            ),
        }
        jobs.append((cfg, run_env(args, run, p, mps_env)))
    return xh.run_processes(os.path.abspath(__file__), jobs, args.timeout, live)


def machine(args) -> str:
    """GPU 0's name (nvidia-smi) and the CPU's."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu
            )
    except OSError:
        pass
    gpu = "none (--platform cpu)"
    if args.platform == "gpu":
        try:
            q = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"]
            gpu = subprocess.run(q, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            gpu = f"? (nvidia-smi: {e})"
    return f"GPU 0 {gpu or '?'}; CPU {cpu}, {os.cpu_count()} cores"


def commit() -> str:
    """The checkout's commit, and whether tracked files differ from it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        git = ["git", "-C", root]
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    except OSError as e:
        return f"? ({e})"
    return (head.stdout.strip() or "?") + (" (with local changes)" if dirty else "")


def columns(args) -> list[tuple[str, str, tuple[str, ...]]]:
    """The busbw columns: (head, library, the runs it may come from: the first that ran)."""
    if args.platform == "cpu":
        lax = [("lax gloo", "lax", ("tuned", "ucx", "default"))]
    else:
        lax = [("NCCL dflt", "lax", ("default",)), ("NCCL tuned", "lax", ("tuned", "ucx"))]
    return lax + [("ours TCP", "ours", ("tuned", "default")), ("ours UCX", "ours", ("ucx",))]


def report(args, res: dict[str, list | None], notes: dict[str, str]) -> int:
    """The tables; the errors summed over every row."""
    n = args.nprocs
    first = next((r[0] for r in res.values() if r), None)
    if first is not None:
        print(f"\n# device {first['device']!r}, jax_rccl {first['jax_rccl']}")
    for r in res.get("ucx") or []:
        if r["process"] == 0:
            u = r.get("ucx", {})
            print(f"# ucx run: UCX {u.get('version')} ({u.get('path')}), UCX_TLS {args.ucx_tls!r}")
    raw: dict = {}
    for rs in res.values():
        for r in rs or []:
            if r.get("raw_error"):
                print(f"# raw sockets failed in process {r['process']}: {r['raw_error']}")
            for k, v in r["raw"].items():
                if not k.endswith("/cpu"):
                    raw[k] = min(raw.get(k, v), v)
    cols = columns(args)
    # ours / jax.lax in the same processes (the runs they come from), ours / raw (the column).
    same = ("tuned", "default") if args.platform == "cpu" else ("tuned",)
    base = "lax" if args.platform == "cpu" else "tuned"
    ratios = [(f"TCP/{base}", same), (f"UCX/{base}", ("ucx",)), ("TCP/raw", "ours TCP")]
    ratios.append(("UCX/raw", "ours UCX"))
    for head, _, runs in cols:  # why a column is empty
        if not any(res.get(r) for r in runs):
            why = "; ".join(f"run {r} {notes[r]}" for r in runs if r in notes)
            print(f"# {head}: - ({why or 'no run of ' + ' or '.join(runs) + ' in --runs'})")
    total = 0
    for coll in args.coll_list:
        print(
            f"\n## {coll}, n = {n}: busbw GB/s (slowest process, median of {args.repeat}); raw "
            f"GB/s at B = {xh.bus_factor(coll, n):g} x size each way, best of k = "
            f"{','.join(map(str, args.raw_socket_counts)) or '-'}"
        )
        heads = ["size"] + [c[0] for c in cols] + ["raw"] + [r[0] for r in ratios] + ["errors"]
        widths = [max(7, len(h)) for h in heads]
        line = " | ".join(f"{h:>{w}}" for h, w in zip(heads, widths, strict=True))
        print(line + "\n" + "-" * len(line))
        for size in args.size_list:
            bws: dict[str, float | None] = {}
            for head, lib, runs in cols:
                run = next((r for r in runs if res.get(r)), None)
                bws[head] = busbw(res[run], lib, coll, size, n) if run else None
            best = xh._raw_best(raw, xh.link_bytes(coll, n, size), args.raw_socket_counts)
            cells = [xh.label(size)] + [fmt(b) for b in bws.values()] + [fmt(best)]
            for _, src in ratios:
                if isinstance(src, str):
                    a, b = bws[src], best
                else:
                    run = next((r for r in src if res.get(r)), None)
                    a = busbw(res[run], "ours", coll, size, n) if run else None
                    b = busbw(res[run], "lax", coll, size, n) if run else None
                cells.append(fmt(a / b if a and b else None))
            errs = {
                f"{run}:{lib}": sum(r["errors"][f"{lib}/{coll}/{size}"] for r in rs)
                for run, rs in res.items()
                if rs
                for lib in ("lax", "ours")
            }
            total += sum(abs(e) for e in errs.values())
            bad = ", ".join(f"{k} {e}" for k, e in errs.items() if e)
            cells.append(bad or ("0" if errs else "-"))
            print(" | ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)), flush=True)
    return total


def busbw(rs: list, lib: str, coll: str, size: int, n: int) -> float:
    t = max(r["times"][f"{lib}/{coll}/{size}"] for r in rs)
    return size / t / 1e9 * xh.bus_factor(coll, n)


def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", type=int, default=2, help="processes, an even number (2 or 4)")
    ap.add_argument("--sizes", default="64K,256K,1M,4M,16M,64M,256M", help="bytes per rank")
    ap.add_argument("--colls", default=",".join(xh.COLLS))
    ap.add_argument("--runs", default=",".join(RUNS), help="of default, tuned, ucx")
    ap.add_argument("--repeat", type=int, default=3, help="timed loops (the median)")
    ap.add_argument("--iters", type=int, default=20, help="calls per timed loop, at most")
    ap.add_argument("--iter-bytes", default="1G", help="calls per timed loop: at most this / size")
    ap.add_argument("--raw-sockets", default="1,4,8", help="socket counts for raw ('' for none)")
    ap.add_argument("--ucx-tls", default="tcp", help="UCX_TLS of the ucx run ('': UCX's choice)")
    ap.add_argument("--one-host-each", action="store_true", help="every process its own host")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run of processes")
    ap.add_argument("--rccl-timeout", type=float, default=60, help="JAX_RCCL_TIMEOUT")
    ap.add_argument("--no-mps", action="store_true", help="do not start MPS (time-sliced)")
    ap.add_argument("--platform", default="gpu", choices=("gpu", "cpu"), help="cpu: a dry run")
    args = ap.parse_args(argv)
    xh.check_args(ap, args)
    runs = [r for r in args.runs.split(",") if r]
    for r in runs:
        if r not in RUNS:
            ap.error(f"--runs: {r!r} is not one of {tuple(RUNS)}")
    if args.platform == "cpu" and "tuned" in runs and "default" in runs:
        runs.remove("default")  # NCCL's settings mean nothing on CPU: one run on our TCP

    import jax
    import jaxlib

    cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else []), os.path.abspath(__file__)]
    print(f"# machine: {machine(args)}")
    print(f"# jax {jax.__version__}, jaxlib {jaxlib.__version__}; commit {commit()}")
    print(f"# command: {shlex.join(cmd + (sys.argv[1:] if argv is None else argv))}")
    how = "CPU devices, jax.lax over gloo" if args.platform == "cpu" else "sharing GPU 0"
    half = args.nprocs // 2
    hosts = f"[0, {half}) on {xh.HOSTS[0]}, [{half}, {args.nprocs}) on {xh.HOSTS[1]}"
    hosts = "each process its own host" if args.one_host_each else hosts
    print(f"# {args.nprocs} processes, {how}; {hosts}; runs {','.join(runs)}", flush=True)

    def stop(signum, _frame):
        raise SystemExit(128 + signum)  # the finally below ends the children

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    mps = Mps()
    live: list[subprocess.Popen] = []
    res: dict[str, list | None] = {}
    notes: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        if args.platform == "gpu" and not args.no_mps:
            why = mps.start()
            if why is not None:
                print(f"MPS is not running and cannot be started here: {why} (--no-mps: go on)")
                return 2
            print(f"# MPS {mps.state}")
        for run in runs:
            why = ucx_missing() if RUNS[run][1] == "ucx" else None
            if why:
                notes[run] = f"skipped: {why}"
                print(f"# run {run}: {notes[run]}", flush=True)
                continue
            nccl = " ".join(f"{k}={v}" for k, v in RUNS[run][0].items()) or "NCCL defaults"
            nccl = "jax.lax over gloo" if args.platform == "cpu" else nccl
            print(f"# run {run} ({nccl}, JAX_RCCL_NET={RUNS[run][1]})", end="", flush=True)
            t1 = time.monotonic()
            res[run], problem = launch(args, run, mps.env, live)
            print(f": {time.monotonic() - t1:.0f} s", flush=True)
            if problem:
                notes[run] = "failed"
                print(f"# run {run}: FAILED\n{problem}", flush=True)
        errors = report(args, res, notes)
    finally:
        for proc in live:  # an interrupted run: its processes go too
            proc.kill()
            proc.wait()
        mps.stop()
    print(f"\n# total {time.monotonic() - t0:.0f} s, errors {errors}")
    failed = any(notes.get(r) == "failed" for r in runs)
    return 1 if failed or errors else 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        result = worker(json.loads(sys.argv[2]))
        print(xh.TAG + json.dumps(result), flush=True)
    else:
        raise SystemExit(main())
