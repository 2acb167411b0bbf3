"""jax_rccl between two fake hosts on one GPU, next to the same processes on one host and the raw
loopback socket, in one run.

    .venv/bin/python -P benchmarks/gpu_cross_host.py [--nprocs 2|4] [--sizes 1M,4M,16M,64M,256M]
        [--colls all_reduce,all_gather] [--paths cross,ipc] [--iters 20] [--iter-bytes 1G]
        [--repeat 3] [--raw-sockets 1,4,8] [--raw-when beside|before] [--algo Ring]
        [--proto Simple] [--command-buffers] [--timeout 420] [--no-mps]

The parent starts --nprocs JAX processes (jax.distributed on a local port) that share GPU 0 under
MPS (a running daemon, or one this script starts as root and stops again; --no-mps: time-sliced,
very slow), twice:

- cross: processes [0, n/2) say they are on 'hostA', the rest on 'hostB' (JAX_RCCL_HOSTNAME):
  IPC within a host, the network proxy over loopback TCP between the hosts;
- ipc: the same processes all on 'hostA' (CUDA IPC between every pair).

In the cross run, processes 0 and n/2 also measure the raw loopback socket, beside each row
(just before its timed loops, so both see the same state of the machine): B bytes each way at
once over k plain TCP sockets each way, blocking sends and receives of 4 MiB in C++, one thread
per socket (``jax_rccl._jax_rccl_testing.raw_socket_transfer``, as benchmarks/net_proxy.py), on
connections opened once per k before any jax_rccl collective and warmed up with one transfer
(the proxy's connections stay open too); time = the median of --repeat, the faster end's; GB/s =
B / time, one direction. --raw-when before: every row's raw figure before the first collective
(no proxy thread alive yet), as a check on the rows' own.
A ring crosses between the hosts once each way
(n = 2; n = 4 as ranks 0, 1 | 2, 3), each crossing carrying what busbw counts: B = S x 2(n-1)/n
for all_reduce, S x (n-1)/n for all_gather (n = 2: S and S/2), so each collective's row is set
against the raw socket moving the same bytes each way (the raw rate mostly grows with the bytes
from 1 MB to 256 MB). B is what a ring with the Simple protocol carries (the planner's choice
here); --algo Tree or LL/LL128 put other amounts on the wire.

Per collective and size S per rank (float32; all_gather: S is its output per rank, as in
nccl-tests and benchmarks/gpu_jax.py), one jitted shard_map call per iteration: `iters` calls
back to back (min(--iters, --iter-bytes / S), at least 3), then block; time = their wall time /
iters, the median of --repeat loops that start together (a barrier), the slowest process's.
busbw = S / time * 2(n-1)/n (all_reduce) or (n-1)/n (all_gather). ratio = cross busbw / the best
raw GB/s for the same bytes each way, B (the target: 0.8 or more from 16 MB). errors: elements
of the last result that differ from the closed form (rank r holds r + 1 everywhere), summed over
the processes.
A second table gives the cores busy (/proc) over the cross path's timed loops (the machine's
user / sys / idle; its processes' threads by name: the network interface's helpers, the proxies,
the rest) and over the best raw transfer of the same bytes.
--check-cost: the cost of the per-call check (docs/multiprocess.md) in the same processes: each
collective and size is compiled twice, once under JAX_RCCL_CHECK_CALLS=1 (every step tagged and
checked, the calls counted on the device) and once under 0 (the variable is read when XLA
instantiates the call), and their timed loops alternate (on, off, off, on, ...: --repeat of each,
the median); a table per path gives both times (the slowest process's) and the difference. The sizes
may then start at 8 bytes (--sizes 8,1K,...).
Every child process is ended by this script: each run is bounded by --timeout seconds, after
which the processes still running are killed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

from _common import free_port, parse_size  # noqa: E402

from jax_rccl._mps import Mps  # noqa: E402

TAG = "RESULT "
HOSTS = ("hostA", "hostB")
COLLS = ("all_reduce", "all_gather")
PATHS = ("cross", "ipc")
COMMAND_BUFFERS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
)


def label(size: int) -> str:
    for unit, b in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= b and size % b == 0:
            return f"{size // b}{unit}B"
    return f"{size}B"


def bus_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


def link_bytes(coll: str, n: int, size: int) -> int:
    """B: what one direction of a link between the hosts carries in one collective of `size`."""
    return int(size * bus_factor(coll, n))


def iterations(size: int, iters: int, iter_bytes: int) -> int:
    return max(3, min(iters, iter_bytes // max(1, size)))


# The classes of a process's threads the CPU columns count apart (ffi/core/thread_name.h).
THREAD_CLASSES = {"jrccl net": "net", "jrccl proxy": "proxy"}


def cpu_sample() -> dict:
    """CPU time so far, in clock ticks: the machine's (/proc/stat: user, sys = system + irq +
    softirq, idle = idle + iowait) and this process's threads by class (net: the network
    interface's helper threads, or the host runtime's socket thread on CPU devices; proxy: the
    proxy threads; other: the rest), with a monotonic clock."""
    out = {"t": time.monotonic(), "user": 0, "sys": 0, "idle": 0}
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
        out.update(user=v[0] + v[1], sys=v[2] + v[5] + v[6], idle=v[3] + v[4])
    except (OSError, ValueError, IndexError):
        pass
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
        cls = THREAD_CLASSES.get(name, "other")
        out[cls] = out.get(cls, 0) + int(fields[11]) + int(fields[12])  # utime + stime
    return out


def cpu_cores(before: dict, after: dict) -> dict:
    """Cores busy between two samples, by what `cpu_sample` counts (idle too)."""
    hz = os.sysconf("SC_CLK_TCK")
    wall = max(after["t"] - before["t"], 1e-9)
    return {k: (after[k] - before.get(k, 0)) / hz / wall for k in after if k != "t"}


# --- one JAX process ---------------------------------------------------------------------------


class RawSockets:
    """Plain TCP sockets between this process and `peer` (k each way for each k of
    --raw-sockets), opened once before any jax_rccl collective and warmed up (as the proxy's
    connections stay open), then measured beside each row: B bytes each way at once, --repeat
    times per k; seconds (the median) and cores busy by "BxK"."""

    def __init__(self, client, kv, p: int, peer: int, cfg: dict) -> None:
        from jax_rccl import _jax_rccl_testing as native

        self.native, self.client, self.kv = native, client, kv
        self.p, self.peer, self.repeat = p, peer, cfg["repeat"]
        self.socks: dict[int, tuple[list, list, socket.socket]] = {}
        self.secs: dict[str, list[float]] = {}
        self.cpus: dict[str, list[dict]] = {}
        self.runs = 0
        self.failed = False
        for k in cfg["raw_sockets"]:
            tag = f"bench/raw/{k}"
            lsock = socket.socket()
            lsock.bind(("127.0.0.1", 0))
            lsock.listen(k)
            lsock.settimeout(60)
            kv.kv_set(client, f"{tag}/port/{p}", str(lsock.getsockname()[1]))
            port = int(kv.kv_get(client, f"{tag}/port/{peer}", 60))
            outs = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(k)]
            ins = [lsock.accept()[0] for _ in range(k)]
            # Blocking, as raw_socket_transfer needs, but never for good: a peer that gave up
            # leaves this end's sends and receives failing after 60 s.
            limit = struct.pack("ll", 60, 0)
            for s in outs + ins:
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, limit)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, limit)
            self.socks[k] = (outs, ins, lsock)
            self._transfer(k, max(cfg["raw_sizes"]))  # warm-up

    def _transfer(self, k: int, size: int) -> tuple[float, dict]:
        outs, ins, _ = self.socks[k]
        self.runs += 1
        tag = f"bench/raw/{k}/go/{self.runs}"
        self.kv.kv_set(self.client, f"{tag}/{self.p}", "1")
        self.kv.kv_get(self.client, f"{tag}/{self.peer}", 60)
        c0 = cpu_sample()
        t = self.native.raw_socket_transfer(
            [s.fileno() for s in outs], [s.fileno() for s in ins], size // k
        )
        return t, cpu_cores(c0, cpu_sample())

    def measure(self, size: int) -> None:
        """B = `size` bytes each way over each k, --repeat times (both ends call it together);
        after a failure, nothing more (the other end stops too, on its own failure)."""
        if self.failed:
            return
        try:
            for k in self.socks:
                for _ in range(self.repeat):
                    t, c = self._transfer(k, size)
                    self.secs.setdefault(f"{size}x{k}", []).append(t)
                    self.cpus.setdefault(f"{size}x{k}", []).append(c)
        except Exception:
            self.failed = True
            raise

    def close(self) -> dict:
        for outs, ins, lsock in self.socks.values():
            for s in outs + ins + [lsock]:
                s.close()
        out: dict = {}
        for key, ts in self.secs.items():
            out[key] = statistics.median(ts)
            out[f"{key}/cpu"] = _mean_cores(self.cpus[key])
        return out


def _mean_cores(samples: list[dict]) -> dict:
    """The mean of each figure over `samples` (0 for one a sample lacks; all 0 for none)."""
    keys = {"user", "sys", "idle"} | {k for c in samples for k in c}
    return {k: statistics.mean(c.get(k, 0.0) for c in samples) if samples else 0.0 for k in keys}


def open_raw_sockets(client, kv, p: int, n: int, cfg: dict, out: dict) -> RawSockets | None:
    """Process `p`'s RawSockets to its peer when it is process 0 or n/2, else None; both ends
    measure, or neither (an end whose sockets failed would leave the other waiting at every
    row): None after a failure at either end, with out["raw_error"] saying why."""
    if p not in (0, n // 2):
        return None
    raw = None
    try:
        raw = RawSockets(client, kv, p, n // 2 - p, cfg)
    except Exception as e:  # noqa: BLE001 - the table says why the column is empty
        out["raw_error"] = f"{type(e).__name__}: {e}"
    kv.kv_set(client, f"bench/raw/ok/{p}", "1" if raw is not None else "0")
    if kv.kv_get(client, f"bench/raw/ok/{n // 2 - p}", 180) != "1" and raw is not None:
        raw.close()
        raw = None
        out["raw_error"] = f"the raw sockets of process {n // 2 - p} failed"
    return raw


def fill_block(idx, c: int):
    """Rank r's block of `c` elements (the mesh's r-th, `idx` its index) holds r + 1 everywhere."""
    import numpy as np

    return np.full(c, (idx[0].start or 0) // c + 1, np.float32)


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options this benchmark and gpu_net.py share, checked (ap.error names the one that is
    wrong), and parsed into args.size_list, args.coll_list and args.raw_socket_counts."""
    if args.nprocs < 2 or args.nprocs % 2:
        ap.error("--nprocs: an even number, at least 2")
    args.size_list = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.coll_list = [c for c in args.colls.split(",") if c]
    args.raw_socket_counts = [int(k) for k in args.raw_sockets.split(",") if k.strip()]
    for c in args.coll_list:
        if c not in COLLS:
            ap.error(f"--colls: {c!r} is not one of {COLLS}")
    for s in args.size_list:
        if s % (4 * args.nprocs):
            ap.error(f"--sizes: {s} is not a multiple of 4 x {args.nprocs} bytes")
    if args.iters < 1 or args.repeat < 1 or any(k < 1 for k in args.raw_socket_counts):
        ap.error("--iters, --repeat and --raw-sockets must be >= 1")


