"""The CPU runtime's FFI targets called directly (jax.ffi.ffi_call in jit(shard_map)).

Eight virtual CPU devices (tests/jax/conftest.py). Each test builds its replica groups from the
mesh's physical device ids, runs one target and compares with numpy.
"""

from __future__ import annotations

import itertools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from jax_rccl import _ffi

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    _ffi.ensure_registered()


def cpu_devices():
    return jax.devices("cpu")[:8]


def mesh_1d(reverse=False):
    devs = cpu_devices()
    if reverse:
        devs = devs[::-1]
    return Mesh(np.array(devs), ("x",))


def mesh_2x4():
    return Mesh(np.array(cpu_devices()).reshape(2, 4), ("a", "b"))


def groups_for(mesh, axis):
    """Replica groups of physical device ids for a collective over `axis` (rank = axis index)."""
    devs = np.asarray(mesh.devices)
    ax = mesh.axis_names.index(axis)
    moved = np.moveaxis(devs, ax, -1).reshape(-1, devs.shape[ax])
    return [[int(d.id) for d in g] for g in moved]


_CALL_SITES = itertools.count(1)


def attrs_for(groups, **kw):
    flat = np.array([d for g in groups for d in g], dtype=np.int64)
    return dict(
        replica_groups=flat,
        group_size=np.int64(len(groups[0])),
        op=np.int32(kw.get("op", 0)),
        premul=np.int32(kw.get("premul", 0)),
        premul_value=np.float64(kw.get("premul_value", 1.0)),
        root=np.int64(kw.get("root", 0)),
        perm=np.array(kw.get("perm", []), dtype=np.int64).reshape(-1),
        algorithm=kw.get("algorithm", ""),
        protocol=kw.get("protocol", ""),
        call_site=np.int64(next(_CALL_SITES)),
        name=kw.get("name", "test"),
    )


def make_fn(target, mesh, axis, in_lens, out_lens, dtypes, *, groups=None, extra_dtypes=(), **kw):
    """A jitted function of per-device arrays [ndev, L] (rows in mesh order) running `target`."""
    groups = groups if groups is not None else groups_for(mesh, axis)
    attrs = attrs_for(groups, **kw)
    spec = P(tuple(mesh.axis_names))
    out_types = [jax.ShapeDtypeStruct((n,), dt) for n, dt in zip(out_lens, dtypes, strict=True)]
    nleaves = len(in_lens)

    def body(*args):
        leaves = [a.reshape(-1) for a in args[:nleaves]]
        scalars = [a.reshape(()) for a in args[nleaves:]]
        outs = jax.ffi.ffi_call(target, out_types)(*leaves, *scalars, **attrs)
        return [o.reshape(1, -1) for o in outs]

    nargs = nleaves + len(extra_dtypes)
    f = jax.shard_map(
        body, mesh=mesh, in_specs=(spec,) * nargs, out_specs=[spec] * nleaves, check_vma=False
    )
    return jax.jit(f)


def rows(mesh, x):
    """[mesh..., L] -> [ndev, L] in mesh order."""
    return x.reshape(mesh.devices.size, -1)


def along(mesh, axis, x):
    """[mesh..., L] -> ([G, n, L], inverse): the rank axis second."""
    ax = mesh.axis_names.index(axis)
    moved = np.moveaxis(x, ax, -2)
    shape = moved.shape

    def back(y):
        y = y.reshape(shape[:-1] + (y.shape[-1],))
        return np.moveaxis(y, -2, ax)

    return moved.reshape(-1, shape[-2], shape[-1]), back


