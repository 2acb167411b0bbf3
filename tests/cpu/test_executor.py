"""The host executor (ffi/host/executor.cc) against numpy.

Every rank runs as a thread of this process through
`jax_rccl._jax_rccl_testing.run_plan_threads`, which plans the group per rank, runs the ranks
over one in-process host transport and returns every rank's outputs. Inputs are chosen so that
narrow-float results are exact (small integers) where the reduction order would otherwise
matter; float32/float64 compare with a tolerance.
"""

from __future__ import annotations

import functools
import time

import ml_dtypes
import numpy as np
import pytest

from jax_rccl import _jax_rccl_testing
from jax_rccl.planner import Topology

run_plan_threads = _jax_rccl_testing.run_plan_threads

DTYPES = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": ml_dtypes.bfloat16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "int32": np.int32,
    "int64": np.int64,
    "uint8": np.uint8,
    "int8": np.int8,
    "uint16": np.uint16,
    "int16": np.int16,
    "uint32": np.uint32,
    "uint64": np.uint64,
}
FLOATS = {"float32", "float64", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}
NARROW = {"float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


def topo(n: int, **kw) -> dict:
    kw.setdefault("ll128", True)
    return Topology(nranks=n, **kw).to_native()


def make_input(rng, dtype: str, op: str, count: int, n: int) -> np.ndarray:
    npt = DTYPES[dtype]
    if dtype in ("float32", "float64") and op in ("sum", "avg", "premul"):
        return rng.standard_normal(count).astype(npt)
    if op == "prod":
        vals = np.array([-1, 1, 2] if dtype[0] != "u" else [1, 2, 3])
        return rng.choice(vals, count).astype(npt)
    if dtype == "float8_e5m2":
        return rng.integers(-1, 2, count).astype(npt)
    if dtype in NARROW:
        return rng.integers(-2, 3, count).astype(npt)
    if dtype[0] == "u":
        return rng.integers(0, 200, count).astype(npt)
    return rng.integers(-100, 100, count).astype(npt)


UFUNCS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def reduce_ref(xs: list[np.ndarray], dtype: str, op: str, scalars=None) -> np.ndarray:
    n = len(xs)
    npt = DTYPES[dtype]
    if dtype in FLOATS:
        f = [x.astype(np.float64) for x in xs]
        if op in UFUNCS:
            return functools.reduce(UFUNCS[op], f)
        if op == "avg":
            return functools.reduce(np.add, f) / n
        if op == "premul":
            return functools.reduce(np.add, [x * s for x, s in zip(f, scalars, strict=True)])
        raise AssertionError(op)
    if op in ("sum", "prod"):
        return functools.reduce(UFUNCS[op], xs).astype(npt)
    if op in ("max", "min"):
        return functools.reduce(UFUNCS[op], xs)
    if op == "avg":
        s = functools.reduce(np.add, xs).astype(npt)
        return np.trunc(s.astype(np.float64) / n).astype(np.int64).astype(npt)
    if op == "premul":
        scaled = [x * npt(s) for x, s in zip(xs, scalars, strict=True)]
        return functools.reduce(np.add, scaled).astype(npt)
    raise AssertionError(op)


def check(got: np.ndarray, want: np.ndarray, dtype: str, op: str, what: str) -> None:
    if dtype in FLOATS:
        g = got.astype(np.float64)
        inexact = dtype in ("float32", "float64") or op in ("avg", "premul")
        if not inexact:
            np.testing.assert_array_equal(g, want, err_msg=what)
            return
        eps = {"float32": 1e-5, "float64": 1e-12, "float16": 4e-3, "bfloat16": 3e-2}.get(
            dtype, 0.25
        )
        np.testing.assert_allclose(g, want, rtol=eps * 4, atol=eps * 8, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def task(coll, count, dtype, op="sum", **kw):
    t = {"coll": coll, "count": count, "dtype": dtype, "op": "sum" if op == "premul" else op}
    t.update(kw)
    return t


def run(n, tasks, inputs, *, algo="", proto="", direct=False, timeout=20.0, **kw):
    t = kw.pop("topology", None) or topo(n)
    b = [[x.tobytes() for x in per] for per in inputs]
    outs, secs = run_plan_threads(
        t,
        tasks,
        b,
        timeout,
        algo,
        proto,
        kw.pop("persistent", True),
        kw.pop("in_place", False),
        direct,
        kw.pop("skip_ranks", []),
        kw.pop("repeat", 1),
    )
    return outs, secs


def out_array(b: bytes, dtype: str) -> np.ndarray:
    return np.frombuffer(b, dtype=DTYPES[dtype])


# (algorithm string, force direct, protocols)
ALGOS = [
    ("ring", False, ("ll", "ll128", "simple")),
    ("tree", False, ("ll", "ll128", "simple")),
    ("ring", True, ("simple",)),
]
ALGO_IDS = ["ring", "tree", "direct"]

ALL_DTYPES = ["float32", "bfloat16", "float16", "int32", "uint8", "float64", "int64"]
ALL_DTYPES += ["float8_e4m3fn", "float8_e5m2"]
OPS = ["sum", "prod", "min", "max", "avg", "premul"]


def reduce_group(n, count, rng, ops=OPS, dtypes=ALL_DTYPES):
    """All (dtype, op) pairs as one group of all_reduce tasks."""
    tasks, ins, refs, meta = [], [[] for _ in range(n)], [], []
    for dt in dtypes:
        for op in ops:
            if op == "premul" and dt == "uint8":
                continue
            scal = None
            extra = {}
            if op == "premul":
                scal = [float(1 + (r % 2)) for r in range(n)]  # exact in every type
                extra = {"premul": scal, "premul_residence": "device" if n % 2 else "host"}
            xs = [make_input(rng, dt, op, count, n) for _ in range(n)]
            tasks.append(task("all_reduce", count, dt, op, **extra))
            for r in range(n):
                ins[r].append(xs[r])
            refs.append(reduce_ref(xs, dt, op, scal))
            meta.append((dt, op))
    return tasks, ins, refs, meta


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("algo", ALGOS, ids=ALGO_IDS)
def test_all_reduce_types_ops(algo, n):
    name, direct, protos = algo
    rng = np.random.default_rng(n)
    for proto in protos:
        for count in (1, 1001):
            tasks, ins, refs, meta = reduce_group(n, count, rng)
            outs, _ = run(n, tasks, ins, algo=name, proto=proto, direct=direct)
            for r in range(n):
                for i, (dt, op) in enumerate(meta):
                    got = out_array(outs[r][i], dt)
                    check(got, refs[i], dt, op, f"{name} {proto} n={n} {dt} {op} rank {r}")


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("algo", ALGOS, ids=ALGO_IDS)
def test_all_reduce_large_in_place(algo, n):
    name, direct, protos = algo
    rng = np.random.default_rng(7)
    count = 1000003
    for proto in protos[-1:]:
        xs = [rng.standard_normal(count).astype(np.float32) for _ in range(n)]
        ys = [rng.integers(-9, 9, count).astype(np.int32) for _ in range(n)]
        tasks = [task("all_reduce", count, "float32"), task("all_reduce", count, "int32", "max")]
        for in_place in (False, True):
            outs, _ = run(
                n,
                tasks,
                [[x, y] for x, y in zip(xs, ys, strict=True)],
                algo=name,
                proto=proto,
                direct=direct,
                in_place=in_place,
            )
            for r in range(n):
                check(
                    out_array(outs[r][0], "float32"),
                    sum(x.astype(np.float64) for x in xs),
                    "float32",
                    "sum",
                    f"{name} in_place={in_place} rank {r}",
                )
                np.testing.assert_array_equal(
                    out_array(outs[r][1], "int32"), functools.reduce(np.maximum, ys)
                )


@pytest.mark.parametrize("direct", [False, True], ids=["ring", "direct"])
def test_all_reduce_4m(direct):
    n, count = 8, 4 << 20
    rng = np.random.default_rng(3)
    xs = [rng.integers(-4, 4, count).astype(np.float32) for _ in range(n)]
    outs, _ = run(
        n,
        [task("all_reduce", count, "float32")],
        [[x] for x in xs],
        algo="ring",
        direct=direct,
        in_place=True,
    )
    want = sum(xs)
    for r in range(n):
        np.testing.assert_array_equal(out_array(outs[r][0], "float32"), want)


def data_colls(n, count, dtype, rng, root):
    """One group: all_gather, reduce_scatter, broadcast and reduce of `dtype`."""
    tasks = [
        task("all_gather", count, dtype),
        task("reduce_scatter", count, dtype),
        task("broadcast", count, dtype, root=root),
        task("reduce", count, dtype, root=root),
    ]
    ag = [make_input(rng, dtype, "sum", count, n) for _ in range(n)]
    rs = [make_input(rng, dtype, "sum", n * count, n) for _ in range(n)]
    bc = [make_input(rng, dtype, "sum", count, n) for _ in range(n)]
    rd = [make_input(rng, dtype, "sum", count, n) for _ in range(n)]
    ins = [[ag[r], rs[r], bc[r], rd[r]] for r in range(n)]
    rs_ref = reduce_ref(rs, dtype, "sum")
    refs = []
    for r in range(n):
        refs.append(
            [
                np.concatenate(ag),
                rs_ref[r * count : (r + 1) * count],
                bc[root],
                reduce_ref(rd, dtype, "sum") if r == root else None,
            ]
        )
    return tasks, ins, refs


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("direct", [False, True], ids=["ring", "direct"])
def test_gather_scatter_broadcast_reduce(direct, n):
    rng = np.random.default_rng(11)
    protos = ("simple",) if direct else ("ll", "ll128", "simple")
    for proto in protos:
        for dtype in ("float32", "bfloat16", "int64", "uint8", "float8_e4m3fn"):
            for count in (1, 333, 100001):
                if count == 100001 and dtype not in ("float32", "uint8"):
                    continue
                root = (count + n - 1) % n
                tasks, ins, refs = data_colls(n, count, dtype, rng, root)
                for in_place in (False, True):
                    outs, _ = run(
                        n, tasks, ins, algo="ring", proto=proto, direct=direct, in_place=in_place
                    )
                    for r in range(n):
                        for i, want in enumerate(refs[r]):
                            if want is None:
                                continue
                            what = f"{tasks[i]['coll']} {proto} {dtype} n={n} c={count} r={r}"
                            check(out_array(outs[r][i], dtype), want, dtype, "sum", what)


def test_reduce_scatter_ops_and_avg():
    n, count = 3, 517
    rng = np.random.default_rng(5)
    for dt, op in [
        ("int32", "avg"),
        ("float16", "max"),
        ("int8", "min"),
        ("uint16", "prod"),
        ("float32", "premul"),
        ("uint32", "avg"),
        ("uint64", "sum"),
        ("int16", "max"),
    ]:
        for direct in (False, True):
            xs = [make_input(rng, dt, op, n * count, n) for _ in range(n)]
            scal = [0.5, 2.0, 4.0] if op == "premul" else None
            extra = {"premul": scal} if scal else {}
            outs, _ = run(
                n,
                [task("reduce_scatter", count, dt, op, **extra)],
                [[x] for x in xs],
                algo="ring",
                direct=direct,
            )
            want = reduce_ref(xs, dt, op, scal)
            for r in range(n):
                check(
                    out_array(outs[r][0], dt),
                    want[r * count : (r + 1) * count],
                    dt,
                    op,
                    f"{dt} {op} direct={direct} r={r}",
                )


def test_one_rank():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(100).astype(np.float32)
    tasks = [
        task("all_reduce", 100, "float32", "avg"),
        task("all_gather", 100, "float32"),
        task("all_reduce", 100, "float32", "premul", premul=[3.0]),
        task("reduce_scatter", 100, "int32", "avg"),
    ]
    xi = rng.integers(-50, 50, 100).astype(np.int32)
    outs, _ = run(1, tasks, [[x, x, x, xi]])
    np.testing.assert_array_equal(out_array(outs[0][0], "float32"), x)
    np.testing.assert_array_equal(out_array(outs[0][1], "float32"), x)
    np.testing.assert_allclose(out_array(outs[0][2], "float32"), 3 * x, rtol=1e-6)
    np.testing.assert_array_equal(out_array(outs[0][3], "int32"), xi)


# ---- point to point ----


def run_p2p(n, plan_of, count, dtype="float32", seed=0, **kw):
    """plan_of(r) -> list of ("send", peer) / ("recv", peer) for rank r, in issue order.

    Rank r sends data[(r, peer)]; returns {(r, "recv", peer, k): array} of what r received.
    """
    rng = np.random.default_rng(seed)
    per_rank, inputs, data = [], [], {}
    for r in range(n):
        ts, ins = [], []
        for kind, peer in plan_of(r):
            ts.append(task(kind, count, dtype, peer=peer))
            if kind == "send":
                x = make_input(rng, dtype, "sum", count, n)
                data[(r, peer)] = x
                ins.append(x.tobytes())
            else:
                ins.append(b"")
        per_rank.append(ts)
        inputs.append(ins)
    outs, _ = run_plan_threads(
        kw.pop("topology", None) or topo(n),
        per_rank,
        inputs,
        kw.pop("timeout", 20.0),
        "",
        kw.pop("proto", ""),
        kw.pop("persistent", True),
        False,
        False,
        [],
        1,
    )
    for r in range(n):
        for i, (kind, peer) in enumerate(plan_of(r)):
            if kind == "recv":
                got = out_array(outs[r][i], dtype)
                np.testing.assert_array_equal(got, data[(peer, r)], err_msg=f"{peer}->{r}")


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("count", [0, 1, 1001, 600000])
def test_p2p_ring_shift(n, count):
    # Everyone sends to r+1 and receives from r-1 at once; 600000 floats exceed the FIFO, so the
    # send and the recv of one work must progress together.
    run_p2p(n, lambda r: [("send", (r + 1) % n), ("recv", (r - 1) % n)], count, seed=count)


@pytest.mark.parametrize("n", [3, 8])
def test_p2p_all_to_all_and_self(n):
    def plan_of(r):
        ops = []
        for p in range(n):
            ops += [("send", p), ("recv", p)]
        return ops

    for count in (0, 5, 70001):
        run_p2p(n, plan_of, count, dtype="int32", seed=count)


def test_p2p_self_only_and_protocols():
    for proto in ("ll", "simple", ""):
        run_p2p(2, lambda r: [("send", r), ("recv", r)], 3000, proto=proto)
    # A reversed issue order (recv before send) on one side.
    run_p2p(
        2,
        lambda r: (
            [("send", 1 - r), ("recv", 1 - r)] if r == 0 else [("recv", 1 - r), ("send", 1 - r)]
        ),
        200000,
    )


def test_non_persistent_multi_kernel():
    # A small work FIFO cuts the group into several kernel plans.
    n = 4
    t = topo(n, work_fifo_depth=256, nchannels=4)
    rng = np.random.default_rng(2)
    tasks = [task("all_reduce", 4099 * (k + 1), "float32") for k in range(40)]
    xs = [
        [rng.integers(-3, 3, 4099 * (k + 1)).astype(np.float32) for k in range(40)]
        for _ in range(n)
    ]
    outs, _ = run(n, tasks, xs, topology=t, persistent=False, algo="ring")
    for r in range(n):
        for k in range(40):
            np.testing.assert_array_equal(
                out_array(outs[r][k], "float32"), sum(xs[q][k] for q in range(n))
            )
    # p2p, non-persistent: every rank sends to every other rank.
    run_p2p(
        n,
        lambda r: [op for p in range(n) for op in (("send", p), ("recv", p))],
        10000,
        topology=t,
        persistent=False,
    )


@pytest.mark.parametrize("direct", [False, True], ids=["ring", "direct"])
def test_timeout_when_a_rank_never_runs(direct):
    n = 4
    xs = [np.ones(100000, np.float32) for _ in range(n)]
    start = time.monotonic()
    with pytest.raises(TimeoutError) as err:
        run_plan_threads(
            topo(n),
            [task("all_reduce", 100000, "float32")],
            [[x.tobytes()] for x in xs],
            0.5,
            "ring",
            "",
            True,
            False,
            direct,
            [2],
            1,
        )
    assert time.monotonic() - start < 2.5
    msg = str(err.value)
    assert "run_plan_threads" in msg or "barrier" in msg
    if not direct:
        assert "rank" in msg and "channel" in msg


def test_repeated_executions_reuse_fifos():
    n = 3
    rng = np.random.default_rng(9)
    xs = [rng.integers(-5, 5, 300001).astype(np.float32) for _ in range(n)]
    outs, secs = run(
        n, [task("all_reduce", 300001, "float32")], [[x] for x in xs], algo="ring", repeat=3
    )
    assert secs > 0
    for r in range(n):
        np.testing.assert_array_equal(out_array(outs[r][0], "float32"), sum(xs))


# ---- the shared conversions (ffi/compute/dtypes.h) against ml_dtypes ----


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_narrow_float_rounding_matches_ml_dtypes(dtype):
    # A one-rank premul by 1 goes through float and back: every bit pattern of the type must
    # survive (NaNs stay NaN), and a premul by an exact power of two must round like ml_dtypes.
    npt = DTYPES[dtype]
    bits = np.uint16 if np.dtype(npt).itemsize == 2 else np.uint8
    allv = np.arange(np.iinfo(bits).max + 1, dtype=np.int64).astype(bits).view(npt)
    for scale in (1.0, 0.5, 0.25, 3.0):
        outs, _ = run(1, [task("all_reduce", allv.size, dtype, "premul", premul=[scale])], [[allv]])
        got = out_array(outs[0][0], dtype)
        with np.errstate(all="ignore"):
            want = (allv.astype(np.float32) * np.float32(np.asarray(scale).astype(npt))).astype(npt)
        gnan, wnan = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(gnan, wnan)
        np.testing.assert_array_equal(
            got.view(bits)[~gnan], want.view(bits)[~wnan], err_msg=f"{dtype} x{scale}"
        )
