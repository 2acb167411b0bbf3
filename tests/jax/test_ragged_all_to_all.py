"""jax_rccl.ragged_all_to_all on 8 CPU devices against a numpy reference (XLA:CPU has no
ragged_all_to_all to run jax.lax's), and against jax.lax's typing and transformations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import mesh_1d, mesh_2d, needs_runtime, sample
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import jax_rccl

N_DEV = 8


def reference(operands, outputs, in_off, send, out_off, groups=None):
    """What every device's result holds: slice i of device s (rows [in_off, +send) of its
    operand) lands at rows [out_off, +send) of device group[i // spd]'s output."""
    res = [np.array(o, copy=True) for o in outputs]
    for g in groups or [list(range(len(operands)))]:
        spd = len(in_off[g[0]]) // len(g)
        for s in g:
            for i in range(len(in_off[s])):
                d, a, b, m = g[i // spd], in_off[s][i], out_off[s][i], send[s][i]
                res[d][b : b + m] = operands[s][a : a + m]
    return res


def make_case(rng, n_rows, m_rows, spd=1, *, groups=None, zero_every=0, n_dev=N_DEV):
    """Random valid offsets and sizes: each device packs its slices into its operand in a random
    order with gaps, and each receiver lays the arriving slices out in a random order."""
    groups = groups or [list(range(n_dev))]
    K = spd * len(groups[0])
    send = np.zeros((n_dev, K), np.int32)
    in_off = np.zeros((n_dev, K), np.int32)
    out_off = np.zeros((n_dev, K), np.int32)
    recv = np.zeros((n_dev, K), np.int32)
    for g in groups:
        n = len(g)
        room = {d: m_rows for d in g}  # rows each receiver has left
        for s in g:  # sizes that fit the operand and the receivers, some zero
            budget = n_rows
            for i in rng.permutation(K):
                d = g[i // spd]
                m = int(rng.integers(0, min(budget // 2, room[d]) + 1))
                if zero_every and i % zero_every == 0:
                    m = 0
                send[s, i] = m
                budget -= m
                room[d] -= m
        for d_pos, d in enumerate(g):  # receiver d: incoming slices in a random order
            incoming = [(s_pos, k) for s_pos in range(n) for k in range(spd)]
            total = sum(int(send[g[s_pos], d_pos * spd + k]) for s_pos, k in incoming)
            assert total <= m_rows, "case too large for the output"
            gap = m_rows - total
            at = 0
            for j in rng.permutation(len(incoming)):
                s_pos, k = incoming[j]
                skip = int(rng.integers(0, gap + 1))
                gap -= skip
                at += skip
                m = int(send[g[s_pos], d_pos * spd + k])
                out_off[g[s_pos], d_pos * spd + k] = at
                recv[d, s_pos * spd + k] = m
                at += m
        for s in g:  # the operand: slices in a random order, gaps between them
            total = int(send[s].sum())
            gap = n_rows - total
            at = 0
            for i in rng.permutation(K):
                skip = int(rng.integers(0, gap + 1))
                gap -= skip
                at += skip
                in_off[s, i] = at
                at += int(send[s, i])
    return in_off, send, out_off, recv


def run(fn, mesh, *args):
    spec = P(tuple(mesh.axis_names) if len(mesh.axis_names) > 1 else mesh.axis_names[0])
    sm = jax.shard_map(
        lambda *a: jnp.expand_dims(fn(*(x[0] for x in a)), 0),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
    )
    return np.asarray(jax.jit(sm)(*args))


def rragged(axis, groups=None):
    def fn(x, y, a, b, c, d):
        return jax_rccl.ragged_all_to_all(
            x, y, a, b, c, d, axis_name=axis, axis_index_groups=groups
        )

    return fn


def check(dtype, n_rows, m_rows, row_shape, spd=1, seed=0, zero_every=0, idx_dtype=np.int32):
    rng = np.random.default_rng(seed)
    in_off, send, out_off, recv = make_case(rng, n_rows, m_rows, spd, zero_every=zero_every)
    x = np.asarray(sample((N_DEV, n_rows, *row_shape), dtype, seed=seed))
    y = np.asarray(sample((N_DEV, m_rows, *row_shape), dtype, seed=seed + 1))
    got = run(
        rragged("i"),
        mesh_1d(),
        x,
        y,
        *(v.astype(idx_dtype) for v in (in_off, send, out_off, recv)),
    )
    want = reference(list(x), list(y), in_off, send, out_off)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.stack(want))


@needs_runtime
@pytest.mark.parametrize(
    "dtype",
    [
        "float32",
        "bfloat16",
        "float16",
        "float64",
        "int8",
        "uint8",
        "int32",
        "int64",
        "uint16",
        "bool",
        "complex64",
    ],
)
def test_dtypes(dtype):
    with jax.enable_x64(np.dtype(jnp.dtype(dtype)).itemsize == 8):
        check(dtype, 24, 40, (3,), seed=1)


@needs_runtime
@pytest.mark.parametrize(
    ("n_rows", "m_rows", "row_shape", "spd"),
    [(16, 32, (), 1), (9, 13, (2, 5), 1), (30, 20, (4,), 1), (12, 48, (3,), 2), (40, 64, (), 3)],
    ids=str,
)
def test_uneven_sizes_and_shapes(n_rows, m_rows, row_shape, spd):
    check("float32", n_rows, m_rows, row_shape, spd=spd, seed=n_rows)


@needs_runtime
def test_zero_size_sends_and_int64_offsets():
    check("int32", 16, 32, (2,), spd=2, seed=3, zero_every=2)
    with jax.enable_x64(True):
        check("float32", 16, 32, (2,), seed=4, idx_dtype=np.int64)


@needs_runtime
def test_all_sizes_zero_keeps_output():
    z = np.zeros((N_DEV, N_DEV), np.int32)
    x = np.arange(N_DEV * 4 * 2, dtype=np.float32).reshape(N_DEV, 4, 2)
    y = -np.ones((N_DEV, 5, 2), np.float32)
    got = run(rragged("i"), mesh_1d(), x, y, z, z, z, z)
    np.testing.assert_array_equal(got, y)


@needs_runtime
def test_empty_operand_and_output():
    z = np.zeros((N_DEV, N_DEV), np.int32)
    x = np.zeros((N_DEV, 0, 3), np.float32)
    y = np.ones((N_DEV, 6, 3), np.float32)
    np.testing.assert_array_equal(run(rragged("i"), mesh_1d(), x, y, z, z, z, z), y)
    y0 = np.ones((N_DEV, 0, 3), np.float32)
    assert run(
        rragged("i"), mesh_1d(), np.ones((N_DEV, 4, 3), np.float32), y0, z, z, z, z
    ).shape == (N_DEV, 0, 3)


@needs_runtime
def test_docstring_example_over_a_pair_of_devices():
    """jax.lax's documented example on an axis of size 2 (four groups of two devices)."""
    x = np.array([[1, 2, 2], [3, 4, 0]] * 4, np.float32)
    y = np.zeros((N_DEV, 4), np.float32)
    in_off = np.array([[0, 1], [0, 1]] * 4, np.int32)
    send = np.array([[1, 2], [1, 1]] * 4, np.int32)
    out_off = np.array([[0, 0], [1, 2]] * 4, np.int32)
    recv = np.array([[1, 1], [2, 1]] * 4, np.int32)
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    got = run(rragged("i", groups), mesh_1d(), x, y, in_off, send, out_off, recv)
    np.testing.assert_array_equal(got, np.array([[1, 3, 0, 0], [2, 2, 4, 0]] * 4, np.float32))


@needs_runtime
def test_axis_index_groups_and_two_mesh_axes():
    rng = np.random.default_rng(7)
    groups = [[0, 3, 5, 6], [1, 2, 4, 7]]
    dev_groups = groups  # over one axis of 8, axis index == device
    in_off, send, out_off, recv = make_case(rng, 10, 24, 1, groups=dev_groups)
    x = np.asarray(sample((N_DEV, 10, 2), "float32", seed=2))
    y = np.asarray(sample((N_DEV, 24, 2), "float32", seed=3))
    got = run(rragged("i", groups), mesh_1d(), x, y, in_off, send, out_off, recv)
    want = reference(list(x), list(y), in_off, send, out_off, groups=dev_groups)
    np.testing.assert_array_equal(got, np.stack(want))
    # Over ("x", "y") of a 2 x 4 mesh the group is all 8 devices, ranks row-major.
    in_off, send, out_off, recv = make_case(rng, 10, 24, 1)
    got = run(rragged(("x", "y")), mesh_2d(), x, y, in_off, send, out_off, recv)
    want = reference(list(x), list(y), in_off, send, out_off)
    np.testing.assert_array_equal(got, np.stack(want))


@needs_runtime
def test_over_one_axis_of_two():
    """Over "y" of a 2 x 4 mesh: two groups of four, one per row."""
    rng = np.random.default_rng(11)
    rows = [[0, 1, 2, 3], [4, 5, 6, 7]]
    in_off, send, out_off, recv = make_case(rng, 12, 20, 2, groups=rows)
    K = in_off.shape[1]
    x = np.asarray(sample((N_DEV, 12), "int32", seed=5))
    y = np.asarray(sample((N_DEV, 20), "int32", seed=6))
    got = run(rragged("y"), mesh_2d(), x, y, in_off[:, :K], send, out_off, recv)
    want = reference(list(x), list(y), in_off, send, out_off, groups=rows)
    np.testing.assert_array_equal(got, np.stack(want))


def _repeat(fn, mesh, args, times):
    """One jitted program, called `times` with different offsets (device arrays: the plan is
    built once, the sizes are read at each call)."""
    spec = P("i")
    f = jax.jit(
        jax.shard_map(
            lambda *a: jnp.expand_dims(fn(*(v[0] for v in a)), 0),
            mesh=mesh,
            in_specs=spec,
            out_specs=spec,
        )
    )
    return [np.asarray(f(*a)) for a in args[:times]]


@needs_runtime
def test_sizes_are_read_at_run_time():
    rng = np.random.default_rng(5)
    x = np.asarray(sample((N_DEV, 20, 3), "float32", seed=8))
    y = np.zeros((N_DEV, 30, 3), np.float32)
    cases = [make_case(rng, 20, 30, 1) for _ in range(4)]
    jax_rccl.reset_runtime_stats()
    outs = _repeat(rragged("i"), mesh_1d(), [(x, y, *c) for c in cases], 4)
    for got, (a, b, c, _) in zip(outs, cases, strict=True):
        np.testing.assert_array_equal(got, np.stack(reference(list(x), list(y), a, b, c)))
    stats = jax_rccl.runtime_stats()
    assert stats["plans_built"] <= 2 * N_DEV, stats  # the all_gather's and the call's, once


def _resize(a, b, c, d, s, i, in_off, out_off, size):
    """Slice i of rank s (one per peer): input offset, output offset (None: kept) and a size
    that both ends agree on."""
    a[s, i] = in_off
    if out_off is not None:
        c[s, i] = out_off
    b[s, i] = size
    d[i, s] = size


def _bad(mutate):
    rng = np.random.default_rng(9)
    in_off, send, out_off, recv = make_case(rng, 8, 16, 1)
    mutate(in_off, send, out_off, recv)
    x = np.ones((N_DEV, 8, 2), np.float32)
    y = np.zeros((N_DEV, 16, 2), np.float32)
    return x, y, in_off, send, out_off, recv


@needs_runtime
@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda a, b, c, d: _resize(a, b, c, d, 2, 3, 7, None, 2), "past its 8 rows"),
        (lambda a, b, c, d: _resize(a, b, c, d, 5, 1, 0, 15, 2), "of rank 1's output"),
        (lambda a, b, c, d: a.__setitem__((1, 0), -1), "must be >= 0"),
        (lambda a, b, c, d: d.__setitem__((4, 6), d[4, 6] + 1), "recv_sizes"),
        (lambda a, b, c, d: (b.__setitem__((3, 2), 9), d.__setitem__((2, 3), 9)), "past"),
    ],
    ids=["input_overflow", "output_overflow", "negative", "size_mismatch", "too_big"],
)
def test_bad_sizes_fail_every_device_at_run_time(mutate, match):
    args = _bad(mutate)
    with pytest.raises(Exception, match=match):
        run(rragged("i"), mesh_1d(), *args)
    # The runtime still works afterwards (no device left waiting, nothing corrupted).
    good = _bad(lambda *a: None)
    got = run(rragged("i"), mesh_1d(), *good)
    x, y, a, b, c, _ = good
    np.testing.assert_array_equal(got, np.stack(reference(list(x), list(y), a, b, c)))


def _trace(fn, *avals):
    mesh = mesh_1d()
    sm = jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return jax.eval_shape(sm, *avals)


def _sds(shape, dtype):
    return jax.ShapeDtypeStruct(shape, jnp.dtype(dtype))


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        (((8, 3), (16, 3), (8,), (8,), (8,), (8,)), None),
        (((8, 3), (16, 4), (8,), (8,), (8,), (8,)), "agree after the leading axis"),
        (((8, 3), (16, 3), (8, 1), (8,), (8,), (8,)), "input_offsets must be rank 1"),
        (((8, 3), (16, 3), (8,), (8,), (16,), (8,)), "one length"),
        (((8, 3), (16, 3), (12,), (12,), (12,), (12,)), "multiple of the group size"),
        (((), (16,), (8,), (8,), (8,), (8,)), "leading"),
    ],
)
def test_shape_errors_as_lax(shapes, match):
    avals = [_sds((N_DEV * s[0], *s[1:]) if s else (N_DEV,), "int32") for s in shapes]
    avals[0] = _sds(avals[0].shape, "float32")
    avals[1] = _sds(avals[1].shape, "float32")

    def body(*a):
        if not shapes[0]:
            a = (a[0][0],) + a[1:]
        return jax_rccl.ragged_all_to_all(*a, axis_name="i")

    if match is None:
        out = _trace(body, *avals)
        assert out.shape == (N_DEV * 16, 3) and out.dtype == jnp.float32
        return
    with pytest.raises(ValueError, match=match):
        _trace(body, *avals)


