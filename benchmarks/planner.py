"""Planning time per task for groups of 1, 100 and 10,000 tasks (target: under 2 us per task).

Times the C++ planner alone (validation, costing, scheduling, plan finishing), not the Python
conversion, over a mix of collectives and sizes on several presets.
"""

from __future__ import annotations

import argparse
import random

from jax_rccl import _jax_rccl, planner


def tasks_mix(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    colls = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]
    dtypes = ["float32", "bfloat16", "float16", "int32"]
    out = []
    for _ in range(n):
        t = planner.Task(
            rng.choice(colls),
            rng.choice([256, 4096, 65536, 1 << 20]),
            rng.choice(dtypes),
            op=rng.choice(["sum", "max"]),
        )
        out.append(t.to_native())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--presets", default="mi300x-8,h100-8,cpu-8")
    args = ap.parse_args()
    print(f"{'preset':<12} {'tasks':>7} {'plans timed':>11} {'us/plan':>12} {'us/task':>9}")
    for preset in args.presets.split(","):
        topo = planner.Topology.preset(preset).to_native()
        for n in (1, 100, 10_000):
            tasks = tasks_mix(n)
            iters = max(3, min(2000, 200_000 // n))
            sec = _jax_rccl.bench_plan(topo, tasks, iters)
            print(f"{preset:<12} {n:>7} {iters:>11} {sec * 1e6:>12.1f} {sec * 1e6 / n:>9.3f}")


if __name__ == "__main__":
    main()
