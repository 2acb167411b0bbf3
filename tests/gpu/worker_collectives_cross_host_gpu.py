"""One process of tests/gpu/test_gpu_cross_host.py's every-collective tests: argv process, nprocs,
port, count, steps (steps unused).

All-reduce (psum, pmax) under Ring and Tree x LL and Simple (and LL128 where the build has it);
all_gather, psum_scatter, pbroadcast, ppermute and all_to_all under Ring (point-to-point picks LL
or Simple by size: both sizes are here); at 1, 1001, 65537 and `count` float32 elements per rank,
each against NumPy. Prints one RESULT line: the checks passed, the configurations and counts,
jax_rccl's runtime errors, this rank's connections' counters and what the world table says about
hosts (gpu_world.hosts)."""

import os
import sys

import numpy as np

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
import gpu_world  # noqa: E402


def main() -> None:
    world = gpu_world.join()
    import jax_rccl
    from jax_rccl import _jax_rccl

    n = world.n
    mine = world.rank  # this process's rank: its block of the mesh
    out = {"process": world.process, "rank": mine, "n": n, "checks": 0}
    configs = [(None, None), ("Ring", "LL"), ("Ring", "Simple"), ("Tree", "LL"), ("Tree", "Simple")]
    if _jax_rccl.gpu.has_ll128():
        configs += [("Ring", "LL128"), ("Tree", "LL128")]
    out["configs"] = configs
    out["counts"] = counts = [1, 1001, 65537, world.count]
    perm = [(k, (k + 1) % n) for k in range(n)]
    for c in counts:
        x = world.global_array(c, lambda i: (i % 7) - 3)
        full = (np.arange(n * c) % 7 - 3).astype(np.float32).reshape(n, c)
        for algo, proto in configs:
            where = f"count {c}, {algo or 'auto'}/{proto or 'auto'}"
            with jax_rccl.config(algorithm=algo, protocol=proto):
                print(f"{where}: psum", flush=True)  # where a crash happened, in the output
                got = world.run(lambda v: jax_rccl.psum(v, "i"), x)
                np.testing.assert_array_equal(got, full.sum(0), err_msg=where + ": psum")
                print(f"{where}: pmax", flush=True)
                got = world.run(lambda v: jax_rccl.pmax(v, "i"), x)
                np.testing.assert_array_equal(got, full.max(0), err_msg=where + ": pmax")
                out["checks"] += 2
                if algo == "Tree":
                    continue
                print(f"{where}: all_gather", flush=True)
                got = world.run(lambda v: jax_rccl.all_gather(v, "i", tiled=True), x)
                np.testing.assert_array_equal(got, full.reshape(-1), err_msg=where + ": all_gather")
                print(f"{where}: psum_scatter", flush=True)
                got = world.run(
                    lambda v: jax_rccl.psum_scatter(v, "i", tiled=True),
                    world.global_array(c * n, lambda i: (i % 5) - 2),
                )
                rs = (np.arange(n * n * c) % 5 - 2).astype(np.float32).reshape(n, n * c).sum(0)
                np.testing.assert_array_equal(
                    got, rs[mine * c : (mine + 1) * c], err_msg=where + ": psum_scatter"
                )
                print(f"{where}: pbroadcast", flush=True)
                got = world.run(lambda v: jax_rccl.pbroadcast(v, "i", n - 1), x)
                np.testing.assert_array_equal(got, full[n - 1], err_msg=where + ": pbroadcast")
                print(f"{where}: ppermute", flush=True)
                got = world.run(lambda v: jax_rccl.ppermute(v, "i", perm), x)
                np.testing.assert_array_equal(
                    got, full[(mine - 1) % n], err_msg=where + ": ppermute"
                )
                print(f"{where}: all_to_all", flush=True)
                got = world.run(
                    lambda v: jax_rccl.all_to_all(v, "i", 0, 0, tiled=True),
                    world.global_array(c * n, lambda i: i % 11),
                )
                blocks = (np.arange(n * n * c) % 11).astype(np.float32).reshape(n, n, c)
                np.testing.assert_array_equal(
                    got, blocks[:, mine].reshape(-1), err_msg=where + ": all_to_all"
                )
                out["checks"] += 5
    out["errors"] = int(jax_rccl.runtime_stats()["errors"])
    out["counters"] = world.connection_counters()
    out.update(gpu_world.hosts())
    gpu_world.result(out)


if __name__ == "__main__":
    main()