@pytest.mark.parametrize("field", range(4))
def test_float_offsets_are_refused(field):
    avals = [_sds((64, 3), "float32"), _sds((128, 3), "float32")]
    avals += [_sds((64,), "float32" if f == field else "int32") for f in range(4)]
    name = ["input_offsets", "send_sizes", "output_offsets", "recv_sizes"][field]
    with pytest.raises(ValueError, match=f"{name} must have an integer dtype"):
        _trace(lambda *a: jax_rccl.ragged_all_to_all(*a, axis_name="i"), *avals)


def test_dtype_mismatch_and_unknown_axis():
    avals = [_sds((64, 3), "float32"), _sds((128, 3), "int32")] + [_sds((64,), "int32")] * 4
    with pytest.raises(TypeError, match="one dtype"):
        _trace(lambda *a: jax_rccl.ragged_all_to_all(*a, axis_name="i"), *avals)
    avals[1] = _sds((128, 3), "float32")
    with pytest.raises(NameError, match="'j' is not bound"):
        _trace(lambda *a: jax_rccl.ragged_all_to_all(*a, axis_name="j"), *avals)


def test_types_match_lax():
    avals = [_sds((64, 3), "bfloat16"), _sds((128, 3), "bfloat16")] + [_sds((64,), "int32")] * 4

    def typed(lib):
        seen = []

        def body(*a):
            out = lib.ragged_all_to_all(*a, axis_name="i")
            t = jax.typeof(out)
            seen.append((t.shape, t.dtype, frozenset(jax_rccl._compat.varying(t))))
            return out

        _trace(body, *avals)
        return seen

    assert typed(jax_rccl) == typed(lax)


