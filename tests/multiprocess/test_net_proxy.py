"""The network proxy (ffi/comm/proxy.h) over the network interface (ffi/comm/net.h): our TCP, and
UCX over its TCP and its shared-memory transports (JAX_RCCL_NET), with a host-memory stand-in
for the GPU kernels' FIFOs (ffi/testing/bind_proxy.cc).

Ranks sit on two hosts, faked by the world table; each process runs the proxy for its ranks and
a stand-in kernel per rank that moves exactly the steps of the planner's proxy ops (every
protocol, the step sizes of the topology's buffers), with data the receiver checks. The proxy
follows the FIFO counters alone: the steps it moves must be the steps the plan names, every
sender's step must reach its receiver, and a dead or stopped peer must be an error naming it."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import tempfile
import threading
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: nets
from launcher import run_python  # noqa: E402
from nets import BACKENDS, NEEDS_UCX, NETS, UCX_NETS  # noqa: E402
from test_shm_transport import load_native, publish, spawn, wait_file, world_of  # noqa: E402
from worker import runtime_threads  # noqa: E402

HERE = os.path.abspath(__file__)
STEPS = 8  # kSteps: slots per connection


# ---- the worker (one process: the ranks of some hosts) ----


class _ThreadNames:
    """The names of this process's jax_rccl threads (worker.py: runtime_threads), sampled every
    millisecond on a thread of its own until stop()."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.is_set():
            self.names.update(runtime_threads())
            time.sleep(0.001)

    def stop(self) -> list[str]:
        self.done.set()
        self.thread.join()
        return sorted(self.names)


