"""jax_rccl against jax.lax on every visible GPU of one process, in the same run, nccl-tests style.

A 1-D mesh "x" over jax.devices() (n devices, n = 1 works too). For all_reduce (psum), all_gather
(tiled) and reduce_scatter (psum_scatter, scatter_dimension=0, tiled), float32, sizes 8 B ..
--max-bytes in powers of 4, the same arrays go through jax.lax.<op> and jax_rccl.<op>:

- mode "call": one jitted shard_map call per Python loop iteration, block_until_ready, median
  of --iters timed calls (dispatch included, like nccl-tests' time per call);
- mode "loop": --loop collectives inside one program (jax.lax.fori_loop, each result feeding the
  next: all_reduce x -> psum(x)/n, all_gather x -> all_gather(x)[:len(x)], reduce_scatter
  x -> x with its first block replaced by psum_scatter(x)/n); time = median program time / K;
- mode "unrolled": the same K collectives as straight-line code (the fori_loop unrolled): no
  while loop between them, so the time is the collectives' own and XLA's launch gaps.

size is nccl-tests' whole buffer per device (all_gather: the output, reduce_scatter: the input),
count its float32 elements; busbw = size / time * 2(n-1)/n (all_reduce) or (n-1)/n (the others),
0 for n = 1; ratio = jax.lax time / jax_rccl time (above 1: jax_rccl is faster). errors: elements
where jax_rccl's result differs from jax.lax's, checked once per size (call mode: exactly;
loop modes: to rtol 1e-5, since the sums may round in another order); on a row where jax.lax
failed, against numpy (to rtol 1e-5).

    .venv/bin/python -P benchmarks/gpu_jax.py [--max-bytes 1G] [--iters 20] [--loop 50]
        [--loop-max-bytes 256M] [--colls all_reduce,...] [--modes call,loop,unrolled]
        [--command-buffers]

--command-buffers re-runs this script in a subprocess with XLA's command buffers on for
fusions, custom calls, collectives and while loops (XLA_FLAGS below); a row whose program fails
(e.g. XLA cannot instantiate a CUDA graph) prints "FAIL: <message>" and the run goes on.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast off (docs/DESIGN.md); before jax
sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import parse_size, sizes  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402

COMMAND_BUFFER_FLAGS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,COLLECTIVES,WHILE "
    "--xla_gpu_graph_min_graph_size=1"
)
_CHILD_ENV = "JAX_RCCL_TEST_GPU_JAX_CHILD"  # set in the re-executed subprocess
COLLS = ("all_reduce", "all_gather", "reduce_scatter")
MODES = ("call", "loop", "unrolled")
LIBS = (("lax", jax.lax), ("jax_rccl", jax_rccl))


def bus_factor(coll: str, n: int) -> float:
    return 2 * (n - 1) / n if coll == "all_reduce" else (n - 1) / n


def shapes(coll: str, size: int, n: int) -> tuple[int, int]:
    """(elements of the whole buffer per device, elements of each device's input)."""
    if coll == "all_reduce":
        count = max(1, size // 4)
        return count, count
    block = max(1, size // 4 // n)  # all_gather: input block; reduce_scatter: output block
    return block * n, block if coll == "all_gather" else block * n


def apply(lib, coll: str, x):
    if coll == "all_reduce":
        return lib.psum(x, "x")
    if coll == "all_gather":
        return lib.all_gather(x, "x", tiled=True)
    return lib.psum_scatter(x, "x", scatter_dimension=0, tiled=True)


def make_call(lib, coll: str, mesh: Mesh) -> Callable:
    body = lambda x: apply(lib, coll, x)  # noqa: E731
    sm = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    return jax.jit(sm)


def make_loop(lib, coll: str, mesh: Mesh, k: int, unroll: bool = False) -> Callable:
    """K collectives in one program; each result feeds the next so none can be hoisted or
    dropped, and values stay bounded. unroll: straight-line code (no while loop, so no loop
    overhead between the collectives)."""
    inv = 1.0 / mesh.size

    def step(_, x):
        if coll == "all_reduce":
            return apply(lib, coll, x) * inv
        if coll == "all_gather":
            return apply(lib, coll, x)[: x.shape[0]]
        y = apply(lib, coll, x)
        return lax.dynamic_update_slice(x, y * inv, (0,))

    body = lambda x: lax.fori_loop(0, k, step, x, unroll=unroll)  # noqa: E731
    sm = jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    return jax.jit(sm)


def numpy_reference(coll: str, mode: str, k: int, x: jax.Array) -> list[np.ndarray]:
    """Every device's expected result, in float64 (for rows where jax.lax itself failed)."""
    xs = [np.asarray(s.data, np.float64) for s in x.addressable_shards]
    n = len(xs)
    steps = 1 if mode == "call" else k
    for _ in range(steps):
        if coll == "all_reduce":
            total = np.sum(xs, axis=0)
            xs = [total if mode == "call" else total / n for _ in range(n)]
        elif coll == "all_gather":
            full = np.concatenate(xs)
            xs = [full if mode == "call" else full[: xs[0].shape[0]] for _ in range(n)]
        else:
            total = np.sum(xs, axis=0)
            b = total.shape[0] // n
            if mode == "call":
                xs = [total[d * b : (d + 1) * b] for d in range(n)]
            else:
                xs = [np.concatenate([total[d * b : (d + 1) * b] / n, xs[d][b:]]) for d in range(n)]
    return xs


def count_errors_np(want: list[np.ndarray], got: jax.Array) -> int:
    bad = 0
    for w, sg in zip(want, got.addressable_shards, strict=True):
        g = np.asarray(sg.data, np.float64)
        if w.shape != g.shape:
            bad += max(w.size, g.size)
        else:
            bad += int(np.count_nonzero(~np.isclose(g, w, rtol=1e-5, atol=1e-5)))
    return bad


def make_input(total: int, sharding: NamedSharding) -> jax.Array:
    """Small integers (-4..4) as float32, different on every device, made on the devices."""

    def gen():
        i = lax.iota(jnp.uint32, total) * jnp.uint32(2654435761)
        return ((i >> 16) % 9).astype(jnp.float32) - 4.0

    return jax.jit(gen, out_shardings=sharding)()


def time_program(fn: Callable, x: jax.Array, iters: int, warmup: int = 2):
    """Median seconds per call (block_until_ready after each) and the last result."""
    out = fn(x)  # compiles
    out.block_until_ready()
    for _ in range(warmup):
        out = fn(x)
        out.block_until_ready()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        out = fn(x)
        out.block_until_ready()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def count_errors(want: jax.Array, got: jax.Array, exact: bool) -> int:
    """Elements where `got` differs from `want`, device by device (np.testing decides)."""
    bad = 0
    shards = zip(want.addressable_shards, got.addressable_shards, strict=True)
    for sw, sg in shards:
        w, g = np.asarray(sw.data), np.asarray(sg.data)
        try:
            if exact:
                np.testing.assert_array_equal(g, w)
            else:
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        except AssertionError:
            if w.shape != g.shape:
                bad += max(w.size, g.size)
            elif exact:
                bad += int(np.count_nonzero(g != w))
            else:
                bad += int(np.count_nonzero(~np.isclose(g, w, rtol=1e-5, atol=1e-5)))
    return bad


def short(e: BaseException, width: int = 110) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    msg = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return msg if len(msg) <= width else msg[: width - 3] + "..."


HEAD = (
    f"{'size(B)':>12} {'count':>11} | {'lax us':>10} {'rccl us':>10} {'ratio':>6} | "
    f"{'lax busbw':>9} {'rccl busbw':>10} | {'errors':>6}"
)


def run_table(args, coll: str, mode: str, mesh: Mesh, sharding: NamedSharding) -> None:
    n = mesh.size
    k = args.loop
    hi = parse_size(args.max_bytes)
    if mode in ("loop", "unrolled"):
        hi = min(hi, parse_size(args.loop_max_bytes))
        how = "fori_loop" if mode == "loop" else "straight-line code, the fori_loop unrolled"
        what = f"{k} collectives in one program ({how}), time = median program time / {k}"
    else:
        what = "one jitted shard_map call per iteration, time = median per call"
    print(f"\n## {coll}, mode {mode}: {what}; {args.iters} timed iterations, n = {n}")
    print(HEAD)
    print("-" * len(HEAD))
    ratios = []
    for size in sizes(parse_size(args.min_bytes), hi):
        count, per_dev = shapes(coll, size, n)
        nbytes = count * 4
        t: dict[str, float] = {}
        outs: dict[str, jax.Array] = {}
        fails: list[str] = []
        try:
            x = make_input(n * per_dev, sharding)
            for name, lib in LIBS:
                try:
                    fn = (
                        make_call(lib, coll, mesh)
                        if mode == "call"
                        else make_loop(lib, coll, mesh, k, unroll=mode == "unrolled")
                    )
                    secs, outs[name] = time_program(fn, x, args.iters)
                    t[name] = secs / (1 if mode == "call" else k)
                except Exception as e:  # a row's failure must not end the run
                    fails.append(f"{name}: {short(e)}")
            if len(outs) == 2:
                errors = str(count_errors(outs["lax"], outs["jax_rccl"], exact=mode == "call"))
            elif "jax_rccl" in outs:  # jax.lax failed: numpy says what is right
                want = numpy_reference(coll, mode, k, x)
                errors = str(count_errors_np(want, outs["jax_rccl"]))
            else:
                errors = "-"
        except Exception as e:
            fails.append(short(e))
            errors = "-"
        outs.clear()
        cols = []
        for name in ("lax", "jax_rccl"):
            cols.append(f"{t[name] * 1e6:10.2f}" if name in t else f"{'FAIL':>10}")
        if len(t) == 2:
            ratio = t["lax"] / t["jax_rccl"]
            ratios.append(ratio)
            cols.append(f"{ratio:6.2f}")
        else:
            cols.append(f"{'-':>6}")
        bw = []
        for name, width in (("lax", 9), ("jax_rccl", 10)):
            if name in t:
                bw.append(f"{nbytes / t[name] / 1e9 * bus_factor(coll, n):{width}.2f}")
            else:
                bw.append(f"{'-':>{width}}")
        line = f"{nbytes:>12} {count:>11} | {' '.join(cols)} | {' '.join(bw)} | {errors:>6}"
        if fails:
            line += "  FAIL: " + "; ".join(fails)
        print(line, flush=True)
    if ratios:
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"ratio geomean over {len(ratios)} sizes: {geo:.2f}")


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--modes", default="call,loop")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per program")
    ap.add_argument("--loop", type=int, default=50, help="collectives per program, loop mode")
    ap.add_argument(
        "--loop-max-bytes", default="256M", help="loop and unrolled modes only up to this size"
    )
    ap.add_argument(
        "--command-buffers",
        action="store_true",
        help=f"re-run in a subprocess with XLA_FLAGS+={COMMAND_BUFFER_FLAGS!r}",
    )
    args = ap.parse_args(argv)
    colls = [c for c in args.colls.split(",") if c]
    modes = [m for m in args.modes.split(",") if m]
    for c in colls:
        if c not in COLLS:
            ap.error(f"--colls: {c!r} is not one of {COLLS}")
    for m in modes:
        if m not in MODES:
            ap.error(f"--modes: {m!r} is not one of {MODES}")
    if args.iters < 1 or args.loop < 1:
        ap.error("--iters and --loop must be >= 1")

    if args.command_buffers and os.environ.get(_CHILD_ENV) != "1":
        env = dict(os.environ)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + COMMAND_BUFFER_FLAGS).strip()
        env[_CHILD_ENV] = "1"
        cmd = [sys.executable, *(["-P"] if sys.flags.safe_path else [])]
        cmd += [os.path.abspath(__file__), *argv]
        print(
            f"# --command-buffers: re-running in a subprocess with XLA_FLAGS={env['XLA_FLAGS']!r}",
            flush=True,
        )
        return subprocess.run(cmd, env=env, check=False).returncode

    devices = jax.devices()
    n = len(devices)
    mesh = Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    d0 = devices[0]
    print(
        f"# jax {jax.__version__}, jaxlib {_version('jaxlib')}, jax_rccl {jax_rccl.__version__}, "
        f"python {sys.version.split()[0]}"
    )
    print(f"# devices: n = {n}, platform {d0.platform}, kind {d0.device_kind!r}")
    if d0.platform != "gpu":
        print(f"# note: these are {d0.platform.upper()} devices, not GPUs: a smoke test only")
    print(
        f"# flags: colls={','.join(colls)} modes={','.join(modes)} "
        f"bytes={args.min_bytes}..{args.max_bytes} iters={args.iters} loop={args.loop} "
        f"loop-max-bytes={args.loop_max_bytes} command-buffers={args.command_buffers}"
    )
    print(
        f"# env: XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} "
        f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}"
    )
    print("# ratio = jax.lax time / jax_rccl time (above 1: jax_rccl faster); busbw in GB/s")
    jax_rccl.reset_runtime_stats()
    t0 = time.perf_counter()
    for coll in colls:
        for mode in modes:
            run_table(args, coll, mode, mesh, sharding)
    stats = jax_rccl.runtime_stats()
    print(f"\n# jax_rccl runtime_stats: {', '.join(f'{k}={v}' for k, v in sorted(stats.items()))}")
    print(f"# total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