# --- transformations -----------------------------------------------------------------------------


def _vmapped_case(rng, B, n_rows, m_rows):
    cases = [make_case(rng, n_rows, m_rows, 1) for _ in range(B)]
    stack = [np.stack([c[f] for c in cases], axis=1) for f in range(4)]  # [dev, B, K]
    return cases, stack


@needs_runtime
def test_vmap_over_a_batch_axis():
    rng = np.random.default_rng(21)
    B, n_rows, m_rows = 3, 10, 18
    cases, (a, b, c, d) = _vmapped_case(rng, B, n_rows, m_rows)
    x = np.asarray(sample((N_DEV, B, n_rows, 2), "float32", seed=9))
    y = np.asarray(sample((N_DEV, B, m_rows, 2), "float32", seed=10))
    got = run(jax.vmap(rragged("i")), mesh_1d(), x, y, a, b, c, d)
    for e, (ia, ib, ic, _) in enumerate(cases):
        want = reference(list(x[:, e]), list(y[:, e]), ia, ib, ic)
        np.testing.assert_array_equal(got[:, e], np.stack(want))
    # Only the operand batched: the same offsets for every element.
    ia, ib, ic, idd = cases[0]
    got = run(
        jax.vmap(rragged("i"), in_axes=(1, None, None, None, None, None), out_axes=1),
        mesh_1d(),
        x.transpose(0, 2, 1, 3),
        y[:, 0],
        ia,
        ib,
        ic,
        idd,
    )
    for e in range(B):
        want = reference(list(x[:, e]), list(y[:, 0]), ia, ib, ic)
        np.testing.assert_array_equal(got[:, :, e], np.stack(want))


