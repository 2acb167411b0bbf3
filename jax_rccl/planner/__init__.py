"""Python view of the C++ planner (a port of RCCL's enqueue planning).

>>> from jax_rccl import planner
>>> topo = planner.Topology.preset("mi300x-8")
>>> p = planner.plan([planner.Task("all_reduce", 1 << 20, "float32")], topo)
>>> p.to_dict()["tasks"][0]["algorithm"]
'ring'
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from jax_rccl import _jax_rccl
from jax_rccl.planner._explain import explain_plan
from jax_rccl.planner._topology import DEFAULT_BUFF_SIZES, Topology

RedOpTable = _jax_rccl.RedOpTable

__all__ = [
    "DEFAULT_BUFF_SIZES",
    "Plan",
    "RedOpTable",
    "Task",
    "Topology",
    "explain",
    "plan",
]

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send", "recv")
#: Reduction op names, as the native planner knows them (in the order of their codes).
OPS = tuple(_jax_rccl.reduction_ops())

# A tuner: fn(coll, nbytes, num_pipe_ops) -> None or (algorithm|None, protocol|None, nchannels).
Tuner = Callable[[str, int, int], "tuple[str | None, str | None, int] | None"]


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise ValueError(f"dtype: cannot interpret {dtype!r} as a dtype") from None


@dataclasses.dataclass(frozen=True)
class Task:
    """One operation of a group: a collective, or one side of a point-to-point transfer.

    ``coll`` is one of all_reduce, all_gather, reduce_scatter, broadcast, reduce, send, recv.
    ``count`` is in elements per rank (for all_gather, each rank's part; for reduce_scatter, each
    rank's result). ``dtype`` is a NumPy dtype or its name. ``op`` is a name (sum, prod, max,
    min, avg) or a handle from a RedOpTable. ``root`` is the broadcast/reduce root; ``peer`` the
    other rank of a send/recv.

    Example:
        >>> from jax_rccl import planner
        >>> planner.Task("all_gather", 1024, "bfloat16").to_native()["dtype"]
        'bfloat16'
    """

    coll: str
    count: int
    dtype: Any = "float32"
    op: str | int = "sum"
    root: int = 0
    peer: int | None = None

    def __post_init__(self) -> None:
        if self.coll not in COLLS:
            raise ValueError(f"coll must be one of {', '.join(COLLS)}; got {self.coll!r}")
        if not isinstance(self.count, (int, np.integer)) or self.count < 0:
            raise ValueError(f"count must be a non-negative integer, got {self.count!r}")
        if isinstance(self.op, str) and self.op not in OPS:
            raise ValueError(
                f"op must be one of {', '.join(OPS)} or a user op handle; got {self.op!r}"
            )
        if self.coll in ("send", "recv") and self.peer is None:
            raise ValueError(f"peer is required for {self.coll}")
        object.__setattr__(self, "dtype", _dtype_name(self.dtype))

    def to_native(self) -> dict[str, Any]:
        """The dict the native planner takes."""
        return {
            "coll": self.coll,
            "count": int(self.count),
            "dtype": self.dtype,
            "op": self.op,
            "root": self.root,
            "peer": self.peer,
        }


class Plan:
    """A plan: per task the choice made, per channel the work elements, per kernel its shape,
    and the proxy ops of connections that cross nodes. ``plan()`` makes one.

    Example:
        >>> from jax_rccl import planner
        >>> p = planner.plan(planner.Task("all_reduce", 1 << 20), "mi300x-8")
        >>> p
        Plan(rank=0, nranks=8, tasks=1, kernels=1)
        >>> t = p.tasks[0]
        >>> t["algorithm"], t["protocol"], t["nbytes"]
        ('ring', 'll', 4194304)
    """

    def __init__(self, native: Any, tasks: Sequence[Task], topology: Topology) -> None:
        self._native = native
        self._dict: dict[str, Any] | None = None
        self.tasks_in = tuple(tasks)
        self.topology = topology

    def to_dict(self) -> dict[str, Any]:
        """Everything the plan holds: rank, nranks, tasks (each with its algorithm, protocol,
        channels, threads, chunk sizes and predicted time), channels, kernels and proxy_ops."""
        if self._dict is None:
            self._dict = self._native.to_dict()
        return self._dict

    def to_json(self, indent: int | None = 2) -> str:
        """``to_dict()`` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    @property
    def tasks(self) -> list[dict[str, Any]]:
        """Per task, the choice made (``to_dict()["tasks"]``)."""
        return self.to_dict()["tasks"]

    @property
    def channels(self) -> list[dict[str, Any]]:
        """Per channel, its work elements."""
        return self.to_dict()["channels"]

    @property
    def kernels(self) -> list[dict[str, Any]]:
        """Per kernel launch, its channels, threads per block and work count."""
        return self.to_dict()["kernels"]

    @property
    def proxy_ops(self) -> list[dict[str, Any]]:
        """What a network proxy moves: per kernel (in launch order) its proxy ops in upload
        order, one for each channel part whose ring/tree neighbours or p2p peer are on another
        node. Empty when every peer of this rank is on its node."""
        return self.to_dict()["proxy_ops"]

    def upload_proxy_ops(
        self, kernel: int = 0, coll_op_count: int = 0, p2p_op_counts: Sequence[int] = ()
    ) -> dict[str, Any]:
        """One kernel's proxy ops as RCCL's uploadProxyOps hands them to the proxy thread:
        opCounts moved past the communicator's counters (``coll_op_count``, and
        ``p2p_op_counts`` per channel), with the counters after the upload."""
        return self._native.upload_proxy_ops(kernel, coll_op_count, list(p2p_op_counts))

    def layout(self, kernel: int = 0, *, fifo_depth: int | None = None, fifo_sent: int = 0) -> Any:
        """The work array of one kernel: persistent (default, as the runtimes upload it) or
        placed in a FIFO ring of ``fifo_depth`` slots (planner API only, mirroring RCCL)."""
        if fifo_depth is None:
            return self._native.layout_persistent(kernel)
        return self._native.layout_fifo(kernel, fifo_depth, fifo_sent)

    def explain(self) -> str:
        """The plan as readable text: the machine, each task's choice, where its work landed."""
        return explain_plan(self)

    def __repr__(self) -> str:
        d = self.to_dict()
        return (
            f"Plan(rank={d['rank']}, nranks={d['nranks']}, tasks={len(d['tasks'])}, "
            f"kernels={len(d['kernels'])})"
        )


