"""One process of tests/gpu/test_gpu_calls.py: JAX processes sharing one GPU whose programs
disagree, which must fail with an error naming both calls, never return a wrong result quietly.

argv: process, nprocs, port, case. Every process's device holds `process + 1` (4,096 elements per
device). Cases:
  op, kind, dtype, root, perm   two jitted shard_map programs f and g that differ in that respect;
                                every process runs f then g once (checked against NumPy), then the
                                last process runs g before f while the others run f then g;
  count                         the first call: psum over 4,096 elements per device on every
                                process but the last, which sums 8,192;
  same                          f then g, 1,000 times on every process (all must pass).
After the calls a program compiled beforehand runs once (its handler reads the communicator's
state: with command buffers the calls above are replays). Prints one RESULT line (JSON): whether
the warm-up was right, whether and where the process raised, the error, and the seconds from the
first disagreeing call to the error.
"""

from __future__ import annotations

import json
import sys
import time

import jax
import numpy as np

COUNT = 4096


def main() -> None:
    process, nprocs, port = (int(a) for a in sys.argv[1:4])
    case = sys.argv[4]
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_rccl
    from jax_rccl import _bootstrap

    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))
    last = process == nprocs - 1
    out: dict = {"process": process, "case": case, "warm_ok": True, "raised": False}

    def array(count: int, dtype=np.float32):
        # Only this process's shard is made: every element is process + 1.
        return jax.make_array_from_callback(
            (n * count,), spec, lambda idx: np.full(n * count, process + 1, dtype)[idx]
        )

    def program(fn):
        return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    def local(y) -> np.ndarray:
        return np.concatenate([np.asarray(s.data) for s in y.addressable_shards])

    ranks = np.arange(1, n + 1, dtype=np.float64)
    shift = [(k, (k + 1) % n) for k in range(n)]
    one_pair = [(0, 1)]
    # (f, g, f's input, g's input, f's expected value, g's expected value) per case.
    x = array(COUNT)
    psum = program(lambda v: jax_rccl.psum(v, "i"))
    cases = {
        "op": (psum, program(lambda v: jax_rccl.pmax(v, "i")), x, x, ranks.sum(), ranks.max()),
        "kind": (
            psum,
            program(lambda v: jax_rccl.all_gather(v, "i", tiled=True)),
            x,
            x,
            ranks.sum(),
            None,
        ),
        "dtype": (psum, psum, x, array(COUNT, np.int32), ranks.sum(), ranks.sum()),
        "root": (
            program(lambda v: jax_rccl.pbroadcast(v, "i", 0)),
            program(lambda v: jax_rccl.pbroadcast(v, "i", 1)),
            x,
            x,
            1.0,
            2.0,
        ),
        "perm": (
            program(lambda v: jax_rccl.ppermute(v, "i", shift)),
            program(lambda v: jax_rccl.ppermute(v, "i", one_pair)),
            x,
            x,
            float((process - 1) % n + 1),
            None,
        ),
    }
    probe_x = array(8)
    probe = program(lambda v: jax_rccl.psum(v, "i") * 2).lower(probe_x).compile()
    # The processes meet (what the first collective to run would do) before any time is taken.
    _bootstrap.ensure_world()

    def fail(where: str, e: Exception, t0: float) -> None:
        out.update(raised=True, where=where, error=f"{type(e).__name__}: {e}")
        out["seconds"] = time.monotonic() - t0

    t0 = time.monotonic()
    if case == "count":
        xc = array(2 * COUNT if last else COUNT)
        try:
            y = psum(xc)
            jax.block_until_ready(y)
            out["first_value"] = float(local(y)[0])
        except Exception as e:  # noqa: BLE001 - reported to the test
            fail("calls", e, t0)
    else:
        f, g, xf, xg, wf, wg = cases["op" if case == "same" else case]
        yf, yg = f(xf), g(xg)
        if float(local(yf)[0]) != wf or (wg is not None and float(local(yg)[0]) != wg):
            out["warm_ok"] = False
        reps = 1000 if case == "same" else 1
        t0 = time.monotonic()
        try:
            for _ in range(reps):
                order = [(g, xg), (f, xf)] if last and case != "same" else [(f, xf), (g, xg)]
                ys = [h(v) for h, v in order]
                jax.block_until_ready(ys)
            if case == "same":
                got = [float(local(y)[0]) for y in ys]
                out["same_ok"] = got == [wf, wg]
        except Exception as e:  # noqa: BLE001 - reported to the test
            fail("calls", e, t0)
    if not out["raised"]:
        try:
            jax.block_until_ready(probe(probe_x))
        except Exception as e:  # noqa: BLE001 - reported to the test
            fail("probe", e, t0)
    out["errors"] = int(jax_rccl.runtime_stats()["errors"])
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
