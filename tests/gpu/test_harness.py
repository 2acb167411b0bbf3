"""The device kernels through the one-GPU multi-rank harness, against numpy.

Every collective x algorithm x protocol x dtype at 2, 4 and 8 ranks on one GPU. Inputs are small
integers (-1, 0, 1; unsigned 0, 1), so every partial result is exact in every element type and the
results must match bit for bit. Programs of the subprocesses: worker_first_launch_gpu.py,
worker_one_queue_gpu.py.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from gpu_launch import run_worker
from worker_one_queue_gpu import mixed_tasks

from jax_rccl import harness

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not harness.available(), reason="needs a GPU build and a GPU"),
]

DTYPES = [
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e5m2",
]
RANKS = [2, 4, 8]
PROTOS = ["LL", "Simple"]
COUNTS = [0, 1, 7, 1001, 65536 + 5, (1 << 20) + 3]
QUICK = os.environ.get("JAX_RCCL_TEST_QUICK") == "1"


def has(dtype):
    from jax_rccl import _jax_rccl

    return _jax_rccl.gpu.has_dtype(dtype)


@functools.cache
def get_harness(n):
    return harness.Harness(n, timeout=20.0)


def inputs_for(dtype, nranks, count, seed=0):
    rng = np.random.default_rng(seed + 7 * nranks + count)
    np_dt = harness._np_dtype(dtype)
    lo = 0 if dtype.startswith("uint") else -1
    return [rng.integers(lo, 2, size=count).astype(np_dt) for _ in range(nranks)]


def reduce_ref(xs, op, dtype):
    np_dt = harness._np_dtype(dtype)
    wide = [x.astype(np.float64) for x in xs]
    if op == "sum":
        r = functools.reduce(np.add, wide)
    elif op == "prod":
        r = functools.reduce(np.multiply, wide)
    elif op == "max":
        r = functools.reduce(np.maximum, wide)
    elif op == "min":
        r = functools.reduce(np.minimum, wide)
    else:
        raise AssertionError(op)
    return r.astype(np_dt)


def same(a, b):
    assert a.dtype == b.dtype
    assert a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("algo", ["Ring", "Tree"])
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_sum(nranks, algo, proto, dtype):
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    for count in COUNTS[:4] if QUICK else COUNTS:
        xs = inputs_for(dtype, nranks, count)
        task = {"coll": "all_reduce", "count": count, "dtype": dtype, "op": "sum"}
        outs = h.run([task], [[x] for x in xs], algorithm=algo, protocol=proto)
        want = reduce_ref(xs, "sum", dtype)
        for r in range(nranks):
            same(outs[r][0], want)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("op", ["prod", "max", "min"])
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", ["int32", "uint8", "float32", "bfloat16", "float16", "int64"])
def test_all_reduce_ops(nranks, op, proto, dtype):
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    for count in (1, 1001, 300000):
        xs = inputs_for(dtype, nranks, count, seed=1)
        task = {"coll": "all_reduce", "count": count, "dtype": dtype, "op": op}
        outs = h.run([task], [[x] for x in xs], algorithm="Ring", protocol=proto)
        want = reduce_ref(xs, op, dtype)
        for r in range(nranks):
            same(outs[r][0], want)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("proto", PROTOS)
def test_all_reduce_avg(nranks, proto):
    h = get_harness(nranks)
    count = 4099
    xs = [np.full(count, float(r + 1), np.float32) for r in range(nranks)]
    task = {"coll": "all_reduce", "count": count, "dtype": "float32", "op": "avg"}
    outs = h.run([task], [[x] for x in xs], protocol=proto)
    for r in range(nranks):
        np.testing.assert_allclose(outs[r][0], (nranks + 1) / 2.0, rtol=1e-6)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "float32", "uint8"])
def test_all_gather(nranks, proto, dtype):
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    for count in COUNTS:
        xs = inputs_for(dtype, nranks, count, seed=2)
        task = {"coll": "all_gather", "count": count, "dtype": dtype}
        outs = h.run([task], [[x] for x in xs], protocol=proto)
        want = np.concatenate(xs)
        for r in range(nranks):
            same(outs[r][0], want)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "float32", "float8_e4m3fn", "int8"])
def test_reduce_scatter(nranks, proto, dtype):
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    for count in COUNTS:
        xs = inputs_for(dtype, nranks, count * nranks, seed=3)
        task = {"coll": "reduce_scatter", "count": count, "dtype": dtype, "op": "sum"}
        outs = h.run([task], [[x] for x in xs], protocol=proto)
        full = reduce_ref(xs, "sum", dtype)
        for r in range(nranks):
            same(outs[r][0], full[r * count : (r + 1) * count])


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("proto", PROTOS)
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_and_reduce(nranks, proto, root):
    h = get_harness(nranks)
    for count in (0, 1, 1001, (1 << 20) + 3):
        xs = inputs_for("float32", nranks, count, seed=4)
        b = {"coll": "broadcast", "count": count, "dtype": "float32", "root": root}
        outs = h.run([b], [[x] for x in xs], protocol=proto)
        for r in range(nranks):
            same(outs[r][0], xs[root])
        red = {"coll": "reduce", "count": count, "dtype": "float32", "op": "sum", "root": root}
        outs = h.run([red], [[x] for x in xs], protocol=proto)
        same(outs[root][0], reduce_ref(xs, "sum", "float32"))


@functools.cache
def get_ll128_harness(n):
    return harness.Harness(n, harness.gpu_topology(n, ll128=True), timeout=20.0)


def needs_ll128():
    if not harness.has_ll128():
        pytest.skip("this build's device code has no LL128 (AMD builds)")


def run_ll128(h, task, xs, algorithm=""):
    """Runs `task` forced onto LL128, after checking the planner really chose it."""
    plan = h.build([task], algorithm=algorithm, protocol="LL128")
    if task["count"] > 0:
        assert plan[0]["protocol"].lower() == "ll128", plan
    return h.run([task], [[x] for x in xs], algorithm=algorithm, protocol="LL128")


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("algo", ["Ring", "Tree"])
@pytest.mark.parametrize(
    "dtype", ["int8", "uint16", "int32", "int64", "bfloat16", "float32", "float64"]
)
def test_ll128_all_reduce(nranks, algo, dtype):
    """LL128 lines: 15 data words and a flag word each, eight lanes a line; odd sizes end inside a
    line and inside a word."""
    needs_ll128()
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_ll128_harness(nranks)
    for count in COUNTS[:4] if QUICK else COUNTS:
        xs = inputs_for(dtype, nranks, count, seed=11)
        task = {"coll": "all_reduce", "count": count, "dtype": dtype, "op": "sum"}
        outs = run_ll128(h, task, xs, algorithm=algo)
        want = reduce_ref(xs, "sum", dtype)
        for r in range(nranks):
            same(outs[r][0], want)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("dtype", ["int8", "bfloat16", "float32"])
def test_ll128_gather_scatter_broadcast_reduce(nranks, dtype):
    needs_ll128()
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_ll128_harness(nranks)
    for count in (0, 1, 7, 1001, 65536 + 5):
        xs = inputs_for(dtype, nranks, count, seed=12)
        outs = run_ll128(h, {"coll": "all_gather", "count": count, "dtype": dtype}, xs)
        for r in range(nranks):
            same(outs[r][0], np.concatenate(xs))
        ys = inputs_for(dtype, nranks, count * nranks, seed=13)
        rs = {"coll": "reduce_scatter", "count": count, "dtype": dtype, "op": "sum"}
        outs = run_ll128(h, rs, ys)
        full = reduce_ref(ys, "sum", dtype)
        for r in range(nranks):
            same(outs[r][0], full[r * count : (r + 1) * count])
        root = 1
        outs = run_ll128(h, {"coll": "broadcast", "count": count, "dtype": dtype, "root": root}, xs)
        for r in range(nranks):
            same(outs[r][0], xs[root])
        red = {"coll": "reduce", "count": count, "dtype": dtype, "op": "max", "root": root}
        outs = run_ll128(h, red, xs)
        same(outs[root][0], reduce_ref(xs, "max", dtype))


@pytest.mark.parametrize("nranks", [2, 8])
def test_protocols_take_turns_on_the_same_connections(nranks):
    """LL, LL128 and Simple share each connection's counters: alternating them, launch after
    launch (and LL128 many times over its 8 slots), every result stays right."""
    needs_ll128()
    h = get_ll128_harness(nranks)
    xs = inputs_for("float32", nranks, 300001, seed=14)
    want = reduce_ref(xs, "sum", "float32")
    task = {"coll": "all_reduce", "count": 300001, "dtype": "float32", "op": "sum"}
    for proto in ("LL", "LL128", "Simple", "LL128", "LL", "LL128"):
        outs = h.run([task], [[x] for x in xs], algorithm="Ring", protocol=proto, repeat=3)
        for r in range(nranks):
            same(outs[r][0], want)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("shift", [1, -1, 0])
@pytest.mark.parametrize("count", [0, 5, 3000, 1 << 20])
def test_ppermute_shift(nranks, shift, count):
    """Each rank sends to rank + shift and receives from rank - shift (shift 0: to itself)."""
    h = get_harness(nranks)
    tasks = []
    for r in range(nranks):
        tasks.append(
            [
                {"coll": "send", "count": count, "dtype": "int32", "peer": (r + shift) % nranks},
                {"coll": "recv", "count": count, "dtype": "int32", "peer": (r - shift) % nranks},
            ]
        )
    xs = [np.arange(count, dtype=np.int32) * (r + 3) for r in range(nranks)]
    outs = h.run(tasks, [[x, np.zeros(0, np.int32)] for x in xs])
    for r in range(nranks):
        same(outs[r][1], xs[(r - shift) % nranks])


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("count", [1, 1000, 70000])
def test_all_to_all(nranks, count):
    """all_to_all as sends and receives with every rank (as the runtime lowers it)."""
    h = get_harness(nranks)
    tasks = []
    for _r in range(nranks):
        row = []
        for p in range(nranks):
            row.append({"coll": "send", "count": count, "dtype": "float32", "peer": p})
        for p in range(nranks):
            row.append({"coll": "recv", "count": count, "dtype": "float32", "peer": p})
        tasks.append(row)
    xs = [[np.full(count, 100 * r + p, np.float32) for p in range(nranks)] for r in range(nranks)]
    ins = [xs[r] + [np.zeros(0, np.float32)] * nranks for r in range(nranks)]
    outs = h.run(tasks, ins)
    for r in range(nranks):
        for p in range(nranks):
            same(outs[r][nranks + p], xs[p][r])


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("algo", ["", "Ring", "Direct"])
def test_grouped_mixed_dtypes(nranks, algo):
    """One launch of several tasks of different types (one kernel per type, in order)."""
    h = get_harness(nranks)
    tasks = mixed_tasks()
    ins = [
        inputs_for("float32", nranks, 1000, 5),
        inputs_for("int32", nranks, 77, 6),
        inputs_for("bfloat16", nranks, 33, 7),
        inputs_for("bfloat16", nranks, 5000, 8),
    ]
    outs = h.run(tasks, [[ins[t][r] for t in range(4)] for r in range(nranks)], algorithm=algo)
    for r in range(nranks):
        same(outs[r][0], reduce_ref(ins[0], "sum", "float32"))
        same(outs[r][1], reduce_ref(ins[1], "max", "int32"))
        same(outs[r][2], np.concatenate(ins[2]))
        same(outs[r][3], reduce_ref(ins[3], "sum", "bfloat16"))


def test_many_tasks_slot_table():
    """More tasks than fit in the kernel's arguments: the slot table path."""
    nranks = 2
    h = get_harness(nranks)
    tasks = [{"coll": "all_reduce", "count": 10 + i, "dtype": "float32"} for i in range(40)]
    ins = [[np.full(10 + i, float(r + i), np.float32) for i in range(40)] for r in range(nranks)]
    outs = h.run(tasks, ins)
    for i in range(40):
        np.testing.assert_array_equal(outs[0][i], np.full(10 + i, float(2 * i + 1), np.float32))


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("algo", ["Ring", "Direct"])
def test_repeated_launches_keep_fifo_state(nranks, algo):
    """The connection counters persist across launches: 50 launches in a row stay right."""
    h = get_harness(nranks)
    xs = inputs_for("float32", nranks, 70001, 9)
    task = {"coll": "all_reduce", "count": 70001, "dtype": "float32"}
    outs = h.run([task], [[x] for x in xs], algorithm=algo, protocol="Simple", repeat=50)
    same(outs[1][0], reduce_ref(xs, "sum", "float32"))


