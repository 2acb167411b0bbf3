"""GPU collectives on one GPU with several ranks (the harness), nccl-tests style.

For each of all_reduce, all_gather and reduce_scatter, ranks 2/4/8, sizes 8 B .. 1 GiB: time per
launch of every rank (a host loop, synchronized at the end), algbw and busbw (nccl-tests'
definitions), errors (the result checked once against the known answer), and the HBM floor
measured in the same run: the bytes N ranks on one GPU must at least move through HBM over the
device copy's bandwidth (read+write), "%floor" = floor time / our time. all_reduce (S the buffer per
rank): every rank reads S and writes S, 2·N·S; all_gather (S the output per rank): the N outputs
written, N·S, and every input read once, N·(S/N); reduce_scatter (S the input per rank): the N
inputs read, N·S, and the outputs written, N·(S/N); so (N+1)·S for either.
Sizes up to --graph-max-bytes are also timed in captured graphs: one collective per graph replayed
(``graph us``, next to an empty kernel launch and an empty graph replay; ``%floor g`` the floor
over it: the N launches of one process's host loop stand in for N processes' one launch each, so
from a few MB the replay is the kernels' own time), and one collective among 20 in one
graph (``in-graph us``, the latency of a collective inside a program, next to an empty kernel
among 20 in one graph; ``%floor 20`` the floor over it: the time of a collective inside a jitted
program's command buffer, where no launch or replay of its own comes between it and the next).

    python benchmarks/gpu_collectives.py [--ranks 2,4,8] [--max-bytes 1G] [--colls ...]

--check-cost measures what the per-call check costs (docs/multiprocess.md): two harnesses of the
same ranks, one made with JAX_RCCL_CHECK_CALLS=1 (every step tagged and checked, the calls counted
on the device) and one with 0, timed in turns in the same run (--turns rounds of on, off, off,
on; the best of each): the time per launch, the collective among 20 in one graph, and the
difference.

    python benchmarks/gpu_collectives.py --check-cost [--ranks 2] [--max-bytes 256M]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NamedTuple

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import numpy as np  # noqa: E402
from _common import sizes  # noqa: E402

from jax_rccl import _jax_rccl, harness  # noqa: E402

BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
}


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1].upper() in mult:
        return int(float(s[:-1]) * mult[s[-1].upper()])
    return int(s)


def check(h: harness.Harness, coll: str, n: int, count: int, slots) -> int:
    """Fills inputs with rank + 1, runs once, counts wrong elements of rank 0's output."""
    for r in range(n):
        cnt = harness.input_count({"coll": coll, "count": count}, n)
        _jax_rccl.gpu.upload(slots[r][0][0], np.full(cnt, r + 1, np.float32).tobytes())
    h.launch(slots)
    h.sync()
    out_n = harness.output_count({"coll": coll, "count": count}, n)
    got = np.frombuffer(_jax_rccl.gpu.download(slots[0][0][1], out_n * 4), np.float32)
    if coll == "all_gather":
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
    else:  # all_reduce, reduce_scatter: the sum of 1..n everywhere
        want = np.full(out_n, n * (n + 1) / 2, np.float32)
    return int(np.count_nonzero(got != want))


class Point(NamedTuple):
    """One size of one collective: its task; nccl-tests' size, the whole buffer (all_gather: the
    output, reduce_scatter: the input), at least 4 B; the bytes algbw counts; the launches timed."""

    task: dict
    total: int
    nbytes: int
    iters: int


