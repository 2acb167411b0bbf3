"""The program of test_observe_mp.py, run by launcher.py like worker.py's:
``python -P worker_observe.py observe --process=i --nprocs=N --port=P``.

Each process explains a psum over every device of every process, runs it inside
jax_rccl.profile() and reports the explanation's choice, the profile's rows and the runtime's
counters over the block as ``JAX_RCCL_RESULT {json}``.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P: not on the path
from worker import _global, init, report, run_programs  # noqa: E402

CALLS = 5


def prog_observe(args):
    jax = init(args)
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    body = jax.shard_map(lambda v: jr.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    f = jax.jit(body)
    full = np.ones((n, 4096), np.float32)
    x = _global(jax, mesh, P("i"), full)
    explained = jr.explain(body, x).to_dict()["calls"]
    f(x).block_until_ready()
    with jr.profile() as p:
        for _ in range(CALLS):
            f(x).block_until_ready()
    report(
        ok=True,
        local_devices=len(jax.local_devices()),
        explained=[
            {
                "name": c["name"],
                "topology_note": c["topology_note"],
                "choice": [c["tasks"][0]["algorithm"], c["tasks"][0]["protocol"]],
            }
            for c in explained
        ],
        rows=p.rows,
        executions=p.runtime_stats["executions"],
        table=p.table(),
    )


if __name__ == "__main__":
    sys.exit(run_programs({"observe": prog_observe}))
