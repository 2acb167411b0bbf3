"""jax_rccl.explain(fn, *args): the plans of a jitted function's jax_rccl collectives on the
runtime they will run on.

The function is lowered and compiled for the arguments given; each jax_rccl custom call of the
lowered program (its kind, its operands' types and its attributes: the call's ``name``, its
identity ``call_site``, replica groups, forced algorithm/protocol) becomes the tasks the runtime
plans (ffi/handlers/common.cc: MakeRankTasks), and the planner plans them on the topology the
runtime uses for the call's group (``jax_rccl.runtime_topology``). Per collective task: the
choice, every algorithm/protocol pair with the cost model's time or the reason it cannot run or
is excluded, and why the choice won.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from jax_rccl import _compat, _ffi, _jax_rccl
from jax_rccl import planner as _planner
from jax_rccl._profile import _size

ir = _compat.ir

ALGORITHMS = ("tree", "ring", "direct")
PROTOCOLS = ("ll", "ll128", "simple")
#: The planner's collectives the cost model chooses an algorithm for (the rest are
#: point-to-point sends and receives).
COSTED = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")

_ELEMENT_TYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "ui64": "uint64",
    "ui32": "uint32",
    "ui16": "uint16",
    "ui8": "uint8",
    "i1": "bool",
}


def _attr(a: Any) -> Any:
    """An MLIR attribute of a call's dictionary as a Python value."""
    if isinstance(a, (ir.StringAttr, ir.IntegerAttr, ir.FloatAttr)):
        return a.value
    if isinstance(a, ir.DenseIntElementsAttr):
        return [int(v) for v in a]
    return str(a)


def _walk(op) -> Iterator[Any]:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner
                yield from _walk(inner)


def _tensor(value) -> tuple[str, tuple[int, ...]]:
    t = ir.RankedTensorType(value.type)
    name = str(t.element_type)
    return _ELEMENT_TYPES.get(name, name), tuple(int(d) for d in t.shape)


def lowered_calls(module) -> list[dict[str, Any]]:
    """The jax_rccl custom calls of a lowered (StableHLO) module, in program order: kind,
    attributes, and per leaf its dtype, input and output element counts."""
    calls = []
    with module.context:
        for op in _walk(module.operation):
            if op.name != "stablehlo.custom_call":
                continue
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            if not target.startswith("jax_rccl_"):
                continue
            config = ir.DictAttr(op.attributes["mhlo.backend_config"])
            attrs = {config[i].name: _attr(config[i].attr) for i in range(len(config))}
            leaves = []
            nleaves = len(op.results)
            for i in range(nleaves):
                dtype, in_shape = _tensor(op.operands[i])
                _, out_shape = _tensor(op.results[i])
                leaves.append(
                    {
                        "dtype": dtype,
                        "in_count": int(np.prod(in_shape, dtype=np.int64)),
                        "out_count": int(np.prod(out_shape, dtype=np.int64)),
                        "out_shape": out_shape,
                    }
                )
            calls.append({"kind": target[len("jax_rccl_") :], "attrs": attrs, "leaves": leaves})
    return calls