def test_vmap_over_the_collective_axis_is_refused_as_lax():
    avals = [_sds((4, 3), "float32"), _sds((4, 3), "float32")] + [_sds((2,), "int32")] * 4
    f = jax.vmap(lambda *a: jax_rccl.ragged_all_to_all(*a, axis_name="v"), axis_name="v")
    stacked = [_sds((2, *a.shape), a.dtype) for a in avals]
    with pytest.raises(NotImplementedError, match="axis bound by jax.vmap"):
        jax.eval_shape(f, *stacked)


def _grad_inputs(seed):
    rng = np.random.default_rng(seed)
    in_off, send, out_off, recv = make_case(rng, 10, 16, 1)
    x = np.asarray(sample((N_DEV, 10, 2), "float32", seed=seed))
    y = np.asarray(sample((N_DEV, 16, 2), "float32", seed=seed + 1))
    w = np.asarray(sample((N_DEV, 16, 2), "float32", seed=seed + 2))
    return x, y, w, in_off, send, out_off, recv


@needs_runtime
def test_grad_and_jvp_against_the_reference():
    x, y, w, a, b, c, d = _grad_inputs(31)
    mesh = mesh_1d()
    spec = P("i")

    def loss(xs, ys, ws, a, b, c, d):
        def body(xs, ys, ws, a, b, c, d):
            out = jax_rccl.ragged_all_to_all(xs[0], ys[0], a[0], b[0], c[0], d[0], axis_name="i")
            return jnp.expand_dims(jnp.sum(out * ws[0]), 0)

        per = jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec)
        return jnp.sum(per(xs, ys, ws, a, b, c, d))

    gx, gy = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y, w, a, b, c, d)
    # The reference: d loss / d x[s][row] = w at the row it lands on; d / d y = w where nothing
    # lands.
    want_gx = np.zeros_like(x)
    want_gy = np.array(w, copy=True)
    for s in range(N_DEV):
        for i in range(N_DEV):
            m = b[s][i]
            want_gx[s][a[s][i] : a[s][i] + m] = w[i][c[s][i] : c[s][i] + m]
            want_gy[i][c[s][i] : c[s][i] + m] = 0
    np.testing.assert_allclose(np.asarray(gx), want_gx)
    np.testing.assert_allclose(np.asarray(gy), want_gy)

    # jvp: linear in (operand, output).
    def f(xs, ys):
        return run(rragged("i"), mesh, xs, ys, a, b, c, d)

    tx = np.asarray(sample(x.shape, "float32", seed=41))
    ty = np.asarray(sample(y.shape, "float32", seed=42))

    def g(xs, ys):
        sm = jax.shard_map(
            lambda *v: jnp.expand_dims(rragged("i")(*(t[0] for t in v)), 0),
            mesh=mesh,
            in_specs=spec,
            out_specs=spec,
        )
        return sm(xs, ys, a, b, c, d)

    primal, tangent = jax.jit(lambda p, t: jax.jvp(g, p, t))((x, y), (tx, ty))
    np.testing.assert_array_equal(np.asarray(primal), f(x, y))
    np.testing.assert_array_equal(np.asarray(tangent), f(tx, ty))


