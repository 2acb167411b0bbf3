"""One process of tests/gpu/test_export_gpu.py: argv process, nprocs, port (nprocs 1: no
jax.distributed). Exports a jit(shard_map) program of jax_rccl calls over the mesh of every device
(process order), serializes and deserializes it, and calls it on the mesh in that order (RESULT
"same_ok": its results against the program lowered here, for several steps) and, with several
devices, in the reverse order ("reversed_error": the error raised, or None; "reversed_where": at
the reversed program's first call, or at the next program's when that first call was recorded
into a command buffer)."""

import json
import sys
import time

import jax
import numpy as np

process, nprocs, port = (int(a) for a in sys.argv[1:4])
if nprocs > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)

from jax import export  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402

devs = jax.devices()
n = len(devs)
count = 4096


def body(x):
    perm = [(k, (k + 1) % n) for k in range(n)]
    return (
        jax_rccl.psum(x, "i"),
        jax_rccl.ppermute(x, "i", perm),
        jax_rccl.all_gather(x, "i", tiled=True)[:count],
    )


def program(mesh):
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=(P("i"),) * 3))


def inputs(mesh, step):
    full = ((np.arange(n * count) * 3 + step) % 11 - 5).astype(np.float32)
    return jax.make_array_from_callback(
        full.shape, NamedSharding(mesh, P("i")), lambda idx: full[idx]
    )


def local(arrays):
    return [np.concatenate([np.asarray(s.data) for s in a.addressable_shards]) for a in arrays]


out = {"process": process, "n": n}
mesh = Mesh(np.array(devs), ("i",))
f = program(mesh)
exp = export.deserialize(export.export(f)(inputs(mesh, 0)).serialize())
same_ok = True
for step in range(5):
    x = inputs(mesh, step)
    want, got = local(f(x)), local(exp.call(x))
    same_ok = same_ok and all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
out["same_ok"] = bool(same_ok)
out["reversed_error"] = None
if n > 1:
    rmesh = Mesh(np.array(devs[::-1]), ("i",))
    t0 = time.monotonic()
    try:
        jax.block_until_ready(jax.jit(exp.call)(inputs(rmesh, 0)))
        out["reversed_where"] = "next program"
        # Recorded into a command buffer at its first call, the program's kernels found it and
        # moved nothing; the next call that runs jax_rccl's handler (a new program) says so.
        fresh = jax.jit(
            jax.shard_map(
                lambda v: jax_rccl.psum(v * 2, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")
            )
        )
        jax.block_until_ready(fresh(inputs(mesh, 1)))
        out["reversed_where"] = None
    except Exception as e:  # noqa: BLE001 - the error under test
        out.setdefault("reversed_where", "first call")
        out["reversed_error"] = f"{type(e).__name__}: {e}"[:2000]
    out["reversed_seconds"] = time.monotonic() - t0
print("RESULT " + json.dumps(out), flush=True)