def reference(kind, x, n, *, op="sum", root=0, perm=(), premul=None):
    """numpy semantics of the contract on [G, n, L] (rank axis 1)."""
    if premul is not None:
        x = x * premul
    if kind in ("all_reduce", "reduce", "reduce_scatter"):
        red = {
            "sum": np.sum,
            "prod": np.prod,
            "max": np.max,
            "min": np.min,
            "avg": np.sum,
        }[op](x, axis=1, keepdims=True)
        if op == "avg":
            red = red / n if np.issubdtype(x.dtype, np.floating) else red // n
        red = red.astype(x.dtype)
        if kind == "all_reduce":
            return np.broadcast_to(red, x.shape)
        if kind == "reduce":
            out = np.zeros_like(x)
            out[:, root] = red[:, 0]
            return out
        c = x.shape[2] // n
        return red[:, 0].reshape(x.shape[0], n, c)
    if kind == "all_gather":
        cat = x.reshape(x.shape[0], 1, -1)
        return np.broadcast_to(cat, (x.shape[0], n, cat.shape[2]))
    if kind == "broadcast":
        return np.broadcast_to(x[:, root : root + 1], x.shape)
    if kind == "all_to_all":
        b = x.shape[2] // n
        blocks = x.reshape(x.shape[0], n, n, b)  # [g, src rank, block, b]
        return blocks.transpose(0, 2, 1, 3).reshape(x.shape)  # y[r] block j = x[j] block r
    if kind == "ppermute":
        out = np.zeros_like(x)
        for s, d in perm:
            out[:, d] = x[:, s]
        return out
    raise ValueError(kind)


def run_kind(kind, mesh, axis, x, *, dtype=np.float32, check=True, **kw):
    """Runs one leaf `x` ([mesh..., L]) through jax_rccl_<kind> and compares with numpy."""
    n = mesh.shape[axis]
    length = x.shape[-1]
    out_len = {"all_gather": n * length, "reduce_scatter": length // n}.get(kind, length)
    f = make_fn(f"jax_rccl_{kind}", mesh, axis, [length], [out_len], [dtype], **kw)
    (y,) = f(rows(mesh, x))
    y = np.asarray(y)
    xm, back = along(mesh, axis, x)
    ref_kw = {k: kw[k] for k in ("root", "perm") if k in kw}
    if "op" in kw:
        ref_kw["op"] = {v: k for k, v in OPS.items()}[kw["op"]]
    want = back(reference(kind, xm, n, **ref_kw))
    if check:
        if np.issubdtype(np.dtype(dtype), np.floating):
            np.testing.assert_allclose(y, rows(mesh, want), rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(y, rows(mesh, want))
    return y


def data(mesh, length, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    shape = mesh.devices.shape + (length,)
    if np.issubdtype(np.dtype(dtype), np.floating):
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(1, 5, shape).astype(dtype)


# ---- results per kind ----

MESHES = {
    "1d": (mesh_1d, "x"),
    "1d_reversed": (lambda: mesh_1d(reverse=True), "x"),
    "2x4_b": (mesh_2x4, "b"),
    "2x4_a": (mesh_2x4, "a"),
}


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize(
    "kind", ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all"]
)
def test_kinds(kind, mesh_name):
    make_mesh, axis = MESHES[mesh_name]
    mesh = make_mesh()
    n = mesh.shape[axis]
    kw = {}
    if kind in ("broadcast", "reduce"):
        kw["root"] = n - 1
    run_kind(kind, mesh, axis, data(mesh, 24 * n), **kw)


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_ppermute(mesh_name):
    make_mesh, axis = MESHES[mesh_name]
    mesh = make_mesh()
    n = mesh.shape[axis]
    shift = [(i, (i + 1) % n) for i in range(n)]
    run_kind("ppermute", mesh, axis, data(mesh, 40), perm=shift)
    partial = [(0, n - 1)] + ([(n - 1, 1)] if n > 2 else [])  # ranks without a source: zeros
    run_kind("ppermute", mesh, axis, data(mesh, 40), perm=partial)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.uint8])
def test_all_reduce_ops(op, dtype):
    mesh = mesh_1d()
    x = data(mesh, 100, dtype)
    if op == "prod" and np.issubdtype(np.dtype(dtype), np.integer):
        x = (x % 2 + 1).astype(dtype)  # keep products of 8 ranks in range
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):
        run_kind("all_reduce", mesh, "x", x, dtype=dtype, op=OPS[op])


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, np.int8, np.int16, np.uint32])
def test_all_reduce_more_dtypes(dtype):
    mesh = mesh_1d()
    x = data(mesh, 64, np.int8).astype(dtype)  # small integers: exact in every type
    y = run_kind("all_reduce", mesh, "x", x, dtype=dtype, check=False)
    want = x.astype(np.float64).sum(axis=0, keepdims=True)
    np.testing.assert_array_equal(np.asarray(y, np.float64), np.broadcast_to(want, y.shape))


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "reduce"])
def test_premul_immediate(kind):
    mesh = mesh_1d()
    x = data(mesh, 64)
    kw = {"root": 3} if kind == "reduce" else {}
    f = make_fn(
        f"jax_rccl_{kind}",
        mesh,
        "x",
        [64],
        [{"reduce_scatter": 8}.get(kind, 64)],
        [np.float32],
        premul=1,
        premul_value=0.25,
        **kw,
    )
    (y,) = f(rows(mesh, x))
    xm, back = along(mesh, "x", x)
    want = back(reference(kind, xm, 8, premul=np.float32(0.25), **kw))
    np.testing.assert_allclose(np.asarray(y), rows(mesh, want), rtol=1e-5, atol=1e-6)