@pytest.mark.slow
@pytest.mark.skipif(QUICK, reason="large sizes skipped in quick runs")
def test_all_reduce_1gb():
    nranks = 2
    h = get_harness(nranks)
    count = (1 << 30) // 4
    xs = [np.full(count, r + 1, np.int32) for r in range(nranks)]
    xs[0][::4097] = 7
    task = {"coll": "all_reduce", "count": count, "dtype": "int32"}
    outs = h.run([task], [[x] for x in xs])
    same(outs[0][0], xs[0] + xs[1])
    same(outs[1][0], xs[0] + xs[1])


def test_timeout_names_the_peer():
    """A rank that never launches: the others fail with a timeout naming it, never hang."""
    nranks = 2
    h = harness.Harness(nranks, timeout=0.5)
    task = {"coll": "all_reduce", "count": 1024, "dtype": "float32"}
    h.build([task])
    slots = h.buffers()
    h._h.launch_ranks(slots, [0])
    with pytest.raises(TimeoutError, match="rank 1"):
        h.sync()


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize(
    "coll", ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"]
)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "float64"])
def test_direct(nranks, coll, dtype):
    """Direct (peers' buffers read and written in place) for every collective it runs, against
    numpy."""
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    # 1 and 77: the one-hop path (a thread per rank and word); 1001: its words one by one at 2
    # ranks; (1 << 20) + 3: the barriers, whole groups of packs, single packs and an odd tail.
    for count in (1, 77, 1001, (1 << 20) + 3):
        nin = count * nranks if coll == "reduce_scatter" else count
        xs = inputs_for(dtype, nranks, nin, seed=11)
        task = {"coll": coll, "count": count, "dtype": dtype, "op": "sum", "root": 1}
        outs = h.run([task], [[x] for x in xs], algorithm="Direct", protocol="Simple")
        summary = h.build([task], algorithm="Direct", protocol="Simple")[0]
        assert summary["algorithm"] == "direct"
        full = reduce_ref(xs, "sum", dtype)
        for r in range(nranks):
            if coll == "all_reduce":
                same(outs[r][0], full)
            elif coll == "reduce_scatter":
                same(outs[r][0], full[r * count : (r + 1) * count])
            elif coll == "all_gather":
                same(outs[r][0], np.concatenate(xs))
            elif coll == "broadcast":
                same(outs[r][0], xs[1])
        if coll == "reduce":
            same(outs[1][0], full)