def worker(args: dict) -> dict:
    native = load_native()
    p, nprocs = args["process"], args["nprocs"]
    world = world_of(p, nprocs, 1, args["session"])
    folder = args["folder"]
    out: dict = {"process": p}
    t0 = time.monotonic()
    log = os.path.join(folder, f"{p}.stderr")
    if args.get("capture_stderr"):
        # The runtime's INFO lines (C stdio), for the driver to read.
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 2)
    try:
        if p in args.get("no_ucx", []):
            # A process where UCX cannot be loaded: no libucx to import, no libucp to open.
            sys.modules["libucx"] = None
            native.set_ucx_library("libucp-absent.so.0")
        else:
            from jax_rccl import _ucx

            out["ucx_source"] = _ucx.load()
        if args.get("nofile_soft"):
            import resource

            hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
            resource.setrlimit(resource.RLIMIT_NOFILE, (args["nofile_soft"], hard))
        native.set_session_secret(world["secret"])
        native.set_net_helper_poll_ms(args.get("helper_poll_ms", 0))
        port = native.socket_listen("127.0.0.1")
        publish(folder, f"{p}.ep", f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        eps = [wait_file(os.path.join(folder, f"{q}.ep"), deadline) for q in range(nprocs)]
        if args.get("wait_go"):
            wait_file(os.path.join(folder, "go"), deadline)  # a stranger has done its part
        process_of = args["process_of_rank"]
        local = [r for r, q in enumerate(process_of) if q == p]
        # One proxy per round, one after the other (a new group each).
        rounds = args.get("rounds") or [
            {"programs": args["programs"], "step_bytes": args["step_bytes"]}
        ]
        t0 = time.monotonic()
        sampler = _ThreadNames() if args.get("thread_names") else None
        out["rounds"] = []
        out["stats"] = []
        for i, rd in enumerate(rounds):
            res = native.run_net_proxy(
                args["session"],
                p,
                args["group"] + i,
                [eps[q] for q in process_of],
                args["host_of_rank"],
                local,
                [rd["programs"][r] for r in local],
                rd["step_bytes"],
                args["timeout"],
                args["stop_after"] if p == args.get("faulty", -1) else -1,
                net_threads=args.get("net_threads", 2),
                drain_wait=args.get("drain_wait", True),
                recv_delay_us=args.get("recv_delay_us", 0),
                net_streams=args.get("net_streams", 0),
                hold_channel=args.get("hold_channel", -1),
                trace_dir=args.get("trace_dir", ""),
                trace_events=args.get("trace_events", 0),
                net=args.get("net_of", {}).get(str(p), ""),
                abort_at_stop=p == args.get("faulty", -1) and args.get("fault") == "abort",
            )
            out["rounds"].append([list(c) for c in res.get("conns", [])])
            out.setdefault("transports", []).append(list(res.get("transports", [])))
            out["stats"].append(dict(res.get("stats", {})))
            out.setdefault("bytes", []).append(res.get("bytes", 0))
        out["seconds"] = time.monotonic() - t0
        out["conns"] = out["rounds"][0]
        if sampler is not None:
            out["thread_names"] = sampler.stop()
        if args.get("nofile_soft"):
            import resource

            out["nofile"] = list(resource.getrlimit(resource.RLIMIT_NOFILE))
        out["counts"] = native.socket_listener_counts()
        if p == args.get("faulty", -1):
            if args["fault"] in ("stop", "abort"):
                # Stopped (connections open, nothing moves), or its proxy aborted from outside.
                time.sleep(args["timeout"] + 5)
            # Its proxy still runs: leave without running the interpreter's teardown (the
            # connections close with the process).
            print(json.dumps(out), flush=True)
            os._exit(0)
    except Exception as e:  # noqa: BLE001 - reported to the driver
        out["error"] = f"{type(e).__name__}: {e}"
        out["seconds"] = time.monotonic() - t0
    if args.get("capture_stderr"):
        sys.stderr.flush()
        with open(log) as f:
            out["stderr"] = f.read()
    return out


# ---- the driver ----


def _plan_programs(tasks, topo, **kw) -> list[list[dict]]:
    from jax_rccl import planner

    progs = []
    for r in range(topo.nranks):
        ops = planner.plan(tasks, topo, r, **kw).proxy_ops
        progs.append(
            [
                {k: o[k] for k in ("channel", "protocol", "nsteps", "send_peers", "recv_peers")}
                for o in ops
            ]
        )
    return progs


def _topology(nranks: int, nnodes: int, **kw):
    from jax_rccl.planner import Topology

    return Topology(
        nranks=nranks,
        nnodes=nnodes,
        arch="sm90",
        link="nvlink",
        bw_intra=20.0,
        bw_inter=12.0,
        nchannels=kw.pop("nchannels", 2),
        p2p_nchannels=2,
        ll128=True,
        **kw,
    )


def _run(
    topo, programs, process_of_rank, timeout=20.0, net="socket", env=None, folder=None, **kw
) -> list[dict]:
    """Runs the programs, a process per value of `process_of_rank`, on network `net` (BACKENDS;
    `env` added), in `folder` (a new one unless given)."""
    kw.setdefault("stop_after", -1)
    if folder is None:
        with tempfile.TemporaryDirectory() as tmp:
            return _run(topo, programs, process_of_rank, timeout, net, env, tmp, **kw)
    return spawn(
        HERE,
        max(process_of_rank) + 1,
        1,
        "proxy",
        timeout_s=timeout + 60,
        env_extra={**BACKENDS[net], **(env or {})},
        folder=folder,
        group=0x5EED,
        programs=programs,
        process_of_rank=process_of_rank,
        host_of_rank=[r // topo.local_ranks for r in range(topo.nranks)],
        step_bytes=[b // STEPS for b in topo.buff_sizes],
        timeout=timeout,
        **kw,
    )


def _planned(programs) -> dict:
    """(channel, from, to) -> steps, from the proxy ops of every rank, by its send side and by
    its receive side."""
    sends: dict = {}
    recvs: dict = {}
    for rank, ops in enumerate(programs):
        for o in ops:
            for q in o["send_peers"]:
                key = (o["channel"], rank, q)
                sends[key] = sends.get(key, 0) + o["nsteps"]
            for q in o["recv_peers"]:
                key = (o["channel"], q, rank)
                recvs[key] = recvs.get(key, 0) + o["nsteps"]
    assert sends == recvs, "a sender's network steps without its receiver's"
    return sends


def _check_transports(results, net: str) -> None:
    """Every connection moved its bytes on `net`: TCP streams, or UCX over the transports its
    UCX_TLS allows (tcp; shared memory, cma, or self within one process)."""
    allowed = {"socket": None, "ucx_tcp": {"tcp"}, "ucx_sm": {"posix", "sysv", "cma", "self"}}[net]
    for res in results:
        for transports in res["transports"]:
            assert transports, res
            for t in transports:
                if allowed is None:
                    assert t == "socket", t
                    continue
                assert t.startswith("ucx: "), t
                names = {part.split("/")[0] for part in t[len("ucx: ") :].split(", ")}
                assert names and names <= allowed, t


def _check(results, programs) -> None:
    for res in results:
        assert "error" not in res, res
    planned = _planned(programs)
    assert planned, "the plan moves nothing across hosts"
    for res in results:
        for channel, frm, to, stand_in, proxy in res["conns"]:
            key = (channel, frm, to)
            assert stand_in == proxy == planned[key], (key, stand_in, proxy, planned[key])
    # Every planned connection ran, at both of its ends.
    ends = sum(len(res["conns"]) for res in results)
    assert ends == 2 * len(planned)


CASES = [
    ("all_reduce", 1 << 18, "float32", "ring", "simple"),
    ("all_reduce", 1 << 18, "float32", "tree", "simple"),
    ("all_reduce", 3000, "float32", "ring", "ll"),
    ("all_reduce", 3000, "float32", "tree", "ll"),
    ("all_reduce", 100000, "bfloat16", "ring", "ll128"),
    ("all_gather", 70001, "int8", "ring", "simple"),
    ("reduce_scatter", 1 << 16, "float32", "ring", "ll"),
    ("broadcast", 1 << 17, "int32", "ring", "simple"),
]


@pytest.mark.parametrize("net", NETS)
@pytest.mark.parametrize("coll,count,dtype,algo,proto", CASES)
def test_two_hosts_move_every_planned_step(coll, count, dtype, algo, proto, net):
    """Two processes, one per host, two ranks each: the proxy of each process carries its ranks'
    steps to the other host's; every step arrives intact, once, and the counts are the plan's;
    each connection on the network asked for."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs(
        [Task(coll, count, dtype, root=1 if coll == "broadcast" else 0)],
        topo,
        algorithm=algo,
        protocol=proto,
    )
    results = _run(topo, programs, [0, 0, 1, 1], net=net)
    _check(results, programs)
    _check_transports(results, net)


@pytest.mark.parametrize("net", NETS)
def test_one_process_two_fake_hosts_and_several_tasks(net):
    """Both hosts in one process (the proxy connects to its own listener), one rank per host,
    a group of tasks whose proxy ops the planner interleaves, on 4 channels."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2, nchannels=4)
    tasks = [
        Task("all_reduce", 1 << 17, "float32"),
        Task("all_gather", 5000, "float16"),
        Task("reduce_scatter", 1 << 19, "float32"),
    ]
    programs = _plan_programs(tasks, topo)
    results = _run(topo, programs, [0, 0], net=net)
    _check(results, programs)
    _check_transports(results, net)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="no /proc (thread names)")
def test_the_runtime_threads_carry_names():
    """The proxy, the network interface's helpers and the listener's accept thread are named
    (top -H, ps -L, /proc/PID/task/*/comm): a user can tell their CPU time apart."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo)
    results = _run(topo, programs, [0, 1], thread_names=True, recv_delay_us=2000)
    _check(results, programs)
    for r in results:
        assert {"jrccl proxy", "jrccl net", "jrccl accept"} <= set(r["thread_names"]), r


@pytest.mark.parametrize("net_streams", [0, 1], ids=["stream_per_channel", "one_stream"])
def test_a_helper_polls_a_new_stream_at_once(net_streams):
    """A helper thread polls a stream from its creation on: the sending end's first credits,
    which no post rings the helper for, are read when they come, not at the end of the poll the
    helper was in when the stream came (raised here to 60 s, past the run's timeout, so a stream
    left out shows as the run's error). One helper per stream (8 helpers)."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 12, "float32")], topo)
    results = _run(
        topo,
        programs,
        [0, 1],
        timeout=5.0,
        net_threads=8,
        net_streams=net_streams,
        helper_poll_ms=60_000,
    )
    _check(results, programs)


@pytest.mark.parametrize("net_threads", [0, 2], ids=["proxy_pumps", "helper_threads"])
@pytest.mark.parametrize("net_streams", [0, 1], ids=["stream_per_channel", "one_stream"])
def test_four_hosts_of_one_rank(net_threads, net_streams):
    """Four processes, each its own host: every ring connection crosses hosts; the TCP bytes
    moved by the proxy's own thread or by helper threads, each channel on a stream of its own or
    both channels of a pair of ranks on one."""
    from jax_rccl.planner import Task

    topo = _topology(4, 4)
    programs = _plan_programs(
        [Task("all_reduce", 1 << 18, "float32")], topo, algorithm="ring", protocol="simple"
    )
    results = _run(topo, programs, [0, 1, 2, 3], net_threads=net_threads, net_streams=net_streams)
    _check(results, programs)


@pytest.mark.parametrize("net", UCX_NETS)
def test_four_hosts_of_one_rank_on_ucx(net):
    """Four processes, each its own host, every ring connection across hosts, on UCX."""
    from jax_rccl.planner import Task

    topo = _topology(4, 4)
    programs = _plan_programs(
        [Task("all_reduce", 1 << 18, "float32")], topo, algorithm="ring", protocol="simple"
    )
    results = _run(topo, programs, [0, 1, 2, 3], net=net)
    _check(results, programs)
    _check_transports(results, net)


@pytest.mark.parametrize("net_streams", [1, 3])
@pytest.mark.parametrize("coll,count,dtype,algo,proto", CASES[:3] + CASES[4:6])
def test_channels_sharing_streams_move_every_planned_step(
    coll, count, dtype, algo, proto, net_streams
):
    """Two processes, two ranks each, 4 channels on 1 or 3 TCP streams per pair of ranks (the
    channels c and c + S share one): every step arrives intact, once, on its own channel."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2, nchannels=4)
    programs = _plan_programs([Task(coll, count, dtype)], topo, algorithm=algo, protocol=proto)
    results = _run(topo, programs, [0, 0, 1, 1], net_streams=net_streams)
    _check(results, programs)


@pytest.mark.parametrize(
    "net,net_threads",
    [
        ("socket", 0),
        ("socket", 2),
        *[pytest.param(n.values[0], 0, marks=NEEDS_UCX) for n in UCX_NETS],
    ],
    ids=["proxy_pumps", "helper_threads", "ucx_tcp", "ucx_sm"],
)
def test_a_lagging_channel_holds_up_no_other_channel_on_its_stream(net, net_threads):
    """4 channels on one TCP stream; the receiver takes none of channel 0's steps until the other
    three have finished (a block that runs behind the others). Its sender may post only as many
    steps as the receiver has receives for (credits), so channel 0's steps never sit in the
    stream in front of the others': all four finish, every step intact."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2, nchannels=4)
    programs = _plan_programs(
        [Task("broadcast", 1 << 24, "int8", root=0)], topo, algorithm="ring", protocol="simple"
    )
    # Many more steps per channel than a connection's slots: without credits, channel 0's ninth
    # step would wait in the stream ahead of everything else.
    assert all(o["nsteps"] >= 4 * STEPS for o in programs[0]), programs[0]
    results = _run(
        topo, programs, [0, 1], net=net, net_streams=1, hold_channel=0, net_threads=net_threads
    )
    _check(results, programs)


@pytest.mark.parametrize("net", NETS)
def test_a_sender_that_stops_at_once_still_ships_its_last_steps(net):
    """The sending process stops its proxy as soon as its stand-in posted the last step (as at
    process exit, with steps still in its slots) while the receiver frees each step only after
    5 ms: Stop ships the rest and closes in order, and the receiver gets every step."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs(
        [Task("broadcast", 1 << 20, "int8", root=0)], topo, algorithm="ring", protocol="simple"
    )
    results = _run(topo, programs, [0, 1], net=net, drain_wait=False, recv_delay_us=5000)
    _check(results, programs)


@pytest.mark.parametrize("net", NETS)
def test_repeated_launches_continue_the_counters(net):
    """The same proxy serves the plan three times over (a launch and two replays): its counters
    go on from where the last launch left them, and every step still arrives once."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    once = _plan_programs(
        [Task("all_reduce", 1 << 17, "float32"), Task("all_gather", 999, "int8")], topo
    )
    programs = [ops * 3 for ops in once]
    results = _run(topo, programs, [0, 0, 1, 1], net=net)
    _check(results, programs)
    for res in results:
        for channel, frm, to, _, proxy in res["conns"]:
            assert proxy == 3 * _planned(once)[(channel, frm, to)]


@pytest.mark.parametrize("net", NETS)
def test_runtime_stats_tell_where_the_steps_waited(net):
    """The proxies count into the runtime counters: every byte one process sent, the other
    received; and a receiver whose kernel frees each step only after 20 ms has its receiving
    connections' slots all full (the network waits for the kernel) for a large part of their
    time (about half here), more than when it frees each at once."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs(
        [Task("broadcast", 1 << 22, "int8", root=0)], topo, algorithm="ring", protocol="simple"
    )
    full = {}
    for delay in (0, 20000):
        results = _run(topo, programs, [0, 1], net=net, recv_delay_us=delay)
        _check(results, programs)
        send, recv = results[0]["stats"][0], results[1]["stats"][0]
        # What one process's proxy sent, the other's received (two processes' counters).
        assert send["net_bytes_sent"] == recv["net_bytes_received"] > 0, (send, recv)
        assert send["net_bytes_received"] == recv["net_bytes_sent"] == 0, (send, recv)
        # Only sending links in process 0, only receiving ones in process 1.
        assert send["net_recv_ns"] == 0 and recv["net_send_ns"] == 0, (send, recv)
        assert send["net_send_ns"] > 0 and recv["net_recv_ns"] > 0, (send, recv)
        # Each link's time is the proxy's life at most.
        links = len(results[1]["conns"])
        assert recv["net_recv_ns"] < links * (results[1]["seconds"] + 5) * 1e9, recv
        full[delay] = recv["net_recv_ns_full"] / recv["net_recv_ns"]
    assert full[20000] > 0.3 and full[20000] > full[0], full


def _host_1_faulty(fault: str, timeout: float, **kw) -> dict:
    """A ring all_reduce of 32 MiB over two hosts of two ranks (process 0: ranks 0 and 1, process
    1: ranks 2 and 3), process 1 faulty (`fault`) after 5 steps: process 0's result."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs(
        [Task("all_reduce", 1 << 23, "float32")], topo, algorithm="ring", protocol="simple"
    )
    results = _run(
        topo, programs, [0, 0, 1, 1], timeout=timeout, faulty=1, fault=fault, stop_after=5, **kw
    )
    return results[0]


@pytest.mark.parametrize(
    "net,net_streams",
    [
        ("socket", 0),
        ("socket", 1),
        *[pytest.param(n.values[0], 0, marks=NEEDS_UCX) for n in UCX_NETS],
    ],
    ids=["stream_per_channel", "one_stream", "ucx_tcp", "ucx_sm"],
)
@pytest.mark.parametrize("fault", ["exit", "stop"])
def test_a_dead_or_stopped_peer_is_an_error_naming_it(fault, net, net_streams):
    """Process 1 (ranks 2 and 3, host 1) stops after a few steps: it exits (its connections
    close) or stays with its connections open and moves nothing. Process 0 must fail naming a
    rank of host 1: an exit at once, a stop when its proxy's timeout passes with its sends stuck
    (the transfer outgrows what the stopped side's buffers take in)."""
    timeout = 4.0
    r0 = _host_1_faulty(fault, timeout, net=net, net_streams=net_streams)
    assert "error" in r0, r0
    assert "rank 2 (host 1)" in r0["error"] or "rank 3 (host 1)" in r0["error"], r0["error"]
    if fault == "exit":
        # Its streams ended without closing in order, or were reset, or ended with steps still
        # to send to it: each names it.
        assert "closed its network connection" in r0["error"] or "reset" in r0["error"], r0
        assert r0["seconds"] < timeout, r0
    else:
        assert "took no network data" in r0["error"], r0["error"]
        assert timeout < r0["seconds"] < 2 * timeout, r0


@pytest.mark.parametrize("net", NETS)
def test_a_failed_proxy_resets_its_connections_so_its_peers_fail_at_once(net):
    """Three hosts of one rank in a ring (0 -> 1 -> 2 -> 0); process 1's kernel stops (its proxy
    runs on). Process 0's proxy fails when its sends to rank 1 stall, and resets its connections:
    process 2, whose sends to rank 0 then break, fails at once, well before its own wait on rank 1
    would give up, naming rank 0 or rank 1 (whose proxy fails the same way on rank 0's reset and
    resets its connection to rank 2 too: process 2 names the reset it sees first)."""
    from jax_rccl.planner import Task

    topo = _topology(3, 3)
    programs = _plan_programs(
        [Task("all_reduce", 3 << 22, "float32")], topo, algorithm="ring", protocol="simple"
    )
    timeout = 4.0
    results = _run(
        topo, programs, [0, 1, 2], timeout=timeout, faulty=1, fault="stop", stop_after=3, net=net
    )
    r0, r2 = results[0], results[2]
    assert "rank 1 (host 1) took no network data" in r0.get("error", ""), r0
    err = r2.get("error", "")
    assert "reset" in err and "took no network data" not in err, r2
    assert re.search(r"rank [01] \(host [01]\)", err), r2
    assert r2["seconds"] < 2 * timeout, r2


def _random_round(rng: random.Random, nchannels: int) -> dict:
    """Two ranks on two hosts: per channel and direction a run of segments, each a random
    protocol for a random number of steps; each rank's ops in a random order across channels
    and directions (the stand-in moves every connection independently, as blocks do)."""
    step_bytes = [
        rng.choice([16, 64, 4096]),
        rng.choice([128, 1024, 8192]),
        rng.choice([256, 65536]),
    ]
    progs: list[list[dict]] = [[], []]
    for c in range(nchannels):
        for frm in (0, 1):
            to = 1 - frm
            for _ in range(rng.randint(0, 4)):
                proto = rng.choice(["ll", "ll128", "simple"])
                n = rng.randint(1, 40)
                op = {"channel": c, "protocol": proto, "nsteps": n}
                progs[frm].append({**op, "send_peers": [to], "recv_peers": []})
                progs[to].append({**op, "send_peers": [], "recv_peers": [frm]})

    def conn(o: dict) -> tuple:
        return (o["channel"], bool(o["send_peers"]))

    for ops in progs:
        # Shuffled, each connection's segments kept in order (its protocol sequence).
        queues: dict = {}
        for o in ops:
            queues.setdefault(conn(o), []).append(o)
        keys = [conn(o) for o in ops]
        rng.shuffle(keys)
        ops[:] = [queues[k].pop(0) for k in keys]
    return {"programs": progs, "step_bytes": step_bytes}


@pytest.mark.parametrize("net", NETS)
def test_a_proxy_aborted_while_idle_resets_its_connections(net):
    """Process 1 (ranks 2 and 3, host 1) stops after a few steps and, once its proxy idles, aborts
    the proxy from outside (its communicator failed): its connections reset at once, so process 0
    fails naming a rank of host 1 well before its own timeout, with the process still alive."""
    timeout = 6.0
    r0 = _host_1_faulty("abort", timeout, net=net)
    assert "error" in r0, r0
    assert "rank 2 (host 1)" in r0["error"] or "rank 3 (host 1)" in r0["error"], r0["error"]
    assert "took no network data" not in r0["error"], r0["error"]
    assert r0["seconds"] < timeout / 2, r0


@pytest.mark.parametrize(
    "net,net_streams",
    [
        ("socket", 0),
        ("socket", 2),
        *[pytest.param(n.values[0], 0, marks=NEEDS_UCX) for n in UCX_NETS],
    ],
)
def test_random_protocol_mixes_in_one_process(net, net_streams):
    """Twelve proxies in turn, each over random programs: protocols changing from segment to
    segment on a connection, random step sizes, 1 to 4 channels (each on a stream of its own, or
    on 2 streams per pair of ranks), ops of both directions mixed. Every step arrives with its
    data, and each connection moves exactly its planned steps."""
    rng = random.Random(20261205)
    rounds = [_random_round(rng, rng.randint(1, 4)) for _ in range(12)]
    with tempfile.TemporaryDirectory() as folder:
        results = spawn(
            HERE,
            1,
            1,
            "proxy",
            timeout_s=120,
            env_extra=BACKENDS[net],
            folder=folder,
            group=0x7A11,
            rounds=rounds,
            process_of_rank=[0, 0],
            host_of_rank=[0, 1],
            timeout=20.0,
            stop_after=-1,
            net_streams=net_streams,
        )
    res = results[0]
    assert "error" not in res, res
    for rd, conns in zip(rounds, res["rounds"], strict=True):
        planned = _planned(rd["programs"])
        assert len(conns) == 2 * len(planned)
        for channel, frm, to, stand_in, proxy in conns:
            assert stand_in == proxy == planned[(channel, frm, to)]


# ---- choosing the network (JAX_RCCL_NET) ----


def _info_lines(res: dict) -> list[str]:
    return [ln for ln in res["stderr"].splitlines() if ln.startswith("jax_rccl INFO net: channel")]


@NEEDS_UCX
@pytest.mark.parametrize("tls,picked", [("sm,self", "ucx"), ("tcp", "socket")])
def test_auto_takes_ucx_only_for_a_transport_faster_than_tcp(tls, picked):
    """JAX_RCCL_NET=auto: where UCX reaches the other host over shared memory it carries the
    connection; where it offers only its TCP, our TCP does. JAX_RCCL_DEBUG=INFO says, for every
    connection at both ends, which backend and which UCX transports were chosen, and why."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo, protocol="simple")
    env = {"JAX_RCCL_NET": "auto", "UCX_TLS": tls, "JAX_RCCL_DEBUG": "INFO"}
    results = _run(topo, programs, [0, 0, 1, 1], env=env, capture_stderr=True)
    _check(results, programs)
    for res in results:
        assert res["ucx_source"] in ("system", "wheel"), res
        assert "jax_rccl INFO net: JAX_RCCL_NET=auto: UCX 1." in res["stderr"], res["stderr"]
        transports = res["transports"][0]
        lines = _info_lines(res)
        assert len(lines) == len(transports) == len(res["conns"]), (lines, transports)
        for t, line in zip(transports, lines, strict=True):
            if picked == "ucx":
                assert t.startswith("ucx: ") and ("sysv" in t or "posix" in t), t
                assert "(JAX_RCCL_NET=auto: faster than TCP)" in line, line
                assert t[len("ucx: ") :] in line, (t, line)
            else:
                assert t == "socket", t
                assert "our TCP (JAX_RCCL_NET=auto: UCX offers only tcp/" in line, line


@NEEDS_UCX
def test_auto_with_a_peer_without_ucx_runs_on_tcp():
    """A process where UCX cannot be loaded and one where it can, both JAX_RCCL_NET=auto: every
    connection between them runs on our TCP (the receiver decides, knowing both ends)."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo, protocol="simple")
    env = {"JAX_RCCL_NET": "auto", "UCX_TLS": "sm,self", "JAX_RCCL_DEBUG": "INFO"}
    results = _run(topo, programs, [0, 0, 1, 1], env=env, no_ucx=[0], capture_stderr=True)
    _check(results, programs)
    assert "ucx_source" not in results[0] and results[1]["ucx_source"] in ("system", "wheel")
    for res in results:
        assert set(res["transports"][0]) == {"socket"}, res["transports"]
    why = {"this process has no UCX", "rank 0 has no UCX", "rank 1 has no UCX"}
    for line in _info_lines(results[1]):
        assert any(w in line for w in why), line


def test_socket_runs_where_ucx_cannot_be_loaded_and_ucx_is_then_an_error():
    """Processes where UCX cannot be loaded (no libucx to import, libucp not found): auto and
    socket run every connection on our TCP; ucx fails at once with an error that says why and
    what to do."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo, protocol="simple")
    for net in ("auto", "socket"):
        env = {"JAX_RCCL_NET": net, "JAX_RCCL_DEBUG": "INFO"}
        results = _run(topo, programs, [0, 0, 1, 1], env=env, no_ucx=[0, 1], capture_stderr=True)
        _check(results, programs)
        for res in results:
            assert set(res["transports"][0]) == {"socket"}, res["transports"]
            if net == "auto":
                assert (
                    "JAX_RCCL_NET=auto: no UCX (jax_rccl: UCX could not be loaded"
                    in (res["stderr"])
                ), res["stderr"]
    results = _run(topo, programs, [0, 0, 1, 1], env={"JAX_RCCL_NET": "ucx"}, no_ucx=[0, 1])
    for res in results:
        err = res.get("error", "")
        assert err.startswith("NotImplementedError: jax_rccl: UCX could not be loaded"), res
        assert "libucp-absent.so.0" in err and "pip install jax_rccl[ucx]" in err, err
        assert "JAX_RCCL_NET=ucx" in err, err


@NEEDS_UCX
@pytest.mark.parametrize("net", UCX_NETS)
def test_a_stranger_without_the_secret_gets_no_ucx_endpoint(net):
    """A stranger that knows the session id but not the secret connects to every listener as the
    sender of a UCX connection of the group (its hello, then a proof it cannot make): it is
    dropped after the challenge, before any offer or answer, so it never learns a UCP worker
    address or a connection token; the listeners count it, and the job's connections run on
    UCX."""
    import socket
    import struct
    import uuid

    from test_transport_security import HELLO_MAGIC, _closed_on, _false_proof, _split

    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo, protocol="simple")
    session = uuid.uuid4().hex
    got: dict = {}

    def stranger(folder):
        try:
            deadline = time.monotonic() + 60
            eps = [wait_file(os.path.join(folder, f"{q}.ep"), deadline) for q in range(2)]
            for ep in eps:
                with socket.create_connection(_split(ep), timeout=5) as s:
                    # Group 0x5EED, channel 0 of a UCX connection (flag 1 << 25), rank 0 -> 2.
                    hello = struct.pack(
                        "<QQiiii64s16s",
                        HELLO_MAGIC,
                        0x5EED,
                        (1 << 25) | 0,
                        0,
                        2,
                        0,
                        session.encode(),
                        os.urandom(16),
                    )
                    s.sendall(hello)
                    _false_proof(s)
                    got.setdefault("closed", []).append(_closed_on(s))
        except BaseException as e:  # noqa: BLE001 - reported below
            got["error"] = repr(e)
        finally:
            publish(folder, "go", "")

    with tempfile.TemporaryDirectory() as folder:
        t = threading.Thread(target=stranger, args=(folder,), daemon=True)
        t.start()
        results = spawn(
            HERE,
            2,
            1,
            "proxy",
            timeout_s=90,
            session=session,
            env_extra=BACKENDS[net],
            folder=folder,
            group=0x5EED,
            programs=programs,
            process_of_rank=[0, 0, 1, 1],
            host_of_rank=[0, 0, 1, 1],
            step_bytes=[b // STEPS for b in topo.buff_sizes],
            timeout=20.0,
            stop_after=-1,
            wait_go=True,
        )
        t.join(10)
    assert "error" not in got, got["error"]
    assert got["closed"] == [True, True], got
    _check(results, programs)
    _check_transports(results, net)
    for res in results:
        assert res["counts"]["unauthorized"] >= 1, res["counts"]


@NEEDS_UCX
def test_ucx_info_says_which_ucx_and_what_it_moves():
    """A fresh process has the backend built but UCX not loaded; jax_rccl._ucx.load() makes it
    loadable (a system UCX, else the wheel's), and the runtime then reports the UCX it loaded:
    a version it runs on, the file, and the memory types UCX can move (host here: no GPU)."""
    code = (
        f"import json, sys; sys.path.insert(0, {os.path.dirname(HERE)!r})\n"
        "from test_shm_transport import load_native\n"
        "native = load_native()\n"
        "before = native.net_ucx_info()\n"
        "from jax_rccl import _ucx\n"
        "source = _ucx.load()\n"
        "print(json.dumps([before, source, native.net_ucx_info(True)]))\n"
    )
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    before, source, after = json.loads(out.stdout.splitlines()[-1])
    assert before["built"] and not before["loaded"], before
    assert source in ("system", "wheel"), source
    assert after["loaded"] and after["error"] == "", after
    assert tuple(int(x) for x in after["version"].split(".")[:2]) >= (1, 15), after
    assert "host" in after["memory_types"].split(", "), after
    assert os.path.isfile(after["path"]), after
    if source == "wheel":
        assert f"{os.sep}libucx{os.sep}lib{os.sep}" in after["path"], after


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))), flush=True)


# ---- the proxy's timeline (JAX_RCCL_NET_TRACE) ----


def _net_trace():
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), "benchmarks")
    )
    import net_trace

    return net_trace


def test_timeline_holds_every_step_at_both_ends_in_order(tmp_path):
    """With a trace folder, each process's proxy writes its timeline when it stops: every step of
    every connection, at the sending end seen, handed to the network and sent, at the receiving
    end with a receive posted before it landed, in that order; and benchmarks/net_trace.py pairs
    the two ends of every step."""
    from jax_rccl.planner import Task

    topo = _topology(4, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 18, "float32")], topo, protocol="simple")
    results = _run(topo, programs, [0, 0, 1, 1], trace_dir=str(tmp_path))
    _check(results, programs)
    planned = _planned(programs)
    nt = _net_trace()
    paths = sorted(tmp_path.glob("net-trace.*.txt"))
    assert len(paths) == 2, paths
    ends = 0
    for path in paths:
        t = nt.read(str(path))
        assert t.host, "the file names its machine"
        for idx, (channel, send, local, remote) in t.links.items():
            ev = t.events.get(idx, {})
            n = planned[(channel, local, remote) if send else (channel, remote, local)]
            kinds = (0, 1, 2) if send else (3, 4)
            for s in range(n):
                times = [ev.get((k, s)) for k in kinds]
                assert None not in times and times == sorted(times), (path, idx, s, times)
            assert {s for (k, s) in ev if k == kinds[-1]} == set(range(n)), (path, idx)
            if not send:  # a slot is freed after its step landed (the last ones may go unseen)
                assert all(ev[(4, s)] <= ns for (k, s), ns in ev.items() if k == 5)
            ends += 1
    assert ends == 2 * len(planned)
    st = nt.stages([nt.read(str(p)) for p in paths], skip=0)
    total = sum(planned.values())
    assert len(st["to network -> sent"]) == total and min(st["to network -> sent"]) >= 0
    assert len(st["sent -> landed"]) == total  # one machine: one clock
    assert len(st["receive posted -> landed"]) == total


def test_timeline_keeps_the_last_events(tmp_path):
    """A timeline of at most 20 events keeps the newest 20, oldest first (the ring unrolled), and
    says how many were recorded."""
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs([Task("all_gather", 1 << 16, "int8")], topo, protocol="simple")
    results = _run(topo, programs, [0, 1], trace_dir=str(tmp_path), trace_events=20)
    _check(results, programs)
    paths = sorted(tmp_path.glob("net-trace.*.txt"))
    assert len(paths) == 2, paths
    for path in paths:
        lines = path.read_text().splitlines()
        events = [ln.split() for ln in lines if ln and ln[0].isdigit()]
        times = [int(e[0]) for e in events]
        assert len(events) == 20 and "the last 20 kept" in lines[0], lines[0]
        assert times == sorted(times), "the kept events, oldest first"
        recorded = int(lines[0].split(" events")[0].rsplit(" ", 1)[1])
        assert recorded >= 40, lines[0]
        # The proxy's first round posts the first receives of its receiving connections among its
        # first events: long gone from the newest 20.
        assert not [e for e in events if e[2:] == ["3", "0"]], events


def test_open_file_limit_is_raised_to_the_hard_limit():
    """A process whose soft limit of open files is low (256) gets it raised to its hard limit (at
    most 2^20) when it makes the TCP network interface: a group across many hosts holds a
    socket per channel each way and rank of another host."""
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    want = (1 << 20) if hard == resource.RLIM_INFINITY else hard
    if want <= 256:
        pytest.skip(f"the hard limit of open files is {hard}")
    from jax_rccl.planner import Task

    topo = _topology(2, 2)
    programs = _plan_programs([Task("all_reduce", 1 << 12, "float32")], topo)
    results = _run(topo, programs, [0, 1], nofile_soft=256)
    _check(results, programs)
    for res in results:
        assert res["nofile"][0] == want, res["nofile"]