def timed_in_turns(fns: dict, x, iters: int, repeat: int, barrier) -> tuple[dict, dict]:
    """`repeat` timed loops of each of `fns` (name: jitted function of `x`) in turns, the order
    reversed every other round (a, b, b, a, ...), each loop `iters` calls back to back after a
    barrier, then block: the seconds per call of every loop, and each function's last result."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    last: dict = {}
    for i in range(repeat):
        for name in list(fns)[:: 1 if i % 2 == 0 else -1]:
            fn = fns[name]
            barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                y = fn(x)
            y.block_until_ready()
            times[name].append((time.perf_counter() - t0) / iters)
            last[name] = y
    return times, last


def collective(lib, coll: str, mesh):
    """`coll` of `lib` (jax_rccl or jax.lax) over the mesh's axis "x", jitted under shard_map:
    psum (all_reduce) or a tiled all_gather."""
    import jax
    from jax.sharding import PartitionSpec as P

    def body(v):
        if coll == "all_reduce":
            return lib.psum(v, "x")
        return lib.all_gather(v, "x", tiled=True)

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x")))


def count_errors(coll: str, n: int, count: int, y) -> int:
    """Elements of this process's block of `y` (the result of `coll` over n ranks of `count`
    elements each, filled by `fill_block`) that differ from the closed form; -1: a wrong shape."""
    import numpy as np

    got = np.asarray(y.addressable_shards[0].data)
    if coll == "all_reduce":
        want = np.full(count, n * (n + 1) / 2, np.float32)
    else:
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
    return int(np.count_nonzero(got != want)) if got.shape == want.shape else -1


def worker(cfg: dict) -> dict:
    import jax

    p, n = cfg["process"], cfg["nprocs"]
    jax.distributed.initialize(f"127.0.0.1:{cfg['port']}", n, p, initialization_timeout=120)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_rccl
    from jax_rccl import _bootstrap
    from jax_rccl import _compat as kv

    client = kv.distributed_client()
    barriers = iter(range(1 << 30))

    def barrier() -> None:
        client.wait_at_barrier(f"bench/{next(barriers)}", 600_000)

    devs = jax.devices()
    ids = [d.id for d in devs]
    rank = ids.index(jax.local_devices()[0].id)
    mesh = Mesh(np.array(devs), ("x",))
    spec = NamedSharding(mesh, P("x"))
    out: dict = {
        "process": p,
        "rank": rank,
        "jax": jax.__version__,
        "jax_rccl": jax_rccl.__version__,
        "device": devs[0].device_kind,
        "raw": {},
        "times": {},
        "errors": {},
        "net": {},
        "cpu": {},
    }
    raw = open_raw_sockets(client, kv, p, n, cfg, out) if cfg["raw"] else None
    if raw is not None and cfg["raw_when"] == "before":
        try:  # every row's bytes now, before any collective (no proxy alive yet)
            for b in cfg["raw_sizes"]:
                raw.measure(b)
        except Exception as e:  # noqa: BLE001 - the table says why the column is empty
            out["raw_error"] = f"{type(e).__name__}: {e}"
    barrier()  # the raw sockets are open and warm before jax_rccl's first collective

    def make(coll: str):
        return collective(jax_rccl, coll, mesh)

    def measure(coll: str, size: int) -> None:
        count = size // 4 if coll == "all_reduce" else size // 4 // n  # input per rank
        key = f"{coll}/{size}"
        x = jax.make_array_from_callback((n * count,), spec, lambda idx: fill_block(idx, count))
        fn = make(coll)
        for _ in range(2):  # compiles, then one more
            y = fn(x)
            y.block_until_ready()
        if cfg.get("check_cost"):
            check_cost(coll, key, x, fn)
            return
        iters = iterations(size, cfg["iters"], cfg["iter_bytes"])
        if cfg["raw"] and cfg["raw_when"] == "beside":
            # The raw socket beside the row, on the same machine state (both ends of the pair
            # or neither, as agreed when they opened).
            barrier()
            if raw is not None:
                try:
                    raw.measure(link_bytes(coll, n, size))
                except Exception as e:  # noqa: BLE001 - the table says why the column is empty
                    out["raw_error"] = f"{type(e).__name__}: {e}"
        times = []
        cpus = []
        net: dict[str, int] = {}
        for _ in range(cfg["repeat"]):
            barrier()
            # The proxies' counts over the timed loop alone (they flush every 10 ms: a loop's
            # last few ms may land in the next window).
            before = jax_rccl.runtime_stats()
            c0 = cpu_sample()
            t0 = time.perf_counter()
            for _ in range(iters):
                y = fn(x)
            y.block_until_ready()
            times.append((time.perf_counter() - t0) / iters)
            cpus.append(cpu_cores(c0, cpu_sample()))
            after = jax_rccl.runtime_stats()
            for k in after:
                if k.startswith("net_"):
                    net[k] = net.get(k, 0) + int(after[k]) - int(before[k])
        out["times"][key] = statistics.median(times)
        out["net"][key] = net
        out["cpu"][key] = _mean_cores(cpus)
        out["errors"][key] = count_errors(coll, n, count, y)

    def check_cost(coll: str, key: str, x, on) -> None:
        """`on` (compiled under JAX_RCCL_CHECK_CALLS=1) against the same collective compiled
        under 0, their timed loops in turns."""
        os.environ["JAX_RCCL_CHECK_CALLS"] = "0"
        off = make(coll)
        for _ in range(2):
            off(x).block_until_ready()
        os.environ["JAX_RCCL_CHECK_CALLS"] = "1"
        iters = iterations(int(key.split("/")[1]), cfg["iters"], cfg["iter_bytes"])
        times, last = timed_in_turns({"on": on, "off": off}, x, iters, cfg["repeat"], barrier)
        y = last["off"]
        out["times"][key] = statistics.median(times["on"])
        out.setdefault("times_off", {})[key] = statistics.median(times["off"])
        out["net"][key] = {}
        out["cpu"][key] = {}
        got = np.asarray(y.addressable_shards[0].data)
        want = (
            np.full(got.shape, n * (n + 1) / 2, np.float32)
            if coll == "all_reduce"
            else np.repeat(np.arange(1, n + 1, dtype=np.float32), got.size // n)
        )
        out["errors"][key] = int(np.count_nonzero(got != want))

    # The settings are part of jit's key: every call runs under them.
    with jax_rccl.config(algorithm=cfg["algo"], protocol=cfg["proto"]):
        for coll in cfg["colls"]:
            for size in cfg["sizes"]:
                measure(coll, size)
    if raw is not None:
        out["raw"] = raw.close()
    out["stats"] = {k: int(v) for k, v in jax_rccl.runtime_stats().items()}
    w = _bootstrap.world()
    out["hosts"] = [d["host"] for d in sorted(w["devices"], key=lambda d: ids.index(d["id"]))]
    return out


# --- the parent ----------------------------------------------------------------------------------


def launch(args, path: str, mps_env: dict, live: list) -> tuple[list | None, str]:
    """One run of --nprocs processes; (every process's result, "") or (None, what went wrong)."""
    n = args.nprocs
    port = free_port()
    jobs: list[tuple[dict, dict]] = []
    for p in range(n):
        cfg = {
            "process": p,
            "nprocs": n,
            "port": port,
            "sizes": args.size_list,
            "colls": args.coll_list,
            "iters": args.iters,
            "iter_bytes": parse_size(args.iter_bytes),
            "repeat": args.repeat,
            "raw": path == "cross" and bool(args.raw_socket_counts),
            "raw_sockets": args.raw_socket_counts,
            "raw_when": args.raw_when,
            "raw_sizes": sorted(
                {link_bytes(c, n, s) for c in args.coll_list for s in args.size_list}
            ),
            "algo": args.algo or None,
            "proto": args.proto or None,
            "check_cost": args.check_cost,
        }
        env = dict(os.environ)
        env.update(mps_env)
        env.update(
            CUDA_VISIBLE_DEVICES="0",
            XLA_PYTHON_CLIENT_PREALLOCATE="false",
            JAX_RCCL_TIMEOUT=str(args.rccl_timeout),
            JAX_RCCL_HOSTNAME=HOSTS[0] if path == "ipc" or p < n // 2 else HOSTS[1],
            NCCL_NVLS_ENABLE="0",
            PYTHONFAULTHANDLER="1",
            XLA_FLAGS=COMMAND_BUFFERS
            if args.command_buffers
            else "--xla_gpu_enable_command_buffer=",
        )
        jobs.append((cfg, env))
    return run_processes(os.path.abspath(__file__), jobs, args.timeout, live)


def run_processes(
    script: str, jobs: list[tuple[dict, dict]], timeout: float, live: list
) -> tuple[list | None, str]:
    """`python -P script --worker <cfg>` under `env` for each (cfg, env) of `jobs`, all at once,
    for at most `timeout` seconds (then the processes still running are killed); each process
    is in `live` while it runs. (every process's result, its last TAG line, "") or (None, what
    went wrong)."""
    procs = []
    for cfg, env in jobs:
        # Files, not pipes: a chatty process never blocks on a full pipe while we wait on another.
        log = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, "-P", script, "--worker", json.dumps(cfg)]
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        procs.append((proc, log))
        live.append(proc)
    deadline = time.monotonic() + timeout
    timed_out = False
    for proc, _ in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            break
    texts = []
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        live.remove(proc)
        log.seek(0)
        texts.append(log.read())
        log.close()
    results, problems = [], []
    for p, ((proc, _), text) in enumerate(zip(procs, texts, strict=True)):
        lines = [ln for ln in text.splitlines() if ln.startswith(TAG)]
        if proc.returncode != 0 or not lines:
            tail = "\n".join("    " + ln for ln in text.splitlines()[-15:])
            problems.append(f"  process {p}: exit {proc.returncode}\n{tail}")
            continue
        results.append(json.loads(lines[-1][len(TAG) :]))
    if timed_out:
        problems.insert(0, f"  the run did not finish within {timeout} s (killed)")
    return (None, "\n".join(problems)) if problems else (results, "")