def point(coll: str, size: int, n: int, iters: int) -> Point:
    total = max(4, size)
    count = total // 4 if coll == "all_reduce" else max(1, total // 4 // n)
    task = {"coll": coll, "count": count, "dtype": "float32", "op": "sum"}
    nbytes = count * 4 * (n if coll != "all_reduce" else 1)
    return Point(task, total, nbytes, iters if total < (256 << 20) else max(3, iters // 4))


def _harness(n: int, args, buff) -> harness.Harness:
    """A harness of n ranks on the command line's channels, protocol and buffers."""
    return harness.Harness(
        n,
        harness.gpu_topology(
            n,
            nchannels=args.nchannels or None,
            ll128="LL128" in args.protocol.upper(),
            buff_sizes=buff,
        ),
        timeout=60.0,
    )


def make_harness(n: int, args, buff, check: bool) -> harness.Harness:
    """A harness of n ranks; `check`: made under JAX_RCCL_CHECK_CALLS=1 (else 0)."""
    old = os.environ.get("JAX_RCCL_CHECK_CALLS")
    os.environ["JAX_RCCL_CHECK_CALLS"] = "1" if check else "0"
    try:
        return _harness(n, args, buff)
    finally:
        if old is None:
            os.environ.pop("JAX_RCCL_CHECK_CALLS", None)
        else:
            os.environ["JAX_RCCL_CHECK_CALLS"] = old


def check_cost(args, buff) -> None:
    """The check on against off, in turns (module docstring)."""
    gmax = parse_size(args.graph_max_bytes)
    for n in [int(x) for x in args.ranks.split(",")]:
        hs = {True: make_harness(n, args, buff, True), False: make_harness(n, args, buff, False)}
        for coll in args.colls.split(","):
            print(f"\n## check cost: {coll}, {n} ranks on one GPU, float32 sum")
            print(
                f"{'size(B)':>12} {'algo':>5} {'proto':>6} {'on us':>10} {'off us':>10} "
                f"{'cost':>7} {'in-graph on':>11} {'off':>8} {'cost us':>8} {'errors':>6}"
            )
            for size in sizes(parse_size(args.min_bytes), parse_size(args.max_bytes)):
                task, total, nbytes, iters = point(coll, size, n, args.iters)
                count = task["count"]
                best = {True: [float("inf")] * 2, False: [float("inf")] * 2}
                errors, summary = 0, None
                built = {}
                for on, h in hs.items():
                    summary = h.build([task], algorithm=args.algorithm, protocol=args.protocol)[0]
                    built[on] = h.buffers()
                    errors += check(h, coll, n, count, built[on])
                for _ in range(args.turns):
                    for on in (True, False, False, True):  # ABBA: each side as often, as late
                        h = hs[on]
                        t = h.time_launches(built[on], warmup=3, iters=iters)
                        g = h.time_graph(built[on], iters=10, reps=20) if total <= gmax else 0.0
                        best[on] = [min(best[on][0], t), min(best[on][1], g)]
                for h in hs.values():
                    h.free()
                (t1, g1), (t0, g0) = best[True], best[False]
                print(
                    f"{nbytes:>12} {summary['algorithm']:>5} {summary['protocol']:>6} "
                    f"{t1:>10.2f} {t0:>10.2f} {100 * (t1 - t0) / t0:>6.2f}% "
                    f"{g1:>11.3f} {g0:>8.3f} {g1 - g0:>8.3f} {errors:>6}"
                )
                sys.stdout.flush()
        del hs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--colls", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--min-bytes", default="8")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--graph-max-bytes", default="1M", help="also time graph replays up to this")
    ap.add_argument("--nchannels", type=int, default=0, help="0: the harness default")
    ap.add_argument("--algorithm", default="", help="NCCL syntax, e.g. Ring, Direct, ^Direct")
    ap.add_argument(
        "--protocol", default="", help="NCCL syntax, e.g. LL, Simple, LL128 (allows LL128)"
    )
    ap.add_argument(
        "--buff-sizes",
        default="",
        help="connection buffer bytes per protocol, LL,LL128,Simple (default: the JAX handlers')",
    )
    ap.add_argument("--check-cost", action="store_true", help="the check on against off")
    ap.add_argument(
        "--turns", type=int, default=5, help="--check-cost: rounds of on, off, off, on (the best)"
    )
    args = ap.parse_args(argv)
    buff = tuple(parse_size(x) for x in args.buff_sizes.split(",")) if args.buff_sizes else None
    if buff is not None and len(buff) != 3:
        ap.error(f"--buff-sizes takes 3 sizes (LL,LL128,Simple), got {args.buff_sizes!r}")
    if not harness.available():
        print("no GPU build or no GPU: nothing to measure")
        return 0
    fl = harness.floors()
    copy_gbs = fl["copy_gbs"]
    print(f"# device: {_jax_rccl.gpu.build_info()}")
    print(
        f"# floors: d2d copy {copy_gbs:.0f} GB/s (read+write); empty launch "
        f"{fl['launch_us']:.2f} us; empty graph replay {fl['graph_us']:.2f} us; empty kernel among "
        f"{fl['graph_reps']} in a graph {fl['graph_kernel_us']:.2f} us"
    )
    if args.check_cost:
        check_cost(args, buff)
        return 0
    gmax = parse_size(args.graph_max_bytes)
    for n in [int(x) for x in args.ranks.split(",")]:
        h = _harness(n, args, buff)
        for coll in args.colls.split(","):
            print(f"\n## {coll}, {n} ranks on one GPU, float32 sum")
            print(
                f"{'size(B)':>12} {'count':>11} {'algo':>5} {'proto':>6} {'ch':>3} {'time us':>10} "
                f"{'algbw':>8} {'busbw':>8} {'%floor':>7} {'graph us':>9} {'%floor g':>8} "
                f"{'in-graph':>9} {'%floor 20':>9} {'errors':>6}"
            )
            for size in sizes(parse_size(args.min_bytes), parse_size(args.max_bytes)):
                task, total, nbytes, iters = point(coll, size, n, args.iters)
                count = task["count"]
                summary = h.build([task], algorithm=args.algorithm, protocol=args.protocol)[0]
                slots = h.buffers()
                errors = check(h, coll, n, count, slots)
                t = h.time_launches(slots, warmup=3, iters=iters)
                g = h.time_graph(slots, iters=100) if total <= gmax else float("nan")
                g20 = h.time_graph(slots, iters=10, reps=20) if total <= gmax else float("nan")
                h.free()
                algbw = nbytes / t / 1e3
                busbw = algbw * BUSBW[coll](n)
                # Bytes the N ranks must move (module docstring): all_reduce 2·N·S; the
                # gathers (N+1)·S (N buffers of S, N of S/N).
                floor_bytes = nbytes * (2 * n if coll == "all_reduce" else n + 1)
                floor_us = floor_bytes / (copy_gbs * 1e3)
                print(
                    f"{nbytes:>12} {count:>11} {summary['algorithm']:>5} "
                    f"{summary['protocol']:>6} {summary['nchannels']:>3} {t:>10.2f} "
                    f"{algbw:>8.2f} {busbw:>8.2f} "
                    f"{100 * floor_us / t:>6.1f}% {g:>9.2f} {100 * floor_us / g:>7.1f}% "
                    f"{g20:>9.2f} {100 * floor_us / g20:>8.1f}% {errors:>6}"
                )
                sys.stdout.flush()
        del h
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
