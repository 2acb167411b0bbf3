"""jax_rccl against jax.lax on 8 virtual CPU devices, in the same run.

For psum, all_gather and psum_scatter at 1 KB .. 64 MB per device: median time per call of a
jitted shard_map holding one collective (jax.lax's and jax_rccl's calls alternating), the median
of `--runs` runs, algorithm bandwidth and bus bandwidth (nccl-tests formulas), and the ratio
(jax.lax time / jax_rccl time: above 1 means jax_rccl is faster).

    .venv/bin/python -P benchmarks/cpu_collectives.py [--sizes 1K,1M] [--colls psum]
"""

from __future__ import annotations

import argparse
import operator
import os
import statistics
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import _common  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402

UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(s: str) -> int:
    s = s.strip().upper().rstrip("B")
    return int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)


def fmt_size(n: int) -> str:
    for u in ("G", "M", "K"):
        if n >= UNITS[u] and n % UNITS[u] == 0:
            return f"{n // UNITS[u]}{u}B"
    return f"{n}B"


def make_fn(lib, coll: str, mesh: Mesh):
    if coll == "psum":
        body = lambda x: lib.psum(x, "i")  # noqa: E731
        out = P("i")
    elif coll == "all_gather":
        body = lambda x: lib.all_gather(x, "i", tiled=True)  # noqa: E731
        out = P("i")
    else:  # psum_scatter
        body = lambda x: lib.psum_scatter(x, "i", tiled=True)  # noqa: E731
        out = P("i")
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=out))


def bus_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "psum" else (n - 1) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", default="1K,4K,16K,64K,256K,1M,4M,16M,64M")
    ap.add_argument("--colls", default="psum,all_gather,psum_scatter")
    ap.add_argument("--min-iters", type=int, default=5)
    ap.add_argument("--min-seconds", type=float, default=0.3)
    ap.add_argument("--runs", type=int, default=3, help="runs per point; the table: their medians")
    args = ap.parse_args()

    # each call waits with its array's own block_until_ready (jax.block_until_ready costs more)
    ready = operator.methodcaller("block_until_ready")
    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    print(
        f"jax {jax.__version__}, {n} CPU devices, {os.cpu_count()} cores; "
        f"time = median per call (calls alternating), median of {args.runs} runs; "
        "ratio = jax.lax time / jax_rccl time"
    )
    head = (
        f"{'coll':<13}{'size/dev':>9} | {'lax us':>10} {'algbw':>7} {'busbw':>7} | "
        f"{'rccl us':>10} {'algbw':>7} {'busbw':>7} | {'ratio':>6}"
    )
    _common.print_head(head)
    for coll in args.colls.split(","):
        for size in (parse_size(s) for s in args.sizes.split(",")):
            count = max(size // 4, n) // n * n  # float32 elements per device, divisible by n
            x = jax.device_put(jnp.ones((n * count,), jnp.float32), sharding)
            f_lax, f_rccl = make_fn(jax.lax, coll, mesh), make_fn(jax_rccl, coll, mesh)
            runs = [
                _common.time_pair(f_lax, f_rccl, (x,), args.min_iters, args.min_seconds, ready)
                for _ in range(args.runs)
            ]
            t_lax = statistics.median(r[0] for r in runs)
            t_rccl = statistics.median(r[1] for r in runs)
            # nccl-tests: psum and psum_scatter count the input per device, all_gather the
            # output per device.
            nbytes = count * 4 * (n if coll == "all_gather" else 1)
            row = [coll, fmt_size(size)]
            for t in (t_lax, t_rccl):
                algbw = nbytes / t / 1e9
                row += [f"{t * 1e6:10.1f}", f"{algbw:7.2f}", f"{algbw * bus_factor(coll, n):7.2f}"]
            print(
                f"{row[0]:<13}{row[1]:>9} | {' '.join(row[2:5])} | {' '.join(row[5:8])} | "
                f"{t_lax / t_rccl:6.2f}"
            )


if __name__ == "__main__":
    main()
