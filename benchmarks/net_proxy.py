"""The network proxy (ffi/comm/proxy.h) over its network interface (our TCP, or UCX) against the
raw loopback socket bandwidth, measured in the same two processes.

    .venv/bin/python -P benchmarks/net_proxy.py [--sizes 1M,4M,16M,64M,256M] [--channels 1,2]
        [--repeat 3] [--net-threads 8] [--net-streams 0,4] [--step-kib 512] [--touch]
        [--nets socket,ucx_tcp,ucx_sm]

Two plain Python processes (no JAX), each one rank on its own fake host. Per size S and channel
count C, each rank's stand-in kernel (``jax_rccl._jax_rccl_testing.run_net_proxy``, verify off:
it writes and checks only each step's first and last words) sends S bytes to the other rank and
receives S bytes from it, in Simple steps of 512 KiB (``--step-kib``) spread over C channels (C
TCP connections each way, or with ``--net-streams`` S > 0 the C channels on S TCP streams each
way, JAX_RCCL_NET_STREAMS); the proxy of each process ships and lands every step. ``--touch``: the
stand-ins write every byte of a step they send and check every byte of one they receive, as the
kernels' stores into and loads from the FIFO windows in host memory do (the memory traffic of the
GPU path, less the bus). ``raw`` is the same traffic
over plain TCP sockets between the same processes: S bytes each way, C sockets each way, blocking
send/recv of 4 MiB in C++ (``raw_socket_transfer``), one thread per socket. GB/s = S / time (one
direction; both directions run at once). ratio = proxy GB/s / raw GB/s. Each figure is the
median of --repeat runs; the time is process 0's. ``--nets``: the networks the proxy runs on, each
in turn (JAX_RCCL_NET): ``socket`` (our TCP; the rows of every --net-streams), ``ucx_tcp`` and
``ucx_sm`` (UCX with UCX_TLS=tcp, or sm,self: its shared-memory transports, which the two fake
hosts of one machine can use), ``auto``; UCX as jax_rccl/_ucx.py loads it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

STEP = 512 * 1024  # Simple step: the default 4 MiB buffer / 8 steps
BUFF = (262144, 458752, 4194304)


def _publish(folder: str, name: str, text: str) -> None:
    tmp = os.path.join(folder, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(folder, name))


def _read(folder: str, name: str) -> str:
    path = os.path.join(folder, name)
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.005)
    with open(path) as f:
        return f.read()


def _barrier(folder: str, p: int, tag: str) -> None:
    _publish(folder, f"{tag}.{p}", "")
    _read(folder, f"{tag}.{1 - p}")


def _raw(native, folder: str, p: int, size: int, channels: int, tag: str) -> float:
    """S bytes each way over `channels` plain TCP sockets each way; seconds."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(channels)
    _publish(folder, f"raw{tag}.{p}", str(lsock.getsockname()[1]))
    port = int(_read(folder, f"raw{tag}.{1 - p}"))
    outs = [socket.create_connection(("127.0.0.1", port)) for _ in range(channels)]
    ins = [lsock.accept()[0] for _ in range(channels)]
    for s in outs + ins:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _barrier(folder, p, f"rawgo{tag}")
    secs = native.raw_socket_transfer(
        [s.fileno() for s in outs], [s.fileno() for s in ins], size // channels
    )
    for s in outs + ins + [lsock]:
        s.close()
    _barrier(folder, p, f"rawdone{tag}")
    return secs


#: --nets: (JAX_RCCL_NET, UCX_TLS) of each.
NETS = {
    "socket": ("socket", None),
    "ucx_tcp": ("ucx", "tcp"),
    "ucx_sm": ("ucx", "sm,self"),
    "auto": ("auto", None),
}


