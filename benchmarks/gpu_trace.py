"""Where one small collective's time goes: a device timeline of one launch on one GPU (harness).

    python -P benchmarks/gpu_trace.py [--ranks 2] [--coll all_reduce] [--bytes 8]
        [--algorithm Ring] [--protocol LL] [--warmup 20] [--tasks 1]

After --warmup launches (caches and counters warm), one launch of every rank records, per block,
when it started, loaded each work, began its element, and for each FIFO step (piece) when it
began, when its waits were satisfied (ready), when its data had moved and when its counters were
posted, and when it ended (hip/device_conn.h: TraceEvent; the device's nanosecond clock). Prints
block 0 of every rank (time since the earliest start, gap to the previous event), then the mean of
each phase over every rank's blocks, next to an empty kernel launch measured in the same run.

With --tasks N, the launch holds N such collectives (one work each, in turn on every block): the
phases are then told apart by work ("w1: piece -> ready"), so that a later work's phases show
what the same steps cost once the block runs (its code and the launch's data already fetched).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from jax_rccl import harness

# A block's timeline holds TRACE_EVENTS (64) events: start, end and, per work, its load, its
# element and four per piece (one piece for Direct: ten works fit; a ring's several pieces
# fewer; a full timeline is reported).
MAX_TASKS = 10


def phases(events: list[tuple[str, float]]) -> dict[str, list[float]]:
    """Durations of a block's phases (us) from its events: every pair of consecutive events
    ("piece -> ready": a FIFO step's waits; "ready -> moved": its data; ...), and the block's
    whole time."""
    out: dict[str, list[float]] = {}
    works = sum(1 for e, _ in events if e == "work")
    w = -1
    for (a, ta), (b, tb) in zip(events[:-1], events[1:], strict=True):
        if a == "work":
            w += 1
        tag = f"w{w}: " if works > 1 and w >= 0 and b != "work" else ""
        out.setdefault(f"{tag}{a} -> {b}", []).append(tb - ta)
    names = [e for e, _ in events]
    if "start" in names and "end" in names:
        t = dict(events)
        out["start -> end (block)"] = [t["end"] - t["start"]]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument(
        "--coll",
        default="all_reduce",
        choices=["all_reduce", "all_gather", "reduce_scatter", "broadcast"],
    )
    ap.add_argument("--bytes", type=int, default=8, help="per rank (all_reduce: the buffer)")
    ap.add_argument("--algorithm", default="", help="NCCL syntax, e.g. Ring, Tree")
    ap.add_argument("--protocol", default="", help="NCCL syntax, e.g. LL, Simple")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=1, help="collectives in the one launch")
    args = ap.parse_args(argv)
    if not 1 <= args.tasks <= MAX_TASKS:
        ap.error(
            f"--tasks must be in [1, {MAX_TASKS}] (the timeline's events per block), "
            f"got {args.tasks}"
        )
    if not harness.available():
        print("no GPU build or no GPU: nothing to trace")
        return 0
    fl = harness.floors(copy_bytes=1 << 26, iters=5)
    n = args.ranks
    ll128 = "LL128" in args.protocol.upper()  # a protocol setting naming LL128 allows it
    h = harness.Harness(n, harness.gpu_topology(n, ll128=ll128), timeout=60.0)
    count = max(1, args.bytes // 4)
    task = {"coll": args.coll, "count": count, "dtype": "float32", "op": "sum"}
    summary = h.build([task] * args.tasks, algorithm=args.algorithm, protocol=args.protocol)[0]
    slots = h.buffers()
    h.time_launches(slots, warmup=args.warmup, iters=1)
    timeline = h.trace(slots)
    h.free()
    print(
        f"# {args.coll} of {count} float32 on {n} ranks of one GPU: {summary['algorithm']} / "
        f"{summary['protocol']}, {summary['nchannels']} channel(s); empty launch "
        f"{fl['launch_us']:.2f} us, empty kernel among {fl['graph_reps']} in a graph "
        f"{fl['graph_kernel_us']:.2f} us"
    )
    for r, blocks in enumerate(timeline):
        for b, events in enumerate(blocks):
            if events and events[-1][0] != "end":
                print(
                    f"# rank {r}, block {b}: the timeline is full ({len(events)} events), the "
                    "later ones were dropped: fewer --tasks"
                )
    merged: dict[str, list[float]] = {}
    for r, blocks in enumerate(timeline):
        print(f"\n## rank {r}, block 0 (of {len(blocks)})")
        print(f"{'event':>8} {'t us':>9} {'gap us':>8}")
        prev = None
        for name, t in blocks[0]:
            gap = "" if prev is None else f"{t - prev:8.2f}"
            print(f"{name:>8} {t:9.2f} {gap:>8}")
            prev = t
        for block in blocks:
            for k, v in phases(block).items():
                merged.setdefault(k, []).extend(v)
    print("\n## phases, mean over every rank's blocks (us)")
    for k, v in merged.items():
        if v:
            print(f"{k:>28} {statistics.mean(v):8.2f}  (n = {len(v)}, max {max(v):.2f})")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
