"""axis_index_groups of unequal sizes (the reductions: psum, pmax, pmin, pmean, all_reduce)
on 8 CPU devices, next to jax.lax where jax.lax computes them (psum without check_vma, pmax,
pmin) and numpy elsewhere; each device reduces over its own group."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_like_lax,
    assert_same,
    custom_calls,
    lowered_text,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

GROUPS = [
    [[0, 1, 2], [3, 4, 5, 6, 7]],
    [[5], [0, 7, 2], [1, 3, 4, 6]],
    [[7, 6, 5, 4, 3, 2, 1], [0]],
    [[0], [1], [2], [3], [4], [5], [6], [7]] + [],
]
REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "avg": np.mean}


def _expected(x, groups, op):
    """Per device: `op` over the rows of its group (x[d] is device d's row)."""
    x = np.asarray(x)
    out = np.empty_like(x, dtype=np.result_type(x, np.float32) if op == "avg" else x.dtype)
    for g in groups:
        out[g] = REDUCE[op](x[g], axis=0)
    return out


@needs_runtime
@pytest.mark.parametrize("groups", GROUPS, ids=str)
@pytest.mark.parametrize("name", ["psum", "pmax", "pmin"])
def test_matches_lax(name, groups):
    mesh, x = mesh_1d(), sample((8, 5, 3), "float32")
    fn = lambda lib: lambda v: getattr(lib, name)(v[0], "i", axis_index_groups=groups)  # noqa: E731
    got = assert_like_lax(fn, mesh, x, lax_check_vma=False)  # jax.lax.psum: no check_vma groups
    assert_same(got, _expected(x, groups, {"psum": "sum", "pmax": "max", "pmin": "min"}[name]))


@needs_runtime
@pytest.mark.parametrize("dtype", ["int32", "bfloat16", "uint8", "complex64", "bool"])
def test_dtypes(dtype):
    groups = GROUPS[1]
    fn = lambda lib: lambda v: lib.psum(v[0], "i", axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), sample((8, 6), dtype), lax_check_vma=False)


@needs_runtime
@pytest.mark.parametrize("groups", GROUPS[:3], ids=str)
def test_pmean_divides_by_each_devices_group(groups):
    """jax.lax.pmean divides every group's sum by the FIRST group's size (its psum(1) is
    len(groups[0]) everywhere); jax_rccl by the device's own group's size."""
    mesh, x = mesh_1d(), sample((8, 4), "float32")
    got = per_device(lambda v: jax_rccl.pmean(v[0], "i", axis_index_groups=groups), mesh)(x)
    assert_same(got, _expected(x, groups, "avg"))
    sizes = per_device(lambda v: jax_rccl.psum(1, "i", axis_index_groups=groups), mesh)(x)
    want_sizes = np.zeros(8, np.int32)
    for g in groups:
        want_sizes[g] = len(g)
    assert_same(sizes, want_sizes)


@needs_runtime
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_all_reduce_ops(op):
    mesh, groups = mesh_1d(), GROUPS[1]
    x = sample((8, 7), "float32") + 5  # positive: prod and avg stay exact enough
    got = per_device(
        lambda v: jax_rccl.all_reduce(v[0], "i", op=op, axis_index_groups=groups), mesh
    )(x)
    assert_same(got, _expected(x, groups, op).astype(np.float32))


@needs_runtime
def test_premul_and_pytree():
    mesh, groups = mesh_1d(), GROUPS[0]
    tree = {"a": sample((8, 3), "float32"), "b": sample((8,), "int32")}
    got = per_device(
        lambda t: (
            jax_rccl.all_reduce(t["a"][0], "i", premul=0.5, axis_index_groups=groups),
            jax_rccl.psum(jax.tree_util.tree_map(lambda v: v[0], t), "i", axis_index_groups=groups),
        ),
        mesh,
    )(tree)
    want = per_device(
        lambda t: (
            lax.psum(t["a"][0] * 0.5, "i", axis_index_groups=groups),
            lax.psum(jax.tree_util.tree_map(lambda v: v[0], t), "i", axis_index_groups=groups),
        ),
        mesh,
        check_vma=False,
    )(tree)
    assert_same(got, want)


@needs_runtime
@pytest.mark.parametrize("check_vma", [True, False])
def test_gradient(check_vma):
    """The cotangent of a grouped psum is the grouped psum of the cotangents (the gradient of
    the sum of every device's loss: it scales with each device's own group's size); jax.lax
    computes it without check_vma."""
    mesh, groups = mesh_1d(), GROUPS[0]
    x = sample((8, 4), "float32")

    def grad_of(lib):
        def body(v):
            loss = lambda u: lib.psum(u * u, "i", axis_index_groups=groups).sum()  # noqa: E731
            mean = lambda u: lib.pmean(u, "i", axis_index_groups=groups).sum()  # noqa: E731
            return jax.grad(loss)(v[0]), jax.grad(mean)(v[0])

        return body

    got = per_device(grad_of(jax_rccl), mesh, check_vma=check_vma)(x)
    want_psum = per_device(grad_of(lax), mesh, check_vma=False)(x)[0]
    assert_same(got[0], want_psum)
    # pmean: the group's psum of the ones (its size), divided by that size (jax.lax's
    # pmean would divide by the first group's size)
    assert_same(got[1], np.ones((8, 4), np.float32))


@needs_runtime
def test_2d_mesh_groups_over_both_axes():
    groups = [[0, 5], [1, 2, 3, 4, 6, 7]]
    fn = lambda lib: lambda v: lib.psum(v[0], ("x", "y"), axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8, 2), "int32"), lax_check_vma=False)


@needs_runtime
def test_groups_over_one_axis_of_a_2d_mesh():
    """Over "y" (size 4) with groups [[0], [1, 2, 3]] in each row of "x"."""
    groups = [[3], [1, 0, 2]]
    fn = lambda lib: lambda v: lib.pmax(v[0], "y", axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8, 3), "float32"))


def test_lowering_pads_smaller_groups():
    mesh = mesh_1d()
    text = lowered_text(
        lambda v: jax_rccl.psum(v, "i", axis_index_groups=GROUPS[0]), mesh, jnp.zeros((8, 2))
    )
    (call,) = custom_calls(text, "all_reduce")
    assert "group_size = 5" in call
    assert "0, 1, 2, -1, -1, 3, 4, 5, 6, 7" in call


@pytest.mark.parametrize(
    "call",
    [
        lambda g: jax_rccl.all_gather(jnp.zeros(2), "i", axis_index_groups=g),
        lambda g: jax_rccl.psum_scatter(jnp.zeros(8), "i", axis_index_groups=g, tiled=True),
        lambda g: jax_rccl.all_to_all(jnp.zeros(8), "i", 0, 0, axis_index_groups=g, tiled=True),
        lambda g: jax_rccl.preduce(jnp.zeros(2), "i", 0, axis_index_groups=g),
    ],
    ids=["all_gather", "psum_scatter", "all_to_all", "preduce"],
)
def test_data_movement_refuses_unequal_groups(call):
    """Their result's shape depends on the group size (jax.lax fails on them too: XLA's
    verifier rejects the padded groups, or "Replica groups must be equally sized")."""
    mesh = mesh_1d()
    fn = jax.jit(
        jax.shard_map(lambda v: call(GROUPS[0]), mesh=mesh, in_specs=jax.P("i"), out_specs=jax.P())
    )
    with pytest.raises(ValueError, match="must all be the same size .* groups of unequal sizes"):
        fn.lower(jnp.zeros(8))