def _env_param(name: str) -> str:
    table, _ = _jax_rccl.params()
    for p in table:
        if p["name"] == name:
            return str(p["value"])
    return ""


def plan(
    tasks: Sequence[Task] | Task,
    topology: Topology | str,
    rank: int = 0,
    algorithm: str | None = None,
    protocol: str | None = None,
    *,
    tuner: Tuner | None = None,
    user_ops: RedOpTable | None = None,
    persistent: bool = True,
    op_count: int = 0,
    p2p_ll_threshold: int | None = None,
) -> Plan:
    """Plans one group of tasks for ``rank`` of ``topology``, as the runtime plans a call.

    Args:
        tasks: a Task or a sequence of them, planned together (one group).
        topology: a Topology, or a preset's name (``Topology.presets()``).
        rank: the rank whose plan is built (plans differ per rank for rooted and p2p tasks).
        algorithm: restricts the choice, NCCL's syntax (``"Ring"``, ``"Tree,Ring"``,
            ``"^Tree"``); None: ``JAX_RCCL_ALGO`` applies.
        protocol: the same for protocols (``"Simple"``, ``"^LL128"``); None:
            ``JAX_RCCL_PROTO``.
        tuner: ``fn(coll, nbytes, num_pipe_ops)`` returning None or (algorithm or None,
            protocol or None, nchannels): may fix the choice per collective.
        user_ops: a RedOpTable whose handles tasks' ``op`` may name.
        persistent: False plans for a FIFO launch whose work budget is half of
            ``topology.work_fifo_depth``, as RCCL plans a non-persistent launch (planner API
            only: the runtimes' plans are persistent).
        op_count: the communicator's operation counter the plan starts from.
        p2p_ll_threshold: point-to-point chunks up to this many bytes use LL; None:
            ``JAX_RCCL_P2P_LL_THRESHOLD``.

    Returns:
        A Plan: ``.tasks`` (per task the algorithm, protocol, channels, threads, chunking and
        predicted time), ``.kernels``, ``.channels``, ``.proxy_ops``, ``.explain()``.

    Example:
        >>> import jax_rccl
        >>> from jax_rccl import planner
        >>> cpu8 = planner.Topology.from_native(jax_rccl.runtime_topology(8))
        >>> p = planner.plan(planner.Task("all_reduce", 1 << 20, "float32"), cpu8)
        >>> p.tasks[0]["algorithm"], p.tasks[0]["protocol"], p.tasks[0]["nchannels"]
        ('direct', 'simple', 2)
        >>> planner.plan(planner.Task("all_reduce", 1 << 20), cpu8, algorithm="Ring").tasks[0][
        ...     "algorithm"]
        'ring'
    """
    if isinstance(tasks, Task):
        tasks = [tasks]
    if isinstance(topology, str):
        topology = Topology.preset(topology)
    if not isinstance(topology, Topology):
        raise ValueError(f"topology must be a Topology or a preset name, got {topology!r}")
    for i, t in enumerate(tasks):
        if not isinstance(t, Task):
            raise ValueError(f"tasks[{i}] must be a planner.Task, got {t!r}")
    algo = _env_param("algo") if algorithm is None else algorithm
    proto = _env_param("proto") if protocol is None else protocol
    if p2p_ll_threshold is None:
        p2p_ll_threshold = int(_env_param("p2p_ll_threshold") or 16384)
    native = _jax_rccl.make_plan(
        topology.to_native(),
        [t.to_native() for t in tasks],
        rank,
        algo,
        proto,
        tuner,
        user_ops,
        persistent,
        op_count,
        p2p_ll_threshold,
    )
    return Plan(native, tasks, topology)


def explain(
    tasks: Sequence[Task] | Task,
    topology: Topology | str,
    rank: int = 0,
    algorithm: str | None = None,
    protocol: str | None = None,
    **kwargs: Any,
) -> str:
    """The plan() of the same arguments, as readable text.

    Args:
        tasks: a Task or a sequence of them.
        topology: a Topology or a preset's name.
        rank: the rank whose plan is shown.
        algorithm: restricts the choice (NCCL's syntax); None: ``JAX_RCCL_ALGO``.
        protocol: restricts the choice; None: ``JAX_RCCL_PROTO``.
        kwargs: the other arguments of plan().

    Returns:
        The text of ``plan(...).explain()``: the machine, each task's algorithm, protocol,
        channels and predicted time, its chunking and where its elements went. For the plans
        of a jitted function's collectives on the runtime it runs on, see
        :func:`jax_rccl.explain`.

    Example:
        >>> from jax_rccl import planner
        >>> text = planner.explain(planner.Task("all_reduce", 1024), "mi300x-8")
        >>> print(text.splitlines()[0])
        jax_rccl plan for rank 0 of 8: arch gfx942, 1 node(s) x 8 ranks, xgmi inside a node; ...
    """
    return plan(tasks, topology, rank, algorithm, protocol, **kwargs).explain()
