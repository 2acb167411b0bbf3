"""The main job of ``make demo``: plans for realistic machines, explained.

The JAX training demo replaces this once collectives run inside jit (see README).
"""

from __future__ import annotations

from jax_rccl import planner


def main() -> None:
    topo = planner.Topology.preset("mi300x-8")
    f32 = "float32"
    cases = [
        ("8 x MI300X all-reduce, 4 KB", [planner.Task("all_reduce", 1024, f32)]),
        ("8 x MI300X all-reduce, 1 MB", [planner.Task("all_reduce", 1 << 18, f32)]),
        ("8 x MI300X all-reduce, 256 MB", [planner.Task("all_reduce", 1 << 26, f32)]),
        (
            "8 x MI300X all-gather, 16 MB per rank (bfloat16)",
            [planner.Task("all_gather", 1 << 23, "bfloat16")],
        ),
        (
            "8 x MI300X grouped call: 50 small all-reduces (4 KB .. 200 KB)",
            [planner.Task("all_reduce", 1024 * (i + 1), f32) for i in range(50)],
        ),
    ]
    for title, tasks in cases:
        print("=" * 100)
        print(title)
        print("-" * 100)
        print(planner.explain(tasks, topo))
    print("=" * 100)
    print("Same 1 MB all-reduce with JAX_RCCL_ALGO-style override 'Tree':")
    print(planner.explain([planner.Task("all_reduce", 1 << 18, f32)], topo, algorithm="Tree"))


if __name__ == "__main__":
    main()