@needs_runtime
def test_scan_calls_it_each_step():
    rng = np.random.default_rng(51)
    in_off, send, out_off, recv = make_case(rng, 8, 8, 1)
    x = np.asarray(sample((N_DEV, 8, 2), "float32", seed=51))

    def body(x, a, b, c, d):
        def step(carry, _):
            return jax_rccl.ragged_all_to_all(carry, carry, a, b, c, d, axis_name="i"), None

        out, _ = lax.scan(step, x, None, length=3)
        return out

    got = run(body, mesh_1d(), x, in_off, send, out_off, recv)
    want = list(x)
    for _ in range(3):
        want = reference(want, want, in_off, send, out_off)
    np.testing.assert_array_equal(got, np.stack(want))


def test_lowering_gathers_the_offsets_then_calls_the_runtime_on_cpu():
    mesh = Mesh(np.array(jax.devices()[:N_DEV]), ("i",))
    avals = [_sds((64, 3), "float32"), _sds((128, 3), "float32")] + [_sds((64,), "int32")] * 4
    sm = jax.shard_map(
        lambda *a: jax_rccl.ragged_all_to_all(*a, axis_name="i"),
        mesh=mesh,
        in_specs=P("i"),
        out_specs=P("i"),
    )
    text = jax.jit(sm).lower(*avals).as_text()
    calls = [line for line in text.splitlines() if "custom_call" in line and "jax_rccl" in line]
    assert len(calls) == 2, calls
    assert "@jax_rccl_all_gather" in calls[0] and "@jax_rccl_ragged_all_to_all" in calls[1]
    assert "ragged_all_to_all(" not in text.replace("@jax_rccl_ragged_all_to_all(", "")


