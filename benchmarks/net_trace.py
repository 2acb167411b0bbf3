"""Where the steps of GPU groups across hosts spend their time: a summary of the network proxies'
timelines (JAX_RCCL_NET_TRACE).

    JAX_RCCL_NET_TRACE=/tmp/trace python3 -P benchmarks/gpu_cross_host.py --paths cross ...
    python3 -P benchmarks/net_trace.py /tmp/trace [--skip 0.1]

Each process's network proxy writes, when it stops, the last 2^20 events of its connections (one
connection: a channel between a rank of this process and a rank of another host, one direction):
per step, on the sending side, when the proxy saw the kernel post it, handed it to the network
and the network took it; on the receiving side, when it posted the receive into the slot the
kernel freed, when the step landed and when the kernel freed the slot again. This script pairs
each step's two ends (the same channel, sender and receiver, step number) and prints, per stage,
the count and the mean and percentiles in microseconds, over all connections, leaving out the
first --skip of each connection's steps (the warm-up):

  kernel post -> to network        the proxy's turn (sending)
  to network -> sent               waiting for the receiver's credit, and the write
  sent -> landed                   the wire and the receiving proxy's turn (both ends on one
                                   machine only: the times are each machine's steady clock;
                                   each end records what its proxy sees when it looks, so a
                                   step may land before its sender's proxy sees it sent)
  receive posted -> landed         how early the receive was ready
  landed -> freed by the kernel    the receiving kernel's turn (it takes steps in its order)
  slot sent -> kernel refills it   the sending kernel's turn (step s reuses step s - 8's slot)
  freed -> receive posted          the proxy's turn (receiving)
  kernel post interval             time between a connection's consecutive steps
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
from dataclasses import dataclass, field

KINDS = ("posted", "to_network", "sent", "recv_posted", "landed", "freed")
STEPS = 8  # kSteps: slots per connection


@dataclass
class Timeline:
    """One proxy's file: its connections and their events."""

    path: str
    host: str
    links: dict[int, tuple[int, bool, int, int]] = field(default_factory=dict)
    events: dict[int, dict[tuple[int, int], int]] = field(default_factory=dict)  # link -> ...


def read(path: str) -> Timeline:
    """Parses one timeline file (ffi/comm/proxy.cc: NetProxy::WriteTrace)."""
    t = Timeline(path=path, host="")
    with open(path) as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "#":
                if "host" in parts:
                    t.host = parts[parts.index("host") + 1].rstrip(",")
                continue
            if parts[0] == "link":
                idx, channel, way, local, remote = parts[1:6]
                t.links[int(idx)] = (int(channel), way == "send", int(local), int(remote))
                continue
            ns, link, kind, step = (int(x) for x in parts[:4])
            t.events.setdefault(link, {})[(kind, step)] = ns
    return t


def _ends(timelines: list[Timeline]):
    """(channel, from, to) -> {"send": (timeline, events), "recv": (timeline, events)}."""
    conns: dict = {}
    for t in timelines:
        for idx, (channel, send, local, remote) in t.links.items():
            key = (channel, local, remote) if send else (channel, remote, local)
            conns.setdefault(key, {})["send" if send else "recv"] = (t, t.events.get(idx, {}))
    return conns


def stages(timelines: list[Timeline], skip: float = 0.1) -> dict[str, list[float]]:
    """Per stage (the module's list), its durations in microseconds over every step kept."""
    out: dict[str, list[float]] = {}

    def add(name: str, a: int | None, b: int | None) -> None:
        if a is not None and b is not None:
            out.setdefault(name, []).append((b - a) / 1e3)

    for ends in _ends(timelines).values():
        snd = ends.get("send", (None, {}))
        rcv = ends.get("recv", (None, {}))
        s_ev, r_ev = snd[1], rcv[1]
        same_clock = snd[0] is not None and rcv[0] is not None and snd[0].host == rcv[0].host
        steps = sorted({s for (k, s) in s_ev if k == 0} | {s for (k, s) in r_ev if k == 4})
        if not steps:
            continue
        first = steps[int(len(steps) * skip)] if skip > 0 else steps[0]
        for s in steps:
            if s < first:
                continue
            posted, to_net, sent = (s_ev.get((k, s)) for k in (0, 1, 2))
            rposted, landed, freed = (r_ev.get((k, s)) for k in (3, 4, 5))
            add("kernel post -> to network", posted, to_net)
            add("to network -> sent", to_net, sent)
            if same_clock:
                add("sent -> landed", sent, landed)
            add("receive posted -> landed", rposted, landed)
            add("landed -> freed by the kernel", landed, freed)
            add("slot sent -> kernel refills it", s_ev.get((2, s - STEPS)), posted)
            add("freed -> receive posted", r_ev.get((5, s - STEPS)), rposted)
            add("kernel post interval", s_ev.get((0, s - 1)), posted)
    return out


def table(st: dict[str, list[float]]) -> str:
    rows = [f"{'stage':32} {'steps':>8} {'mean':>9} {'p10':>9} {'p50':>9} {'p90':>9} {'p99':>9}"]
    for name, v in st.items():
        v = sorted(v)
        n = len(v)
        q = [v[min(n - 1, int(n * f))] for f in (0.1, 0.5, 0.9, 0.99)]
        rows.append(
            f"{name:32} {n:8d} {statistics.fmean(v):9.1f} " + " ".join(f"{x:9.1f}" for x in q)
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="the JAX_RCCL_NET_TRACE folder")
    ap.add_argument("--skip", type=float, default=0.1, help="fraction of each connection's steps")
    args = ap.parse_args(argv)
    if not 0 <= args.skip < 1:
        ap.error("--skip must be in [0, 1)")
    paths = sorted(glob.glob(os.path.join(args.folder, "net-trace.*.txt")))
    if not paths:
        print(f"no net-trace.*.txt files in {args.folder}", file=sys.stderr)
        return 1
    timelines = [read(p) for p in paths]
    n_links = sum(len(t.links) for t in timelines)
    print(f"# {len(paths)} timelines, {n_links} connection ends; times in us")
    print(table(stages(timelines, args.skip)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
