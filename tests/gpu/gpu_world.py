"""What the multi-process GPU workers of tests/gpu share (imported by the worker_*_gpu.py programs,
not by the tests): joining the group, the one-axis mesh over every process's device, the RESULT
line, what the world table says about hosts, and leaving without JAX's shutdown.

A worker's argv starts with process, nprocs, port (JAX's coordinator on 127.0.0.1:port), and
for the programs of gpu_launch.run_step_processes count, steps. jax_rccl is imported only after
join(): a worker imports it once jax.distributed is up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass
class World:
    """This process's place in the group: argv's numbers and the mesh "i" over jax.devices()."""

    process: int
    nprocs: int
    port: int
    count: int | None
    steps: int | None
    devs: list
    mesh: Mesh
    spec: NamedSharding

    @property
    def n(self) -> int:
        return len(self.devs)

    @property
    def ids(self) -> list[int]:
        return [d.id for d in self.devs]

    @property
    def rank(self) -> int:
        """This process's rank: the place of its (one) device in the mesh."""
        return self.ids.index(jax.local_devices()[0].id)

    def global_array(self, count: int, fn: Callable) -> jax.Array:
        """float32 fn(i) over i < n * count, each process making its own block."""
        n = self.n
        return jax.make_array_from_callback(
            (n * count,),
            self.spec,
            lambda idx: np.asarray(fn(np.arange(n * count)[idx]), np.float32),
        )

    def run(self, f: Callable, x: jax.Array) -> np.ndarray:
        """jit(shard_map(f)) over the mesh, on x; this process's blocks of the result."""
        g = jax.jit(jax.shard_map(f, mesh=self.mesh, in_specs=P("i"), out_specs=P("i")))
        y = g(x)
        return np.concatenate([np.asarray(s.data) for s in y.addressable_shards])

    def connection_counters(self) -> list[list]:
        """Every connection of this rank: (channel, peer, tail, head, steps sent, ...) each."""
        from jax_rccl import _jax_rccl

        rank = self.rank
        return [list(r) for r in _jax_rccl.gpu.connection_counters(self.ids, rank)]


def join(nargs: int = 5) -> World:
    """Reads argv[1 : 1 + nargs] as integers (process, nprocs, port, then count and steps where
    nargs is 5), joins JAX's distributed client and returns the World."""
    process, nprocs, port, *rest = (int(a) for a in sys.argv[1 : 1 + nargs])
    count, steps = rest if rest else (None, None)
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    devs = jax.devices()
    mesh = Mesh(np.array(devs), ("i",))
    return World(process, nprocs, port, count, steps, devs, mesh, NamedSharding(mesh, P("i")))


def result(out: dict) -> None:
    """Prints the RESULT line the test reads (a process's RESULT lines are merged, later keys
    winning)."""
    print("RESULT " + json.dumps(out), flush=True)


def hosts() -> dict:
    """What the world table says about hosts: this process's host name, the session, and the host
    of every rank."""
    from jax_rccl import _bootstrap

    w = _bootstrap.world()
    host_of_id = {d["id"]: d["host"] for d in w["devices"]}
    return {
        "host": _bootstrap.hostname(),
        "session": w["session"],
        "host_of_rank": [host_of_id[d.id] for d in jax.devices()],
    }


def result_of_hosts_if_asked() -> None:
    """With --world after the five numbers of argv: a RESULT line of the process index and
    hosts()."""
    if "--world" in sys.argv[6:]:
        result({"process": jax.process_index(), **hosts()})


def leave(out: dict, meeting: tuple[str, int, list[int], str] | None) -> NoReturn:
    """Prints out's RESULT line and leaves by os._exit(0): JAX's shutdown would wait on a failed
    communicator, or for a process that left. `meeting` (key, process, others, whom): first the
    process posts key/done/process, and process 0, which serves JAX's coordination service (whose
    end aborts the others), waits (30 s at the most each) for key/done/q of every q in `others`;
    a failure to meet is printed (naming `whom`), not raised."""
    result(out)
    if meeting is not None:
        from jax_rccl import _compat

        key, process, others, whom = meeting
        client = _compat.distributed_client()
        try:
            _compat.kv_set(client, f"{key}/done/{process}", "1")
            if process == 0:
                for q in others:
                    _compat.kv_get(client, f"{key}/done/{q}", 30.0)
        except Exception as e:  # noqa: BLE001 - printed for the test's output
            print(f"meeting {whom}: {type(e).__name__}: {e}", flush=True)
    sys.stdout.flush()
    os._exit(0)