def _raw_best(raw: dict, size: int, counts: list[int]) -> float | None:
    """The best raw GB/s for `size` bytes each way over the socket counts, per direction."""
    rates = [size / raw[f"{size}x{k}"] / 1e9 for k in counts if f"{size}x{k}" in raw]
    return max(rates) if rates else None


def report_check_cost(args, res: dict[str, list | None]) -> None:
    """--check-cost: per path, collective and size, the check on and off and the difference."""
    n = args.nprocs
    for path in PATHS:
        rs = res.get(path)
        if not rs:
            continue
        for coll in args.coll_list:
            print(f"\n## check cost: {coll}, n = {n}, {path} (the slowest process's times)")
            print(f"{'size':>7} | {'on us':>10} {'off us':>10} {'cost':>7} | errors")
            for size in args.size_list:
                key = f"{coll}/{size}"
                on = max(r["times"][key] for r in rs)
                off = max(r["times_off"][key] for r in rs)
                errors = sum(r["errors"][key] for r in rs)
                print(
                    f"{label(size):>7} | {on * 1e6:10.2f} {off * 1e6:10.2f} "
                    f"{100 * (on - off) / off:6.2f}% | {errors}",
                    flush=True,
                )


def report(args, res: dict[str, list | None], mps: Mps) -> None:
    n = args.nprocs
    first = next((r[0] for r in res.values() if r), None)
    if first is not None:
        print(
            f"# jax {first['jax']}, jax_rccl {first['jax_rccl']}, device {first['device']!r}, "
            f"{os.cpu_count()} cores"
        )
    half = n // 2
    print(
        f"# {n} processes sharing GPU 0, MPS {mps.state}; cross: processes [0, {half}) on "
        f"{HOSTS[0]}, [{half}, {n}) on {HOSTS[1]} (network proxy, loopback TCP); ipc: all on "
        f"{HOSTS[0]} (CUDA IPC)"
    )
    flags = {k: v for k, v in sorted(os.environ.items()) if k.startswith("JAX_RCCL_")}
    print(
        f"# command buffers {'on' if args.command_buffers else 'off'}, algo "
        f"{args.algo or 'auto'}, proto {args.proto or 'auto'}, repeat {args.repeat}, iters "
        f"min({args.iters}, {args.iter_bytes}/size) >= 3; env {flags}"
    )
    for path in PATHS:
        if res.get(path):
            print(f"# {path}: the world table's host by rank {res[path][0]['hosts']}")
    raw: dict = {}
    raw_cpu: dict[str, list[dict]] = {}
    for r in res.get("cross") or []:
        if r.get("raw_error"):
            print(f"# raw sockets failed in process {r['process']}: {r['raw_error']}")
        for k, v in r["raw"].items():  # both ends of the pair: the faster (the stricter ratio)
            if k.endswith("/cpu"):
                raw_cpu.setdefault(k[: -len("/cpu")], []).append(v)
            else:
                raw[k] = min(raw.get(k, v), v)
    counts = args.raw_socket_counts
    print(
        f"# raw: process 0 <-> process {half}, B bytes each way at once over k TCP sockets "
        f"each way (k = {','.join(map(str, counts)) or '-'}), GB/s per direction, B = what busbw "
        f"counts per direction (all_reduce S x 2(n-1)/n, all_gather S x (n-1)/n); busbw in GB/s,"
        f" time the slowest process's; ratio = cross busbw / best raw at B (target >= 0.8 from "
        f"16 MB)"
    )
    raw_head = " ".join(f"{f'raw{k} GB/s':>11}" for k in counts)
    print(
        "# net send / recv: the cross path's proxy connections over the timed loops, all "
        "processes: % of their time with every slot full / idle (runtime_stats net_*; sends "
        "full or receives idle: the network is the limit; sends idle or receives full: the "
        "kernels)"
    )
    head = (
        f"{'size':>7} | {'cross ms':>9} {'busbw':>7} | {'ipc ms':>9} {'busbw':>7} | "
        f"{raw_head}{' | ' if counts else ''}{'ratio':>5} | {'net send':>8} {'net recv':>8} | "
        "errors"
    )
    for coll in args.coll_list:
        print(f"\n## {coll}, n = {n}; raw at B = {bus_factor(coll, n):g} x size each way")
        print(head)
        print("-" * len(head))
        for size in args.size_list:
            key = f"{coll}/{size}"
            cols, bws, errs = [], {}, []
            for path in PATHS:
                rs = res.get(path)
                if not rs:
                    cols.append(f"{'-':>9} {'-':>7}")
                    continue
                t = max(r["times"][key] for r in rs)
                bws[path] = size / t / 1e9 * bus_factor(coll, n)
                cols.append(f"{t * 1e3:9.3f} {bws[path]:7.2f}")
                e = sum(r["errors"][key] for r in rs)
                if e:
                    errs.append(f"{path} {e}")
            raws = []
            b = link_bytes(coll, n, size)
            for k in counts:
                secs = raw.get(f"{b}x{k}")
                raws.append(f"{b / secs / 1e9:11.2f}" if secs else f"{'-':>11}")
            best = _raw_best(raw, b, counts)
            ratio = f"{bws['cross'] / best:5.2f}" if best and "cross" in bws else f"{'-':>5}"
            line = f"{label(size):>7} | {' | '.join(cols)} | "
            line += (" ".join(raws) + " | ") if counts else ""
            line += f"{ratio} | {_net_shares(res.get('cross') or [], key)} | "
            line += ", ".join(errs) or "0"
            print(line, flush=True)
    _cpu_tables(args, res, raw, raw_cpu)
    for path in PATHS:
        for r in res.get(path) or []:
            if r["stats"].get("errors"):
                print(f"# {path}: process {r['process']} runtime_stats {r['stats']}")


