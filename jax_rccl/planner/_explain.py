"""Readable text for a plan: the machine, each task's choice, where its work landed, and the
proxy ops of connections that cross nodes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jax_rccl.planner import Plan


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{int(nbytes)} B"


def _ranges(elems: list[dict[str, Any]], limit: int = 4) -> str:
    parts = [f"ch{e['channel']}:[{e['offset']},{e['offset'] + e['count']})" for e in elems]
    if len(parts) > limit:
        parts = parts[: limit - 1] + [f"... {len(parts) - limit + 1} more"]
    return " ".join(parts)


def _proxy_op(op: dict[str, Any]) -> str:
    peers = [f"recv<-{r}" for r in op["recv_peers"]] + [f"send->{s}" for s in op["send_peers"]]
    return (
        f"[{op['task']}] {' '.join(peers)}: {op['nsteps']} step(s) ({op['chunk_steps']}/chunk, "
        f"{op['slice_steps']}/slice), {op['protocol']}, opCount {op['op_count']}"
    )


def _channel_ranges(chans: list[int]) -> str:
    runs: list[list[int]] = []
    for c in chans:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _proxy_lines(d: dict[str, Any], group_limit: int = 8, op_limit: int = 3) -> list[str]:
    ops = d["proxy_ops"]
    if not ops:
        return ["no proxy ops: every peer on this node"]
    per_channel: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for op in ops:
        per_channel.setdefault((op["kernel"], op["channel"]), []).append(op)
    # Channels of one kernel whose ops read the same share a line.
    groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
    for (k, c), chan_ops in sorted(per_channel.items()):
        texts = [_proxy_op(op) for op in chan_ops[:op_limit]]
        if len(chan_ops) > op_limit:
            texts.append(f"... {len(chan_ops) - op_limit} more")
        groups.setdefault((k, tuple(texts)), []).append(c)
    lines = [
        f"proxy ops (steps a network proxy moves for this rank): {len(ops)} op(s) on "
        f"{len(per_channel)} channel(s)"
    ]
    items = list(groups.items())
    shown = items if len(items) <= group_limit else items[: group_limit - 1]
    for (k, texts), chans in shown:
        where = f"channel {chans[0]}" if len(chans) == 1 else f"channels {_channel_ranges(chans)}"
        lines.append(f"    kernel {k} {where}: " + "; ".join(texts))
    if len(shown) < len(items):
        rest = sum(len(chans) for _, chans in items[len(shown) :])
        lines.append(f"    ... {rest} more channel(s)")
    return lines


def explain_plan(plan: Plan) -> str:
    d = plan.to_dict()
    t = plan.topology
    lines = [
        f"jax_rccl plan for rank {d['rank']} of {d['nranks']}: arch {t.arch}, {t.nnodes} node(s) "
        f"x {t.local_ranks} ranks, {t.link} inside a node"
        + (f", {t.inter_link} between nodes" if t.nnodes > 1 else "")
        + f"; {t.nchannels} channels x {t.bw_intra:g} GB/s"
        + (f" inside, {t.bw_inter:g} GB/s between nodes" if t.nnodes > 1 and t.bw_inter else ""),
    ]
    ntasks = len(d["tasks"])
    nk = len(d["kernels"])
    lines.append(
        f"{ntasks} task(s) -> {nk} kernel launch(es)"
        + (" (one rank: collectives are plain copies)" if d["one_rank"] else "")
    )

    per_task: dict[int, list[dict[str, Any]]] = {}
    for ch in d["channels"]:
        for e in ch["work"]:
            per_task.setdefault(e["task"], []).append({**e, "channel": ch["id"]})

    for task in d["tasks"]:
        i = task["index"]
        head = f"[{i}] {task['coll']} {task['dtype']} x {task['count']} ({_size(task['nbytes'])})"
        if task["coll"] in ("send", "recv"):
            head += f" {'to' if task['coll'] == 'send' else 'from'} rank {task['peer']}"
        elif task["coll"] in ("broadcast", "reduce"):
            head += f" root {task['root']}"
        if task["coll"] not in ("send", "recv", "all_gather", "broadcast"):
            op = task["op"] if task["op"] != "user" else f"user op {task['op_handle']}"
            head += f", op {op} -> {task['dev_op']}"
        lines.append(head)
        elems = per_task.get(i, [])
        if task["count"] == 0:
            lines.append("    nothing to run (count 0)")
            continue
        if d["one_rank"] and task["coll"] not in ("send", "recv"):
            lines.append(
                "    one rank: a plain copy"
                + (" with the PreMulSum scaling" if task["dev_op"] == "premulsum" else "")
            )
            continue
        if task["algorithm"] is not None:
            tuned = " (tuner fixed its channels)" if task["user_tuned"] else ""
            lines.append(
                f"    {task['algorithm']} / {task['protocol']}, pattern {task['pattern']}: "
                f"{task['nchannels']} channel(s) x {task['nthreads']} threads{tuned}; "
                f"predicted {task['predicted_us']:.1f} us"
                + (
                    f" (costed as an aggregate of {_size(task['agg_bytes'])})"
                    if task["agg_bytes"] and task["agg_bytes"] != task["nbytes"]
                    else ""
                )
            )
            lines.append(
                f"    chunk {_size(task['chunk_size'])} ({task['chunk_count']} elems), "
                f"step {_size(task['step_size'])}, {task['chunk_steps']} steps/chunk, "
                f"{task['slice_steps']} steps/slice; kernel {task['kernel']}"
            )
            if task["choice_note"]:
                lines.append(f"    not the requested choice: {task['choice_note']}")
        else:
            protos = sorted({e["proto"] for e in elems})
            chans = sorted({e["channel"] for e in elems})
            lines.append(
                f"    p2p, protocol {'/'.join(protos) or '-'}: {len(elems)} chunk(s) on "
                f"{len(chans)} channel(s); kernel {task['kernel']}"
            )
        if elems:
            lines.append(f"    elements: {_ranges(elems)}")

    for k in d["kernels"]:
        used = [c["id"] for c in k["channels"]]
        shown = ",".join(map(str, used[:12])) + (",..." if len(used) > 12 else "")
        lines.append(
            f"kernel {k['index']}: {k['channel_count']} channel(s) [{shown}], "
            f"{k['threads_per_block']} threads/block, {k['nwork']} work(s)"
        )
    lines.extend(_proxy_lines(d))
    return "\n".join(lines)