def test_premul_per_device():
    mesh = mesh_1d()
    x = data(mesh, 64)
    f = make_fn(
        "jax_rccl_all_reduce",
        mesh,
        "x",
        [64],
        [64],
        [np.float32],
        premul=2,
        extra_dtypes=[np.float32],
    )
    for trial in range(3):  # new scalars (and buffers) each call; one plan
        scal = np.arange(1, 9, dtype=np.float32).reshape(8, 1) * (trial + 1)
        (y,) = f(rows(mesh, x), scal)
        want = (x * scal).sum(axis=0, keepdims=True)
        np.testing.assert_allclose(np.asarray(y), np.broadcast_to(want, y.shape), rtol=1e-5)


def test_several_leaves_one_call():
    mesh = mesh_1d()
    a = data(mesh, 33, np.float32, seed=1)
    b = data(mesh, 1000, np.int32, seed=2)
    c = data(mesh, 5, np.float64, seed=3)
    with jax.enable_x64(True):
        f = make_fn(
            "jax_rccl_all_reduce",
            mesh,
            "x",
            [33, 1000, 5],
            [33, 1000, 5],
            [np.float32, np.int32, np.float64],
        )
        ya, yb, yc = f(rows(mesh, a), rows(mesh, b), rows(mesh, c))
    for x, y in ((a, ya), (b, yb), (c, yc)):
        assert y.dtype == x.dtype
        np.testing.assert_allclose(
            np.asarray(y), rows(mesh, np.broadcast_to(x.sum(0, keepdims=True), x.shape)), rtol=1e-5
        )


@pytest.mark.parametrize("algorithm", ["ring", "tree", "direct"])
@pytest.mark.parametrize("protocol", ["ll", "ll128", "simple"])
def test_algorithm_protocol_attributes(algorithm, protocol):
    mesh = mesh_1d()
    run_kind("all_reduce", mesh, "x", data(mesh, 5000), algorithm=algorithm, protocol=protocol)


# ---- plans, counters, rendezvous ----


def stats():
    return _ffi.runtime_stats()


def test_one_plan_per_device_over_many_calls():
    mesh = mesh_1d()
    x = rows(mesh, data(mesh, 256))
    f = make_fn("jax_rccl_all_reduce", mesh, "x", [256], [256], [np.float32])
    _ffi.reset_runtime_stats()
    for i in range(100):
        (y,) = f(x)
        if i % 10 == 9:  # stay well under the CPU client's limit of ~32 executions in flight
            y.block_until_ready()
    s = stats()
    assert s["instantiations"] == 1
    assert s["plans_built"] == 8
    assert s["executions"] == 800
    assert s["errors"] == 0
    assert s["rendezvous_pending"] == 0
    np.testing.assert_allclose(np.asarray(y)[0], np.asarray(x).sum(0), rtol=1e-5)