def _tasks(kind: str, attrs: dict[str, Any], leaves: list[dict], rank: int) -> list:
    """The planner tasks the runtime builds for `rank` of a call (MakeRankTasks)."""
    n = int(attrs["group_size"])
    op = _planner.OPS[int(attrs.get("op", 0))]
    root = int(attrs.get("root", 0))
    perm = attrs.get("perm", [])
    pairs = list(zip(perm[0::2], perm[1::2], strict=True))
    tasks = []
    Task = _planner.Task
    for leaf in leaves:
        dt, cin, cout = leaf["dtype"], leaf["in_count"], leaf["out_count"]
        if kind in ("all_reduce", "broadcast", "reduce") and cin > 0:
            tasks.append(Task(kind, cin, dt, op=op, root=root))
        elif kind == "all_gather" and cin > 0:
            tasks.append(Task("all_gather", cin, dt))
        elif kind == "reduce_scatter" and cout > 0:
            tasks.append(Task("reduce_scatter", cout, dt, op=op))
        elif kind == "all_to_all" and cin // n > 0:
            for j in range(n):
                tasks.append(Task("send", cin // n, dt, peer=j))
                tasks.append(Task("recv", cin // n, dt, peer=j))
        elif kind == "ppermute" and cin > 0:
            for s, d in pairs:
                if s == rank:
                    tasks.append(Task("send", cin, dt, peer=d))
                if d == rank:
                    tasks.append(Task("recv", cin, dt, peer=s))
    return tasks


def _alternatives(
    topo: dict, task: dict, algo_mask: int, proto_mask: int, source: str
) -> list[dict[str, Any]]:
    """Every (algorithm, protocol) pair for a collective task: the cost model's time, or why it
    cannot run or is excluded; sorted fastest first, then the excluded, then the impossible."""
    internal = _jax_rccl.internal
    out = []
    for a, algo in enumerate(ALGORITHMS):
        for p, proto in enumerate(PROTOCOLS):
            alt: dict[str, Any] = {"algorithm": algo, "protocol": proto, "time_us": None}
            reason = internal.unavailable_reason(
                topo, task["coll"], algo, proto, int(task["agg_bytes"])
            )
            if reason:
                alt.update(status="cannot run", note=reason)
            else:
                t, backup = internal.algo_time(
                    topo, task["coll"], algo, proto, int(task["agg_bytes"]), 1
                )
                alt["time_us"] = float(t) if t >= 0 else None
                if not (algo_mask >> a) & 1 or not (proto_mask >> p) & 1:
                    alt.update(status="excluded", note=f"excluded by {source}")
                elif t < 0:
                    alt.update(status="cannot run", note="no time in the cost model")
                elif backup:
                    alt.update(status="fallback", note="a fallback only (the cost model's backup)")
                else:
                    alt.update(status="allowed", note="")
            if algo == task["algorithm"] and proto == task["protocol"]:
                alt["status"] = "chosen"
            out.append(alt)
    order = {"chosen": 0, "allowed": 1, "fallback": 2, "excluded": 3, "cannot run": 4}
    out.sort(
        key=lambda x: (
            order[x["status"]],
            x["time_us"] if x["time_us"] is not None else float("inf"),
        )
    )
    return out


def _why(task: dict, alts: list[dict], source: str | None) -> str:
    if task.get("choice_note"):
        return str(task["choice_note"])
    chosen = next((a for a in alts if a["status"] == "chosen"), None)
    allowed = [a for a in alts if a["status"] == "allowed"]
    if chosen is None:
        return "the plan's choice"
    limit = f" of those {source} allows" if source else ""
    if not allowed:
        return f"the only pair{limit} that can run here"
    nxt = allowed[0]
    gap = ""
    if nxt["time_us"] is not None and chosen["time_us"] is not None:
        gap = f", {nxt['time_us'] - chosen['time_us']:+.1f} us"
    return f"the cost model's fastest{limit} (next: {nxt['algorithm']}/{nxt['protocol']}{gap})"


def _setting(attr_value: str, env: str) -> tuple[str, str | None]:
    """(the spec in force, what set it) for the algorithm or protocol of a call."""
    if attr_value:
        arg = "algorithm" if env == "JAX_RCCL_ALGO" else "protocol"
        return attr_value, f"jax_rccl.config({arg}={attr_value!r})"
    value = {p["env"]: p["value"] for p in _jax_rccl.params()[0]}[env]
    return value, (f"{env}={value!r}" if value else None)


def _topology(platform: str, devices: list, n: int) -> tuple[_planner.Topology, str]:
    """The topology the runtime plans a group of `n` `devices` with, and a note when the figure
    is the single-process one standing in for another."""
    if platform != "cpu":
        gpu = _ffi._native_gpu()
        if gpu is None:
            raise NotImplementedError(
                f"jax_rccl.explain: the program runs on {platform}, and this jax_rccl build has "
                "no GPU runtime (build it with JAX_RCCL_GPU=cuda or rocm)"
            )
        # The topology the GPU runtime starts a group of one host from (ffi/gpu/comm.cc:
        # GpuTopology): its build's architecture, LL128 where its device code has it.
        arch = "gfx942" if gpu.build_info().startswith("HIP") else "sm90"
        native = _jax_rccl.gpu_topology(n, 1, arch, bool(gpu.has_ll128()))
        return (
            _planner.Topology.from_native(native),
            "the GPU runtime's starting topology (a communicator may keep fewer channels)",
        )
    topo = _planner.Topology.from_native(_jax_rccl.cpu_topology(n))
    processes = {getattr(d, "process_index", 0) for d in devices}
    if len(processes) > 1:
        # Groups across processes: shared-memory links, no direct access to peers' buffers
        # (ffi/cpu/comm_world.cc); across hosts also socket links, not modelled here.
        topo = topo.replace(link="shm", direct_peers=False)
        return topo, "across processes (shared memory on one host)"
    return topo, ""


class Explanation:
    """What :func:`jax_rccl.explain` returns: ``str()`` is the table, ``to_dict()`` the data."""

    def __init__(self, function: str, platform: str, calls: list[dict[str, Any]]) -> None:
        self.function = function
        self.platform = platform
        self.calls = calls

    def to_dict(self) -> dict[str, Any]:
        """The function's name, the platform and per call: name, call_site, kind, group,
        topology, the settings in force and per task the choice, its predicted time, why, and
        every alternative with its costed time or the reason it cannot run."""
        return {"function": self.function, "platform": self.platform, "calls": self.calls}

    def __repr__(self) -> str:
        return f"Explanation({self.function!r}, {len(self.calls)} jax_rccl call(s))"

    def __str__(self) -> str:
        cpu = self.platform == "cpu"
        lines = [f"jax_rccl plans of {self.function} on {self.platform}: {len(self.calls)} call(s)"]
        if cpu:
            lines.append(
                "CPU runtime: each device runs its part of a call on its own thread; a plan's "
                "channels are lanes that thread interleaves"
            )
        for i, call in enumerate(self.calls):
            lines.append("")
            group = f"{call['ngroups']} group(s) of {call['group_size']} device(s)"
            where = f", {call['topology_note']}" if call["topology_note"] else ""
            lines.append(f"[{i}] {call['name']}: {call['kind']}, {group}{where}")
            if not call["kept"]:
                lines.append("    removed by XLA's optimizations: it does not run")
            if call["note"]:
                lines.append(f"    {call['note']}")
            p2p: dict[tuple, list[int]] = {}
            for t in call["tasks"]:
                if t["coll"] in ("send", "recv"):
                    key = tuple(t[k] for k in _P2P_KEYS)
                    p2p.setdefault(key, []).append(int(t["peer"]))
                else:
                    lines.extend("    " + s for s in _task_lines(t, cpu))
            for key, peers in p2p.items():
                lines.append("    " + _p2p_line(dict(zip(_P2P_KEYS, key, strict=True)), peers))
        return "\n".join(lines)


_P2P_KEYS = ("coll", "dtype", "count", "nbytes", "protocol", "nchannels", "why")


def _ranks(peers: list[int]) -> str:
    """ "rank 3", or "ranks 0-3" / "ranks 1, 5" for several."""
    if len(peers) == 1:
        return f"rank {peers[0]}"
    if peers == list(range(peers[0], peers[-1] + 1)):
        return f"ranks {peers[0]}-{peers[-1]}"
    return "ranks " + ", ".join(map(str, peers))


def _p2p_line(t: dict[str, Any], peers: list[int]) -> str:
    """The point-to-point tasks of one kind and size, with every peer, on one line."""
    arrow = "->" if t["coll"] == "send" else "<-"
    each = " each" if len(peers) > 1 else ""
    return (
        f"{t['coll']} {t['dtype']} x {t['count']} ({_size(t['nbytes'])}){each} {arrow} "
        f"{_ranks(peers)}: point-to-point, {t['protocol']} on {t['nchannels']} channel(s) "
        f"({t['why']})"
    )


def _task_lines(t: dict[str, Any], cpu: bool) -> list[str]:
    what = f"{t['coll']} {t['dtype']} x {t['count']} ({_size(t['nbytes'])})"
    shape = f"{t['nchannels']} channel(s)"
    if not cpu:
        shape += f" x {t['nthreads']} threads per block"
    head = (
        f"{what}: {t['algorithm']}/{t['protocol']} on {shape}, predicted "
        f"{t['predicted_us']:.1f} us: {t['why']}"
    )
    rows = [head, f"  {'algorithm':<10}{'protocol':<9}{'predicted':>12}"]
    for a in t["alternatives"]:
        time = f"{a['time_us']:.1f} us" if a["time_us"] is not None else "-"
        mark = "chosen" if a["status"] == "chosen" else a["note"]
        rows.append(f"  {a['algorithm']:<10}{a['protocol']:<9}{time:>12}  {mark}".rstrip())
    return rows


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Explanation:
    """The plans of every jax_rccl collective of a jitted function, on the runtime it runs on.

    ``fn`` is lowered and compiled for ``args`` and ``kwargs`` (as ``jax.jit(fn).lower(*args,
    **kwargs).compile()``; nothing runs). For each jax_rccl call of the program, in program
    order, the planner plans the tasks the runtime gives it for the first rank of its first
    group (ppermute: the first source), on the topology the runtime uses for the group
    (:func:`jax_rccl.runtime_topology`), with the algorithm and protocol settings in force
    (:func:`jax_rccl.config`, ``JAX_RCCL_ALGO``, ``JAX_RCCL_PROTO``).

    Args:
        fn: a function using jax_rccl collectives (inside jax.shard_map), jitted or not.
        args: its positional arguments (arrays or jax.ShapeDtypeStruct).
        kwargs: its keyword arguments.

    Returns:
        An Explanation: ``str()`` is a table per call (its name, kind and group; per task the
        choice, its predicted time and why it won, and every algorithm/protocol pair with the
        cost model's time or the reason it cannot run or is excluded); ``to_dict()`` the same
        as data. CPU plans speak of channels (lanes of each device's thread), GPU ones of
        threads per block.

    Example:
        >>> import jax, numpy as np, jax_rccl as jr
        >>> from jax.sharding import Mesh, PartitionSpec as P
        >>> mesh = Mesh(jax.devices(), "i")  # 8 devices
        >>> f = jax.shard_map(lambda x: jr.psum(x, "i"), mesh=mesh, in_specs=P("i"),
        ...                   out_specs=P("i"))
        >>> e = jr.explain(f, np.ones((8, 1024), np.float32))
        >>> task = e.to_dict()["calls"][0]["tasks"][0]
        >>> task["coll"], task["algorithm"], task["protocol"], task["nbytes"]
        ('all_reduce', 'direct', 'simple', 4096)
        >>> print(str(e).splitlines()[3])
        [0] psum over ('i',): all_reduce, 1 group(s) of 8 device(s)
    """
    _ffi.ensure_registered()
    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    lowered = jitted.lower(*args, **kwargs)
    compiled = lowered.compile()
    kept = Counter(re.findall(r'custom_call_target="(jax_rccl_\w+)"', compiled.as_text() or ""))
    by_id = {d.id: d for d in jax.devices()}
    calls_out = []
    platform = "cpu"
    for call in lowered_calls(lowered.compiler_ir("stablehlo")):
        kind, attrs, leaves = call["kind"], call["attrs"], call["leaves"]
        n = int(attrs["group_size"])
        groups = np.asarray(attrs["replica_groups"], np.int64).reshape(-1, n)
        first = [int(d) for d in groups[0] if d >= 0]
        devices = [by_id[d] for d in first if d in by_id]
        platform = devices[0].platform if devices else jax.default_backend()
        platform = "cpu" if platform == "cpu" else platform.lower()
        topo, topo_note = _topology(platform, devices, n)
        perm = attrs.get("perm", [])
        rank = int(perm[0]) if kind == "ppermute" and perm else 0
        algo_spec, algo_src = _setting(str(attrs.get("algorithm", "")), "JAX_RCCL_ALGO")
        proto_spec, proto_src = _setting(str(attrs.get("protocol", "")), "JAX_RCCL_PROTO")
        source = " and ".join(s for s in (algo_src, proto_src) if s) or None
        out: dict[str, Any] = {
            "name": attrs.get("name", ""),
            "call_site": int(attrs.get("call_site", 0)),
            "kind": kind,
            "group_size": n,
            "ngroups": int(groups.shape[0]),
            "platform": platform,
            "rank": rank,
            "topology": topo.to_native(),
            "topology_note": topo_note,
            "algorithm_setting": algo_spec,
            "protocol_setting": proto_spec,
            "kept": kept[f"jax_rccl_{kind}"] > 0,
            "note": "",
            "tasks": [],
        }
        kept[f"jax_rccl_{kind}"] -= 1
        tasks = _tasks(kind, attrs, leaves, rank)
        if kind == "ragged_all_to_all":
            out["note"] = (
                "ragged: point-to-point sends and receives of the largest slice, sized at run "
                "time from the offsets and sizes"
            )
        elif not tasks:
            out["note"] = "nothing to move (empty operands, or no pair involves this rank)"
        if tasks:
            plan = _planner.plan(tasks, topo, rank, algorithm=algo_spec, protocol=proto_spec)
            algo_mask = _jax_rccl.internal.parse_algo_mask(algo_spec)
            proto_mask = _jax_rccl.internal.parse_proto_mask(proto_spec)
            for t in plan.tasks:
                row = {
                    k: t[k]
                    for k in (
                        "coll",
                        "dtype",
                        "count",
                        "nbytes",
                        "peer",
                        "algorithm",
                        "protocol",
                        "nchannels",
                        "nthreads",
                        "predicted_us",
                        "kernel",
                    )
                }
                if t["coll"] in COSTED:
                    alts = _alternatives(out["topology"], t, algo_mask, proto_mask, source or "")
                    row["alternatives"] = alts
                    row["why"] = _why(t, alts, source)
                else:
                    threshold = _planner._env_param("p2p_ll_threshold")
                    row["alternatives"] = []
                    row["why"] = (
                        f"LL for chunks up to JAX_RCCL_P2P_LL_THRESHOLD={threshold} bytes, "
                        "else Simple"
                    )
                out["tasks"].append(row)
        calls_out.append(out)
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return Explanation(name, platform, calls_out)
