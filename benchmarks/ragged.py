"""jax_rccl.ragged_all_to_all against a dense all_to_all of the padded maximum, same run.

On 8 virtual CPU devices: every device sends each peer a slice of 0..P rows (random, mean
`fill` x P), P = the padded block per peer; the dense baseline moves P rows to every peer
(jax_rccl.all_to_all and jax.lax.all_to_all of [n, P, row]). Reported per call: the median time,
the bytes that carry data (the ragged slices, the same for every column) per second, and for the
dense ones also the padded bytes per second; ratio = dense jax_rccl time / ragged time (above 1:
ragged is faster). The ragged program also fills its output with zeros (jax.lax's semantics: the
result is `output` with the slices written in); "fill us" is that fill alone, timed in the same
run, and "net GB/s" the data rate of the ragged time without it.

    .venv/bin/python -P benchmarks/ragged.py [--rows 64,1024] [--row-bytes 1024] [--fill 0.25,1]
        [--nprocs 4]

With ``--nprocs N`` the same table comes from N processes of one CPU device each (jax.distributed
on 127.0.0.1, jax_rccl across processes over shared memory, jax.lax's all_to_all over gloo);
every process times the same calls and process 0 prints. With ``--gpu`` as well, the N processes
share GPU 0 (start an MPS daemon first: ``nvidia-cuda-mps-control -d``); XLA's all_to_all has no
group of processes on one GPU, so its column is left out there.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

if "--process" not in sys.argv:  # a process of --nprocs gets its environment from the parent
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402


def time_fn(fn, args, min_iters: int, min_seconds: float, exact: bool = False) -> float:
    """The median time of a call: at least `min_iters` calls and `min_seconds` (exactly
    `min_iters` calls with `exact`: processes of one job must make the same calls)."""
    for _ in range(3):
        jax.block_until_ready(fn(*args))
    times = []
    t_end = time.perf_counter() + min_seconds
    while len(times) < min_iters or (not exact and time.perf_counter() < t_end):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return statistics.median(times)


def ragged_case(rng, n: int, rows: int, fill: float):
    """Per device: input_offsets, send_sizes, output_offsets, recv_sizes, each [n, n]; slice
    (s -> d) at block d of the sender's operand and block s of the receiver's output."""
    hi = max(0, min(rows, int(round(2 * fill * rows))))
    send = rng.integers(0, hi + 1, (n, n)) if fill < 1 else np.full((n, n), rows)
    send = np.minimum(send, rows).astype(np.int32)
    blocks = (np.arange(n, dtype=np.int32) * rows)[None, :].repeat(n, 0)
    return blocks, send, blocks.T.copy(), send.T.copy()


def launch(args, argv: list[str]) -> int:
    """Runs this script as `args.nprocs` processes of one CPU device each; prints process 0's
    output (and a failed process's)."""
    port = _common.free_port()
    env = dict(os.environ, JAX_RCCL_TIMEOUT="120")
    if args.gpu:
        env.update(CUDA_VISIBLE_DEVICES="0", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        env.pop("XLA_FLAGS", None)
    else:
        env.update(XLA_FLAGS="--xla_force_host_platform_device_count=1", JAX_PLATFORMS="cpu")
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", __file__, *argv, f"--process={i}", f"--port={port}"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(args.nprocs)
    ]
    rc = 0
    for i, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            print(f"process {i} did not finish within {args.timeout} s", file=sys.stderr)
        if i == 0 or p.returncode != 0:
            print(out if p.returncode == 0 else f"process {i} failed:\n{out[-3000:]}", end="")
        rc = rc or (p.returncode or 0)
    return rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", default="16,256,4096", help="P: padded rows per peer")
    ap.add_argument("--row-bytes", type=int, default=1024)
    ap.add_argument("--fill", default="0.125,0.5,1", help="mean fraction of P sent")
    ap.add_argument("--min-iters", type=int, default=5, help="calls timed (exactly, with --nprocs)")
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--nprocs", type=int, default=0, help="processes of one CPU device each")
    ap.add_argument("--gpu", action="store_true", help="with --nprocs: processes share GPU 0")
    ap.add_argument("--timeout", type=float, default=900, help="seconds for the processes")
    ap.add_argument("--process", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.nprocs > 1 and args.process < 0:
        return launch(args, sys.argv[1:])
    if args.process >= 0:
        _common.join_local_job(args.port, args.nprocs, args.process, gloo=not args.gpu)
    quiet = args.process > 0
    exact = args.process >= 0

    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    width = args.row_bytes // 4
    spec = P("i")

    def smap(body):
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))

    # The output starts as zeros made in the program (as a mixture-of-experts layer does), so
    # the result takes its buffer without a copy.
    ragged = smap(
        lambda x, a, b, c, d: jax_rccl.ragged_all_to_all(
            x, jnp.zeros_like(x), a, b, c, d, axis_name="i"
        )
    )
    zeros = smap(lambda x: jnp.zeros_like(x) + np.float32(0))
    # XLA's GPU all_to_all needs a GPU per process: none across processes sharing one.
    libs = (jax_rccl,) if args.gpu and args.process >= 0 else (jax_rccl, jax.lax)
    dense = {lib: smap(lambda x, lib=lib: lib.all_to_all(x, "i", 0, 0, tiled=True)) for lib in libs}
    kind = devices[0].platform.upper()
    where = f"{kind} devices, one per process" if args.process >= 0 else f"{kind} devices"
    say = (lambda *a: None) if quiet else print
    say(
        f"jax {jax.__version__}, {n} {where}, {os.cpu_count()} cores; rows of "
        f"{args.row_bytes} B; GB/s = bytes per device per call / median time"
    )
    head = (
        f"{'P rows':>7} {'fill':>5} {'data/dev':>10} | {'ragged us':>10} {'GB/s':>6} "
        f"{'fill us':>9} {'net GB/s':>8} | "
        f"{'dense rccl us':>13} {'data':>6} {'padded':>6} | {'dense lax us':>12} {'data':>6} | "
        f"{'ratio':>5}"
    )
    _common.print_head(head, say)
    rng = np.random.default_rng(0)
    for rows in (int(r) for r in args.rows.split(",")):
        ones = np.ones((n * n * rows, width), np.float32)
        x = jax.make_array_from_callback(ones.shape, sharding, lambda i, ones=ones: ones[i])
        t_dense = {
            lib: time_fn(f, (x,), args.min_iters, args.min_seconds, exact)
            for lib, f in dense.items()
        }
        t_zero = time_fn(zeros, (x,), args.min_iters, args.min_seconds, exact)
        for fill in (float(f) for f in args.fill.split(",")):
            idx = ragged_case(rng, n, rows, fill)
            idx_dev = [
                jax.make_array_from_callback((n * n,), sharding, lambda i, v=v: v.reshape(-1)[i])
                for v in idx
            ]
            t = time_fn(ragged, (x, *idx_dev), args.min_iters, args.min_seconds, exact)
            data = float(idx[1].sum()) * args.row_bytes / n  # bytes each device sends
            padded = n * rows * args.row_bytes
            tr, tl = t_dense[jax_rccl], t_dense.get(jax.lax)
            if tl is None:
                lax = f"{'n/a':>12} {'':>6}"
            else:
                lax = f"{tl * 1e6:>12.1f} {data / tl / 1e9:>6.2f}"
            say(
                f"{rows:>7} {fill:>5.3g} {data / 2**20:>8.2f}MB | {t * 1e6:>10.1f} "
                f"{data / t / 1e9:>6.2f} {t_zero * 1e6:>9.1f} "
                f"{data / max(t - t_zero, 1e-9) / 1e9:>8.2f} | "
                f"{tr * 1e6:>13.1f} {data / tr / 1e9:>6.2f} "
                f"{padded / tr / 1e9:>6.2f} | {lax} | "
                f"{tr / t:>5.2f}"
            )


if __name__ == "__main__":
    sys.exit(main())