def test_calls_in_flight():
    mesh = mesh_1d()
    f = make_fn("jax_rccl_all_reduce", mesh, "x", [1024], [1024], [np.float32])
    xs = [rows(mesh, data(mesh, 1024, seed=i)) for i in range(32)]
    f(xs[0])[0].block_until_ready()  # compiled
    outs = [f(x)[0] for x in xs]  # 32 dispatched before any is awaited
    for x, y in zip(xs, outs, strict=True):
        np.testing.assert_allclose(np.asarray(y)[0], np.asarray(x).sum(0), rtol=1e-5, atol=1e-5)
    assert stats()["rendezvous_pending"] == 0


def test_missing_rank_times_out(monkeypatch):
    monkeypatch.setenv("JAX_RCCL_TIMEOUT", "2")
    devs = cpu_devices()
    mesh = Mesh(np.array(devs[:4]), ("x",))
    group = [[int(d.id) for d in devs[:5]]]  # names a fifth device that never runs the call
    f = make_fn(
        "jax_rccl_all_reduce",
        mesh,
        "x",
        [16],
        [16],
        [np.float32],
        groups=group,
        name="psum over ('x',)",
    )
    before = stats()["rendezvous_timeouts"]
    t0 = time.monotonic()
    with pytest.raises(Exception) as info:  # noqa: B017 - JAX's runtime error class varies
        f(np.ones((4, 16), np.float32))[0].block_until_ready()
    elapsed = time.monotonic() - t0
    msg = str(info.value)
    assert elapsed < 15, elapsed
    assert "psum over ('x',)" in msg
    assert "never arrived" in msg
    assert "ranks [4]" in msg and f"devices [{group[0][4]}]" in msg
    assert stats()["rendezvous_timeouts"] > before
    # The communicator is failed now: later calls stop at once with a clear error.
    t0 = time.monotonic()
    with pytest.raises(Exception, match="failed earlier"):  # noqa: B017
        f(np.ones((4, 16), np.float32))[0].block_until_ready()
    assert time.monotonic() - t0 < 2


def test_device_in_no_group():
    mesh = mesh_1d()
    groups = [[int(d.id) for d in cpu_devices()[:4]]]  # devices 4..7 in no group
    f = make_fn("jax_rccl_all_reduce", mesh, "x", [8], [8], [np.float32], groups=groups)
    with pytest.raises(Exception, match="in none of the replica groups"):  # noqa: B017
        f(np.ones((8, 8), np.float32))[0].block_until_ready()


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(op=9), "op 9"),
        (dict(premul=1, op=2), "needs op 0"),
        (dict(algorithm="Bogus"), "algorithm"),
    ],
)
def test_bad_attributes(kw, match):
    mesh = mesh_1d()
    f = make_fn("jax_rccl_all_reduce", mesh, "x", [8], [8], [np.float32], **kw)
    with pytest.raises(Exception, match=match):  # noqa: B017
        f(np.ones((8, 8), np.float32))[0].block_until_ready()


def test_registration_is_idempotent():
    _ffi.ensure_registered()
    _ffi.ensure_registered()
    assert _ffi.gpu_platform() in (None, "CUDA", "ROCM")


def test_cpu_topology():
    from jax_rccl import _jax_rccl

    t = _jax_rccl.cpu_topology(8)
    assert t["nRanks"] == 8 and t["arch"] == "cpu" and t["directPeers"] is True
    assert t["buffSizes"] == [262144, 458752, 1 << 20]  # Simple: 1 MiB on hosts (comm.cc)
    assert t["p2pChunkSize"] == 524288
