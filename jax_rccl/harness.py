"""Several ranks of one communicator on one GPU, in this process, without JAX.

Each rank has its own stream and its own connection region; the ranks' kernels run side by side on
the one device and talk through the same FIFOs they use across GPUs. XLA/NCCL refuse several
ranks on one GPU, so this is how the kernels are tested and measured on a single GPU::

    from jax_rccl import harness
    h = harness.Harness(4)                         # 4 ranks on the current GPU
    outs = h.run([{"coll": "all_reduce", "count": 1024, "dtype": "float32"}],
                 [[np.ones(1024, np.float32)] for _ in range(4)])
    outs[rank][task]                               # numpy arrays

Needs a GPU build (``JAX_RCCL_GPU=cuda`` or ``rocm`` at install) and a visible GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from jax_rccl import _jax_rccl
from jax_rccl.planner import Topology

__all__ = ["available", "gpu_topology", "Harness", "floors", "output_count", "input_count"]


# hip/device_conn.h's TraceEvent values.
TRACE_EVENT_NAMES = {
    1: "start",
    2: "work",
    3: "piece",
    4: "ready",
    5: "moved",
    6: "posted",
    7: "end",
    8: "elem",
}


def available() -> bool:
    """Whether this build has the GPU runtime and a GPU answers."""
    gpu = getattr(_jax_rccl, "gpu", None)
    if gpu is None:
        return False
    try:
        p = gpu.alloc(16)
    except Exception:
        return False
    gpu.free(p)
    return True


def gpu_topology(
    nranks: int,
    *,
    nchannels: int | None = None,
    arch: str = "sm90",
    direct: bool = True,
    ll128: bool = False,
    buff_sizes: tuple[int, int, int] | None = None,
) -> Topology:
    """The topology of `nranks` ranks on one GPU: NVLink-class links (the ranks share one
    device's memory), LL and Simple, RCCL's 4 MiB Simple buffers, and `nchannels` channels
    (default: 128 blocks in all, about one per SM of an H200, at least 16 per rank).
    `direct`: the ranks read each other's buffers (the Direct algorithm is available).
    `ll128`: the planner may choose LL128 too (the device code has it where
    ``has_ll128()`` says so; off by default, as in the JAX handlers).
    `buff_sizes`: connection buffer bytes per protocol (LL, LL128, Simple), each a multiple of
    8 (the FIFO's steps); default: those of the JAX handlers."""
    if nchannels is None:
        nchannels = max(16, 128 // max(1, nranks))
    return Topology(
        nranks=nranks,
        arch=arch,
        link="nvlink",
        bw_intra=30.0,
        nchannels=nchannels,
        p2p_nchannels=nchannels,
        p2p_nchannels_per_peer=2,
        buff_sizes=tuple(buff_sizes) if buff_sizes is not None else tuple(_jax_rccl.gpu_buff_sizes),
        p2p_chunk_size=131072,
        ll128=ll128,
        direct_peers=direct,
    )


def has_ll128() -> bool:
    """Whether this build's device code runs the LL128 protocol (NVIDIA builds)."""
    gpu = getattr(_jax_rccl, "gpu", None)
    return gpu is not None and bool(gpu.has_ll128())


def floors(copy_bytes: int = 1 << 30, iters: int = 20) -> dict[str, float]:
    """Device-to-device copy bandwidth (``copy_gbs``, GB/s, read + write), an empty kernel launch
    (``launch_us``), one empty kernel replayed from a captured graph (``graph_us``), and one empty
    kernel among ``graph_reps`` in one graph (``graph_kernel_us``), in microseconds."""
    return dict(_jax_rccl.gpu.floors(copy_bytes, iters))


def _nranks_factor(coll: str, nranks: int) -> tuple[int, int]:
    """(input multiplier, output multiplier) of a task's count."""
    if coll == "all_gather":
        return 1, nranks
    if coll == "reduce_scatter":
        return nranks, 1
    return 1, 1


def input_count(task: dict[str, Any], nranks: int) -> int:
    return int(task["count"]) * _nranks_factor(task["coll"], nranks)[0]


def output_count(task: dict[str, Any], nranks: int) -> int:
    return int(task["count"]) * _nranks_factor(task["coll"], nranks)[1]


class Harness:
    """`nranks` ranks on the current GPU (see the module doc)."""

    def __init__(
        self, nranks: int, topology: Topology | None = None, *, timeout: float = 30.0
    ) -> None:
        if not isinstance(nranks, int) or nranks < 1:
            raise ValueError(f"nranks must be an integer >= 1, got {nranks!r}")
        topo = topology if topology is not None else gpu_topology(nranks)
        if topo.nranks != nranks:
            raise ValueError(f"topology has {topo.nranks} ranks, nranks is {nranks}")
        self.nranks = nranks
        self.topology = topo
        self._h = _jax_rccl.gpu.Harness.create(topo.to_native(), float(timeout))
        self._bufs: list[int] = []
        self.failed = False
        self.tasks: list[dict[str, Any]] = []
        self.rank_tasks: list[list[dict[str, Any]]] = [[] for _ in range(nranks)]

    def build(
        self,
        tasks: Sequence[Any],
        *,
        algorithm: str = "",
        protocol: str = "",
        p2p_ll_threshold: int = 16384,
    ) -> list[dict[str, Any]]:
        """Plans `tasks` on every rank and uploads the plans; returns rank 0's choices.

        `tasks` is one list of task dicts for every rank, or (point-to-point) a list per rank."""
        per_rank = _per_rank(tasks, self.nranks)
        self.rank_tasks = per_rank
        self.tasks = per_rank[0]
        self._h.build(per_rank, algorithm, protocol, p2p_ll_threshold)
        return list(self._h.plan_summary(0))

    def alloc(self, nbytes: int) -> int:
        p = _jax_rccl.gpu.alloc(int(nbytes))
        self._bufs.append(p)
        return p

    def buffers(self) -> list[list[tuple[int, int]]]:
        """Fresh (send, recv) device buffers for every rank and task of the last build."""
        slots = []
        for r in range(self.nranks):
            row = []
            for t in self.rank_tasks[r]:
                size = np.dtype(_np_dtype(t["dtype"])).itemsize
                send = self.alloc(max(1, input_count(t, self.nranks)) * size)
                recv = self.alloc(max(1, output_count(t, self.nranks)) * size)
                row.append((send, recv))
            slots.append(row)
        return slots

    def launch(self, slots: list[list[tuple[int, int]]]) -> None:
        self._h.launch(slots)

    def sync(self) -> None:
        """Waits for every rank; a failure (a timeout) leaves the harness failed for good."""
        try:
            self._h.sync()
        except Exception:
            self.failed = True
            raise

    def time_launches(self, slots, warmup: int = 5, iters: int = 20) -> float:
        """Microseconds per launch of every rank (host loop, synchronized at the end)."""
        return float(self._h.time_launches(slots, warmup, iters))

    def trace(self, slots) -> list[list[list[tuple[str, float]]]]:
        """One launch of every rank with a timeline recorded on the device: per rank, per block
        (channel), the events in order as (name, microseconds since the earliest block start of
        any rank). Events: start, work (a work loaded), elem (its element began), piece (a FIFO
        step begins; Direct: its first barrier), ready (its waits satisfied), moved (its data
        moved), posted (its counters posted), end. The plan must be one launch (one element
        type); at most TRACE_EVENTS events per block."""
        try:
            raw = self._h.trace(slots)
        except Exception:
            self.failed = True
            raise
        per = int(_jax_rccl.gpu.TRACE_EVENTS)
        words = []
        for r, rank_words in enumerate(raw):
            for b in range(len(rank_words) // per):
                for w in rank_words[b * per : (b + 1) * per]:
                    if w:
                        words.append((r, b, w >> 56, w & ((1 << 56) - 1)))
        t0 = min((t for *_, t in words), default=0)
        out: list[list[list[tuple[str, float]]]] = [
            [[] for _ in range(len(rw) // per)] for rw in raw
        ]
        for r, b, e, t in words:
            out[r][b].append((TRACE_EVENT_NAMES.get(e, str(e)), (t - t0) / 1e3))
        return out

    def time_graph(self, slots, iters: int = 20, reps: int = 1) -> float:
        """Microseconds per collective: a graph holding `reps` launches of every rank, replayed
        `iters` times (reps = 1: the replay of one collective)."""
        return float(self._h.time_graph(slots, iters, reps))

    def run(
        self,
        tasks: Sequence[dict[str, Any]],
        inputs: Sequence[Sequence[np.ndarray]],
        *,
        algorithm: str = "",
        protocol: str = "",
        repeat: int = 1,
    ) -> list[list[np.ndarray]]:
        """Runs `tasks` (`repeat` times) with inputs[rank][task]; returns outputs[rank][task].

        A send task's output is unused (empty); a recv task's input is unused."""
        if len(inputs) != self.nranks:
            raise ValueError(f"inputs must hold {self.nranks} ranks, got {len(inputs)}")
        self.build(tasks, algorithm=algorithm, protocol=protocol)
        slots = self.buffers()
        for r in range(self.nranks):
            for i, t in enumerate(self.rank_tasks[r]):
                x = np.ascontiguousarray(inputs[r][i], dtype=_np_dtype(t["dtype"]))
                if x.size != input_count(t, self.nranks) and t["coll"] != "recv":
                    raise ValueError(
                        f"inputs[{r}][{i}] has {x.size} elements, task {t['coll']} needs "
                        f"{input_count(t, self.nranks)}"
                    )
                if t["coll"] != "recv" and x.size:
                    _jax_rccl.gpu.upload(slots[r][i][0], x.tobytes())
        for _ in range(repeat):
            self.launch(slots)
        self.sync()
        outs = []
        for r in range(self.nranks):
            row = []
            for i, t in enumerate(self.rank_tasks[r]):
                dt = np.dtype(_np_dtype(t["dtype"]))
                n = 0 if t["coll"] == "send" else output_count(t, self.nranks)
                data = _jax_rccl.gpu.download(slots[r][i][1], n * dt.itemsize) if n else b""
                row.append(np.frombuffer(data, dtype=dt).copy())
            outs.append(row)
        self.free()
        return outs

    def free(self) -> None:
        for p in self._bufs:
            _jax_rccl.gpu.free(p)
        self._bufs.clear()

    def __del__(self) -> None:
        try:
            self.free()
        except Exception:
            pass


def _per_rank(tasks: Sequence[Any], nranks: int) -> list[list[dict[str, Any]]]:
    if tasks and isinstance(tasks[0], (list, tuple)):
        if len(tasks) != nranks:
            raise ValueError(f"tasks per rank: expected {nranks} lists, got {len(tasks)}")
        return [[_task_dict(t) for t in row] for row in tasks]
    row = [_task_dict(t) for t in tasks]
    return [list(row) for _ in range(nranks)]


def _task_dict(t: Any) -> dict[str, Any]:
    d = t.to_native() if hasattr(t, "to_native") else dict(t)
    if d.get("peer") is None:
        d.pop("peer", None)
    return d


def _np_dtype(name: str) -> Any:
    import ml_dtypes

    special = {
        "bfloat16": ml_dtypes.bfloat16,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
        "float8_e5m2": ml_dtypes.float8_e5m2,
        "bool": np.bool_,
    }
    return special.get(name, name)