# --- jax.export ---------------------------------------------------------------------------------


def _exported(mesh, *args, **kw):
    """`rragged("i")` over `mesh`, jitted and exported with jax_rccl's custom calls allowed."""
    spec = P("i")
    sm = jax.shard_map(
        lambda *a: jnp.expand_dims(rragged("i")(*(x[0] for x in a)), 0),
        mesh=mesh,
        in_specs=spec,
        out_specs=spec,
    )
    return jax.export.export(jax.jit(sm), disabled_checks=jax_rccl.export_checks(), **kw)(*args)


@needs_runtime
@pytest.mark.parametrize("seed", [0, 1])
def test_export_round_trip(seed):
    """Serialized, deserialized and called: the same result as the reference, with sizes read
    from the arguments of each call (two different cases through one exported program)."""
    mesh, n_rows, m_rows = mesh_1d(), 24, 40
    x = np.asarray(sample((N_DEV, n_rows, 3), "float32", seed=seed))
    y = np.asarray(sample((N_DEV, m_rows, 3), "float32", seed=seed + 1))
    cases = [make_case(np.random.default_rng(seed + k), n_rows, m_rows) for k in (0, 10)]
    exp = _exported(mesh, x, y, *cases[0])
    blob = exp.serialize()
    assert isinstance(blob, (bytes, bytearray)) and blob
    back = jax.export.deserialize(blob)
    text = back.mlir_module()
    assert "@jax_rccl_ragged_all_to_all(" in text and "@jax_rccl_all_gather(" in text
    shard = jax.sharding.NamedSharding(mesh, P("i"))
    for in_off, send, out_off, recv in cases:
        args = jax.device_put((x, y, in_off, send, out_off, recv), shard)
        got = np.asarray(back.call(*args))
        np.testing.assert_array_equal(
            got, np.stack(reference(list(x), list(y), in_off, send, out_off))
        )


@pytest.mark.parametrize("platforms", [("cpu", "cuda"), ("rocm",)])
def test_export_for_gpu_platforms_holds_one_ragged_call(platforms):
    """One lowering rule for every platform, as the other collectives: a program exported for
    the CPU and GPUs holds the ragged call once (the GPU runtime runs it too)."""
    avals = [_sds((N_DEV, 8, 3), "float32"), _sds((N_DEV, 16, 3), "float32")]
    avals += [_sds((N_DEV, N_DEV), "int32")] * 4
    exp = _exported(mesh_1d(), *avals, platforms=platforms)
    assert tuple(exp.platforms) == platforms
    assert exp.mlir_module().count("@jax_rccl_ragged_all_to_all(") == 1


def test_export_for_a_platform_without_the_runtime_names_it():
    avals = [_sds((N_DEV, 8, 3), "float32"), _sds((N_DEV, 16, 3), "float32")]
    avals += [_sds((N_DEV, N_DEV), "int32")] * 4
    with pytest.raises(NotImplementedError, match="ragged_all_to_all.*'tpu'"):
        _exported(mesh_1d(), *avals, platforms=("tpu",))


def test_export_with_a_symbolic_dimension_names_it():
    (b,) = jax.export.symbolic_shape("b")
    avals = [_sds((N_DEV, b, 3), "float32"), _sds((N_DEV, 16, 3), "float32")]
    avals += [_sds((N_DEV, N_DEV), "int32")] * 4
    with pytest.raises(NotImplementedError, match="ragged_all_to_all: .*must be static"):
        _exported(mesh_1d(), *avals)
