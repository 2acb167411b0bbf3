"""One process of tests/gpu/test_harness.py's
test_launches_of_several_types_with_one_hardware_queue (no argv; CUDA_DEVICE_MAX_CONNECTIONS=1
in the environment): harness launches of a plan of one kernel per element type at 2, 4 and 8
ranks on one GPU, three times each, every result checked. Prints OK."""

import numpy as np

from jax_rccl import harness


def mixed_tasks() -> list[dict]:
    """Four tasks of three element types (one kernel per type; test_harness.py's
    test_grouped_mixed_dtypes runs them in one process)."""
    return [
        {"coll": "all_reduce", "count": 1000, "dtype": "float32", "op": "sum"},
        {"coll": "all_reduce", "count": 77, "dtype": "int32", "op": "max"},
        {"coll": "all_gather", "count": 33, "dtype": "bfloat16"},
        {"coll": "all_reduce", "count": 5000, "dtype": "bfloat16", "op": "sum"},
    ]


def main() -> None:
    for n in (2, 4, 8):
        h = harness.Harness(n, timeout=10.0)
        tasks = mixed_tasks()
        ins = [
            [np.full(t["count"], r + 1, harness._np_dtype(t["dtype"])) for t in tasks]
            for r in range(n)
        ]
        for _ in range(3):
            outs = h.run(tasks, ins)
            for row in outs:
                assert np.all(row[0] == n * (n + 1) / 2), row[0]
                assert np.all(row[1] == n), row[1]
                want = np.repeat(np.arange(1, n + 1), 33)
                assert np.array_equal(row[2].astype(np.float32), want)
                assert np.all(row[3].astype(np.float32) == n * (n + 1) / 2), row[3]
    print("OK")


if __name__ == "__main__":
    main()