def _proxy(
    native, args, eps, p: int, size: int, channels: int, streams: int, group: int, net: str
) -> float:
    backend, tls = NETS[net]
    if tls is None:
        os.environ.pop("UCX_TLS", None)
    else:
        os.environ["UCX_TLS"] = tls  # read when the network's UCX worker starts
    step = args["step"]
    steps = -(-size // step)
    per = [steps // channels + (1 if c < steps % channels else 0) for c in range(channels)]
    peer = 1 - p
    prog = [
        {
            "channel": c,
            "protocol": "simple",
            "nsteps": n,
            "send_peers": [peer],
            "recv_peers": [peer],
        }
        for c, n in enumerate(per)
        if n > 0
    ]
    res = native.run_net_proxy(
        args["session"],
        p,
        group,
        eps,
        [0, 1],
        [p],
        [prog],
        [b // 8 for b in BUFF[:2]] + [step],
        60.0,
        -1,
        args["touch"],
        args["net_threads"],
        net_streams=streams,
        net=backend,
    )
    want = {c: n for c, n in enumerate(per) if n > 0}
    for channel, _, _, stand_in, proxy in res["conns"]:
        if not stand_in == proxy == want[channel]:
            raise RuntimeError(f"channel {channel}: moved {stand_in} / {proxy} of {want[channel]}")
    return res["seconds"]


def worker(args: dict) -> dict:
    from jax_rccl import _jax_rccl_testing as native

    p, folder = args["process"], args["folder"]
    secret = hashlib.sha256(f"benchmark {args['session']}".encode()).digest()
    native.set_session_secret(secret)
    if any(n != "socket" for n in args["nets"]):
        from jax_rccl import _ucx

        _ucx.load()
    port = native.socket_listen("127.0.0.1")
    _publish(folder, f"{p}.ep", f"127.0.0.1:{port}")
    eps = [_read(folder, f"{q}.ep") for q in range(2)]
    out: dict = {"process": p, "raw": {}, "proxy": {}}
    group = 1
    for size in args["sizes"]:
        for ch in args["channels"]:
            key = f"{size}x{ch}"
            raw: list[float] = []
            prox: dict[str, list[float]] = {v: [] for v in _variants(args)}
            for r in range(args["repeat"]):
                _barrier(folder, p, f"go{key}.{r}")
                raw.append(_raw(native, folder, p, size, ch, f"{key}.{r}"))
                for v in prox:
                    net, st = v.rsplit(":", 1)
                    _barrier(folder, p, f"px{key}.{r}.{v}")
                    prox[v].append(_proxy(native, args, eps, p, size, ch, int(st), group, net))
                    group += 1
            out["raw"][key] = statistics.median(raw)
            for v, times in prox.items():
                out["proxy"][f"{key}:{v}"] = statistics.median(times)
    return out


def _variants(args: dict) -> list[str]:
    """'net:streams' of every proxy row: our TCP with each stream count, the others once."""
    return [f"{n}:{st}" for n in args["nets"] for st in (args["streams"] if n == "socket" else [0])]


def parse_size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(s[:-1] if s[-1:] in "KMG" else s) * mult


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1M,4M,16M,64M,256M")
    ap.add_argument("--channels", default="1,2")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--net-threads",
        type=int,
        default=8,
        help="helper threads per proxy (as JAX_RCCL_NET_THREADS sets in a GPU group)",
    )
    ap.add_argument(
        "--net-streams",
        default="0",
        help="TCP streams each way the channels share, a list (JAX_RCCL_NET_STREAMS; 0: one each)",
    )
    ap.add_argument("--step-kib", type=int, default=STEP // 1024, help="Simple step, KiB")
    ap.add_argument("--touch", action="store_true", help="stand-ins write and check every byte")
    ap.add_argument("--nets", default="socket", help="networks, a list of " + ", ".join(NETS))
    a = ap.parse_args()
    if a.net_threads < 0:
        ap.error("--net-threads must be >= 0")
    if not 4 <= a.step_kib <= 4096:
        ap.error("--step-kib must be 4..4096")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    channels = [int(c) for c in a.channels.split(",")]
    streams = [int(s) for s in a.net_streams.split(",")]
    if any(not 0 <= s <= 64 for s in streams):
        ap.error("--net-streams: integers 0..64")
    nets = a.nets.split(",")
    if any(n not in NETS for n in nets):
        ap.error("--nets: a list of " + ", ".join(NETS))
    session = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as folder:
        procs = []
        for p in range(2):
            args = {
                "process": p,
                "session": session,
                "folder": folder,
                "sizes": sizes,
                "channels": channels,
                "streams": streams,
                "nets": nets,
                "repeat": a.repeat,
                "net_threads": a.net_threads,
                "step": a.step_kib * 1024,
                "touch": a.touch,
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-P", __file__, "--worker", json.dumps(args)],
                    stdout=subprocess.PIPE,
                )
            )
        outs = []
        for pr in procs:
            so, _ = pr.communicate(timeout=1800)
            if pr.returncode != 0:
                sys.exit(f"a worker failed (exit {pr.returncode})")
            outs.append(json.loads(so.decode().splitlines()[-1]))
    res = outs[0]
    print(
        f"2 processes, one rank each on its own fake host, loopback TCP; {os.cpu_count()} cores;"
        f" {a.net_threads} helper threads per proxy; {a.step_kib} KiB steps;"
        f" stand-ins {'touching every byte' if a.touch else 'writing first and last words'};"
        " GB/s = bytes per direction / time (both directions at once)"
    )
    print(
        f"{'size':>8} {'ch':>3} {'net':>8} {'str':>3} | {'raw ms':>9} {'GB/s':>6} | "
        f"{'proxy ms':>9} {'GB/s':>6} | {'ratio':>5}"
    )
    print("-" * 75)
    for size in sizes:
        for ch in channels:
            key = f"{size}x{ch}"
            raw = res["raw"][key]
            label = f"{size >> 20}MB" if size >= 1 << 20 else f"{size >> 10}KB"
            for v in _variants({"nets": nets, "streams": streams}):
                net, st = v.rsplit(":", 1)
                prox = res["proxy"][f"{key}:{v}"]
                shown = (int(st) or ch) if net == "socket" else "-"
                print(
                    f"{label:>8} {ch:>3} {net:>8} {shown:>3} | {raw * 1e3:9.2f} "
                    f"{size / raw / 1e9:6.2f} | {prox * 1e3:9.2f} {size / prox / 1e9:6.2f} | "
                    f"{raw / prox:5.2f}"
                )


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print(json.dumps(worker(json.loads(sys.argv[2]))), flush=True)
    else:
        main()