def _cpu_tables(args, res: dict, raw: dict, raw_cpu: dict[str, list[dict]]) -> None:
    """Cores busy over the cross path's timed loops and over the best raw transfer of the same
    bytes: the machine's (user / sys / idle) and, for the cross path, its processes' threads by
    class, summed over the processes."""
    cross = res.get("cross") or []
    if not cross or not cross[0].get("cpu"):
        return
    n, counts = args.nprocs, args.raw_socket_counts
    print(
        f"\n# CPU, cores busy of {os.cpu_count()} (/proc): machine user / sys / idle over the cross"
        " path's timed loops; its processes' threads summed: net (the network interface's helper"
        " threads), proxy, other (JAX and the rest); raw: the machine over the best raw transfer"
        " of the row's B (its k sockets each way); the kernel counts CPU time in clock ticks"
        f" ({os.sysconf('SC_CLK_TCK')} Hz): over the raw transfers' few tens of ms a figure is"
        " good to a core or two"
    )
    head = (
        f"{'coll':>10} {'size':>7} | {'usr':>5} {'sys':>5} {'idle':>5} | {'net':>5} {'proxy':>5} "
        f"{'other':>5} | {'raw k':>5} {'usr':>5} {'sys':>5} {'idle':>5}"
    )
    print(head)
    print("-" * len(head))
    for coll in args.coll_list:
        for size in args.size_list:
            key = f"{coll}/{size}"
            recs = [r["cpu"][key] for r in cross if key in r.get("cpu", {})]
            if not recs:
                continue
            m = _mean_cores(recs)  # the machine's: alike in every process
            p = {k: sum(c.get(k, 0.0) for c in recs) for k in ("net", "proxy", "other")}
            line = (
                f"{coll:>10} {label(size):>7} | "
                f"{m['user']:5.1f} {m['sys']:5.1f} {m['idle']:5.1f} | "
                f"{p['net']:5.1f} {p['proxy']:5.1f} {p['other']:5.1f} | "
            )
            b = link_bytes(coll, n, size)
            rates = {k: b / raw[f"{b}x{k}"] for k in counts if f"{b}x{k}" in raw}
            if rates:
                k = max(rates, key=lambda j: rates[j])
                r = _mean_cores(raw_cpu.get(f"{b}x{k}", []))
                line += f"{k:>5} {r['user']:5.1f} {r['sys']:5.1f} {r['idle']:5.1f}"
            else:
                line += f"{'-':>5}"
            print(line)