@pytest.mark.parametrize("nranks", [2, 8])
@pytest.mark.parametrize("count", [5, 300001])
def test_direct_avg_and_repeat(nranks, count):
    """PreMulSum through Direct (each rank's own scalar), 20 launches in a row; 5 elements take
    the one-hop path (each contribution scaled by its sender), 300001 the barriers."""
    h = get_harness(nranks)
    xs = [np.full(count, float(r + 1), np.float32) for r in range(nranks)]
    task = {"coll": "all_reduce", "count": count, "dtype": "float32", "op": "avg"}
    outs = h.run([task], [[x] for x in xs], algorithm="Direct", repeat=20)
    for r in range(nranks):
        np.testing.assert_allclose(outs[r][0], (nranks + 1) / 2.0, rtol=1e-6)


@pytest.mark.parametrize("nranks", RANKS)
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", ["int32", "float32", "bfloat16"])
def test_direct_one_hop_all_reduce(nranks, op, dtype):
    """The one-hop all_reduce (a thread per rank and 8-byte word): every op, 1 and 3 elements
    (a part word) and as many as fill the block's 512 threads exactly, three launches in a row
    with new inputs (a line of the launch before must not pass for this one's). float32 inputs
    are random, so a sum or product in another order than the ranks' would round differently:
    every rank's result has the bits of the rank-order reduction."""
    if not has(dtype):
        pytest.skip(f"{dtype} not in this device build")
    h = get_harness(nranks)
    np_dt = harness._np_dtype(dtype)
    fn = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}[op]
    full = (512 // nranks) * (8 // np.dtype(np_dt).itemsize)
    for count in (1, 3, full):
        task = {"coll": "all_reduce", "count": count, "dtype": dtype, "op": op}
        assert h.build([task], algorithm="Direct")[0]["algorithm"] == "direct"
        for launch in range(3):
            if dtype == "float32":
                rng = np.random.default_rng(100 * launch + count + nranks)
                xs = [rng.standard_normal(count).astype(np.float32) for _ in range(nranks)]
                want = xs[0].copy()
                for x in xs[1:]:
                    want = fn(want, x)
            else:
                xs = inputs_for(dtype, nranks, count, seed=100 * launch)
                want = reduce_ref(xs, op, dtype)
            outs = h.run([task], [[x] for x in xs], algorithm="Direct")
            for r in range(nranks):
                same(outs[r][0], want)


def test_first_launch_of_a_process_loads_every_kernel():
    """A process's first launch using kernels of several classes: their kernels are loaded and
    the device's stack limit raised at upload, before any rank launches (a launch needing more
    local memory than the device holds waits for every running kernel, among them a rank's
    kernel spinning on a peer not launched yet: a hang until the timeout)."""
    done = run_worker("worker_first_launch_gpu.py", timeout=120)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr


def test_launches_of_several_types_with_one_hardware_queue():
    """The ranks' streams sharing one hardware work queue (CUDA_DEVICE_MAX_CONNECTIONS=1; under
    MPS a client may get fewer queues than streams): a plan of one kernel per element type is
    launched launch-major across the ranks, so no rank's second kernel waits in the queue ahead
    of a peer's first (which it would wait for forever)."""
    env = dict(os.environ, CUDA_DEVICE_MAX_CONNECTIONS="1")
    done = run_worker("worker_one_queue_gpu.py", timeout=180, env=env)
    assert done.returncode == 0 and "OK" in done.stdout, done.stdout + done.stderr[-4000:]


@pytest.mark.parametrize("proto", ["LL", "Simple"])
def test_trace_records_every_piece(proto):
    """A launch's device timeline: each block starts, loads its work, begins its element, walks
    its pieces (begin, ready, moved, posted, in that order and in time order) and ends."""
    nranks = 2
    h = get_harness(nranks)
    task = {"coll": "all_reduce", "count": 2, "dtype": "float32"}
    h.build([task], algorithm="Ring", protocol=proto)
    slots = h.buffers()
    h.time_launches(slots, warmup=3, iters=1)
    timeline = h.trace(slots)
    assert len(timeline) == nranks
    for blocks in timeline:
        names = [e for e, _ in blocks[0]]
        times = [t for _, t in blocks[0]]
        assert names[:3] == ["start", "work", "elem"] and names[-1] == "end", names
        pieces = names[3:-1]
        # ring all_reduce on 2 ranks: send, recv-reduce-send, recv: 3 pieces of 4 events
        assert pieces == ["piece", "ready", "moved", "posted"] * 3, names
        assert times == sorted(times), blocks[0]
        assert min(times) >= 0.0
    h.free()


@pytest.mark.parametrize("nranks", [2, 8])
def test_trace_of_direct_shows_its_barriers(nranks):
    """Direct's element: begin (piece), every peer published (ready), data moved, every peer
    done (posted), on every rank."""
    h = get_harness(nranks)
    task = {"coll": "all_reduce", "count": 2, "dtype": "float32"}
    h.build([task], algorithm="Direct")
    slots = h.buffers()
    h.time_launches(slots, warmup=3, iters=1)
    timeline = h.trace(slots)
    for blocks in timeline:
        names = [e for e, _ in blocks[0]]
        assert names == ["start", "work", "elem", "piece", "ready", "moved", "posted", "end"]
    h.free()


def test_trace_refuses_plans_of_several_launches():
    h = harness.Harness(2, timeout=20.0)
    tasks = [
        {"coll": "all_reduce", "count": 8, "dtype": "float32"},
        {"coll": "all_reduce", "count": 8, "dtype": "int32"},
    ]
    h.build(tasks)
    with pytest.raises(ValueError, match="one kernel launch"):
        h.trace(h.buffers())
    h.free()


def test_device_capacity():
    """What the device holds of the collective kernels at once (an H200: 132 x 1, the kernels'
    128 registers x 512 threads fill a multiprocessor's register file)."""
    from jax_rccl import _jax_rccl

    c = _jax_rccl.gpu.device_capacity()
    assert c["sm_count"] >= 1 and c["blocks_per_sm"] >= 1, c
    assert c["resident_blocks"] == c["sm_count"] * c["blocks_per_sm"], c
    assert c["max_threads"] == 512, c


def test_ranks_beyond_what_the_device_holds_get_fewer_channels():
    """Ranks sharing the GPU whose topology asks for more blocks than it holds at once (8 ranks x
    32 channels on an H200 of 132) plan with what it holds per rank; an all_reduce
    and an all_to_all of 16 MB per rank come out right."""
    from jax_rccl import _jax_rccl

    nranks = 8
    resident = _jax_rccl.gpu.device_capacity()["resident_blocks"]
    if nranks * 32 <= resident:
        pytest.skip(f"the device holds {resident} blocks: {nranks} x 32 fit")
    topo = harness.gpu_topology(nranks, nchannels=32, direct=False)
    h = harness.Harness(nranks, topo, timeout=20.0)
    count = 1 << 22
    rng = np.random.default_rng(5)
    xs = [rng.integers(-6, 7, size=count).astype(np.int32) for _ in range(nranks)]
    tot = np.sum(xs, axis=0).astype(np.int32)
    task = {"coll": "all_reduce", "count": count, "dtype": "int32", "op": "sum"}
    summary = h.build([task], algorithm="Ring", protocol="Simple")
    assert 1 <= summary[0]["nchannels"] <= resident // nranks, summary
    outs = h.run([task], [[x] for x in xs], algorithm="Ring", protocol="Simple", repeat=2)
    for r in range(nranks):
        same(outs[r][0], tot)
    b = count // nranks
    p2p = [
        [{"coll": "send", "count": b, "dtype": "int32", "peer": p} for p in range(nranks)]
        + [{"coll": "recv", "count": b, "dtype": "int32", "peer": p} for p in range(nranks)]
        for _ in range(nranks)
    ]
    ins = [
        [x[p * b : (p + 1) * b] for p in range(nranks)] + [np.zeros(0, np.int32)] * nranks
        for x in xs
    ]
    outs = h.run(p2p, ins)
    for r in range(nranks):
        for p in range(nranks):
            same(outs[r][nranks + p], xs[p][r * b : (r + 1) * b])
