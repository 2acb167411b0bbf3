"""One process of tests/gpu/test_jax_gpu_mp.py's test_processes_with_one_gpu_each: argv process,
nprocs, port; one device per process. Every collective under every algorithm and protocol at 1,
1,000 and 65,536 float32 elements per rank against NumPy: all_reduce (psum) under Ring and Tree x
LL and Simple (and LL128 where the build has it), the rest under Ring x the same protocols
(point-to-point: LL or Simple). Prints one RESULT line: the checks passed, the configurations,
jax_rccl's runtime stats, this process's rank and its connections' counters."""

import os
import sys

import numpy as np

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    world = gpu_world.join(3)
    import jax_rccl
    from jax_rccl import _jax_rccl

    n, process = world.n, world.process
    out = {"process": process, "n": n, "checks": 0}
    configs = [(None, None), ("Ring", "LL"), ("Ring", "Simple"), ("Tree", "LL"), ("Tree", "Simple")]
    if _jax_rccl.gpu.has_ll128():  # taken only when asked for
        configs += [("Ring", "LL128"), ("Tree", "LL128")]
    out["configs"] = configs
    perm = [(k, (k + 1) % n) for k in range(n)]
    for count in (1, 1000, 65536):
        x = world.global_array(count, lambda i: (i % 7) - 3)
        full = (np.arange(n * count) % 7 - 3).astype(np.float32).reshape(n, count)
        mine = process  # one device per process: its block is the process's index
        for algo, proto in configs:
            where = f"count {count}, {algo or 'auto'}/{proto or 'auto'}"
            with jax_rccl.config(algorithm=algo, protocol=proto):
                print(f"{where}: psum", flush=True)  # where a crash happened, in the output
                got = world.run(lambda v: jax_rccl.psum(v, "i"), x)
                np.testing.assert_array_equal(got, full.sum(0), err_msg=where)
                out["checks"] += 1
            if algo == "Tree":
                continue
            with jax_rccl.config(algorithm=algo, protocol=proto):
                print(f"{where}: pmax", flush=True)
                got = world.run(lambda v: jax_rccl.pmax(v, "i"), x)
                np.testing.assert_array_equal(got, full.max(0), err_msg=where)
                print(f"{where}: all_gather", flush=True)
                got = world.run(lambda v: jax_rccl.all_gather(v, "i", tiled=True), x)
                np.testing.assert_array_equal(got, full.reshape(-1), err_msg=where)
                print(f"{where}: psum_scatter", flush=True)
                got = world.run(
                    lambda v: jax_rccl.psum_scatter(v, "i", tiled=True),
                    world.global_array(count * n, lambda i: (i % 5) - 2),
                )
                rs = (np.arange(n * n * count) % 5 - 2).astype(np.float32)
                rs = rs.reshape(n, n * count).sum(0)
                mine_rs = rs[mine * count : (mine + 1) * count]
                np.testing.assert_array_equal(got, mine_rs, err_msg=where)
                print(f"{where}: pbroadcast", flush=True)
                got = world.run(lambda v: jax_rccl.pbroadcast(v, "i", n - 1), x)
                np.testing.assert_array_equal(got, full[n - 1], err_msg=where)
                out["checks"] += 4
            print(f"{where}: ppermute", flush=True)
            got = world.run(lambda v: jax_rccl.ppermute(v, "i", perm), x)
            np.testing.assert_array_equal(got, full[(mine - 1) % n], err_msg=where)
            print(f"{where}: all_to_all", flush=True)
            y = world.global_array(count * n, lambda i: i % 11)
            got = world.run(lambda v: jax_rccl.all_to_all(v, "i", 0, 0, tiled=True), y)
            blocks = (np.arange(n * n * count) % 11).astype(np.float32).reshape(n, n, count)
            np.testing.assert_array_equal(got, blocks[:, mine].reshape(-1), err_msg=where)
            out["checks"] += 2
    out["stats"] = {k: int(v) for k, v in jax_rccl.runtime_stats().items()}
    out["rank"] = world.rank
    out["counters"] = world.connection_counters()
    gpu_world.result(out)


if __name__ == "__main__":
    main()