def _net_shares(results: list[dict], key: str) -> str:
    """'full/idle' percentages of the proxies' sending and receiving connections' time."""
    cols = []
    for d in ("send", "recv"):
        tot = sum(r.get("net", {}).get(key, {}).get(f"net_{d}_ns", 0) for r in results)
        if tot <= 0:
            cols.append(f"{'-':>8}")
            continue
        full = sum(r["net"][key].get(f"net_{d}_ns_full", 0) for r in results)
        idle = sum(r["net"][key].get(f"net_{d}_ns_idle", 0) for r in results)
        cols.append(f"{f'{100 * full / tot:.0f}/{100 * idle / tot:.0f}':>8}")
    return " ".join(cols)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nprocs", type=int, default=2, help="processes, an even number (2 or 4)")
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M", help="bytes per rank")
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--paths", default=",".join(PATHS), help="cross (two hosts), ipc (one host)")
    ap.add_argument("--iters", type=int, default=20, help="calls per timed loop, at most")
    ap.add_argument("--iter-bytes", default="1G", help="calls per timed loop: at most this / size")
    ap.add_argument("--repeat", type=int, default=3, help="timed loops (the median)")
    ap.add_argument("--raw-sockets", default="1,4,8", help="socket counts for raw ('' for none)")
    ap.add_argument(
        "--raw-when",
        default="beside",
        choices=("beside", "before"),
        help="raw socket: beside each row (default), or every row's bytes before any collective",
    )
    ap.add_argument("--algo", default="", help="jax_rccl.config(algorithm=...), e.g. Ring")
    ap.add_argument("--proto", default="", help="jax_rccl.config(protocol=...), e.g. Simple")
    ap.add_argument("--command-buffers", action="store_true", help="XLA command buffers on")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run of processes")
    ap.add_argument("--rccl-timeout", type=float, default=60, help="JAX_RCCL_TIMEOUT")
    ap.add_argument("--no-mps", action="store_true", help="do not start MPS (time-sliced)")
    ap.add_argument("--check-cost", action="store_true", help="JAX_RCCL_CHECK_CALLS 1 against 0")
    args = ap.parse_args(argv)
    check_args(ap, args)
    paths = [p for p in args.paths.split(",") if p]
    for p in paths:
        if p not in PATHS:
            ap.error(f"--paths: {p!r} is not one of {PATHS}")

    mps = Mps()
    live: list[subprocess.Popen] = []
    res: dict[str, list | None] = {}
    t0 = time.monotonic()
    try:
        if not args.no_mps:
            why = mps.start()
            if why is not None:
                print(f"MPS is not running and cannot be started here: {why} (--no-mps: go on)")
                return 2
        for path in paths:
            print(f"# {path}: starting {args.nprocs} processes", flush=True)
            res[path], problem = launch(args, path, mps.env, live)
            if problem:
                print(f"# {path}: FAILED\n{problem}", flush=True)
        if args.check_cost:
            report_check_cost(args, res)
        else:
            report(args, res, mps)
    finally:
        for proc in live:  # an interrupted run: its processes go too
            proc.kill()
            proc.wait()
        mps.stop()
    print(f"\n# total {time.monotonic() - t0:.0f} s")
    return 0 if all(res.get(p) for p in paths) else 1


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        result = worker(json.loads(sys.argv[2]))
        print(TAG + json.dumps(result), flush=True)
    else:
        raise SystemExit(main())
