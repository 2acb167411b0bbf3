"""One process of tests/gpu/test_harness.py's test_first_launch_of_a_process_loads_every_kernel
(no argv): the process's first harness launch (2 ranks on one GPU) uses kernels of four
reduction classes (where the build has them; a development build: three) and all_gather's;
every result is checked. Prints OK."""

import numpy as np

from jax_rccl import _jax_rccl, harness


def main() -> None:
    h = harness.Harness(2, timeout=10.0)
    # Four reduction classes where the build has them (a development build: three).
    types = [d for d in ("float32", "int32", "float16", "bfloat16") if _jax_rccl.gpu.has_dtype(d)]
    types = (types + ["float32"] * 4)[:4]
    tasks = [{"coll": "all_reduce", "count": 100, "dtype": d, "op": "sum"} for d in types]
    tasks.append({"coll": "all_gather", "count": 33, "dtype": "bfloat16"})
    ins = [
        [
            np.ones(100, harness._np_dtype(t["dtype"]))
            if t["coll"] == "all_reduce"
            else np.ones(33, harness._np_dtype("bfloat16"))
            for t in tasks
        ]
        for _ in range(2)
    ]
    outs = h.run(tasks, ins)
    for row in outs:
        assert all(np.all(o.astype(np.float32) == 2.0) for o in row[:4]), row
        assert np.all(row[4].astype(np.float32) == 1.0) and row[4].size == 66, row[4]
    print("OK")


if __name__ == "__main__":
    main()
