"""jax_rccl.psum / pmean next to jax.lax under jit(shard_map) on 8 CPU devices."""

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

DTYPES = "float32 float16 bfloat16 int8 uint8 int16 uint16 int32 uint32 bool complex64".split()


def _tree(shape):
    return {dt: sample(shape, dt, seed=i) for i, dt in enumerate(DTYPES)}


@needs_runtime
@pytest.mark.parametrize("algorithm", ["", "Ring", "Tree"])
def test_psum_every_dtype_in_one_call(algorithm):
    mesh = mesh_1d()
    tree = _tree((8 * 5, 3))  # 5x3 per device; every dtype of one pytree in one call
    with jax_rccl.config(algorithm=algorithm):
        got = per_device(lambda t: jax_rccl.psum(t, "i"), mesh)(tree)
    want = per_device(lambda t: lax.psum(t, "i"), mesh)(tree)
    assert_same(got, want)


def test_pytree_is_one_grouped_call():
    text = lowered_text(lambda t: jax_rccl.psum(t, "i"), mesh_1d(), _tree((8 * 2,)))
    calls = custom_calls(text, "all_reduce")
    assert len(calls) == 1, calls
    assert "has_side_effect" not in calls[0]
    assert "name = \"psum over ('i',)\"" in calls[0]


@needs_runtime
def test_psum_x64_dtypes():
    with jax.enable_x64(True):
        tree = {dt: sample((8 * 3,), dt) for dt in ("float64", "int64", "uint64", "complex128")}
        assert_like_lax(lambda lib: lambda t: lib.psum(t, "i"), mesh_1d(), tree)


@needs_runtime
@pytest.mark.parametrize("per_dev", [0, 1, 1001])
def test_psum_sizes(per_dev):
    x = sample((8 * per_dev,), "float32") if per_dev else jnp.zeros((8, 0), jnp.float32)
    assert_like_lax(lambda lib: lambda v: (lib.psum(v, "i"), lib.pmean(v, "i")), mesh_1d(), x)


@needs_runtime
def test_psum_large_16m():
    mesh = mesh_1d()
    n = 1 << 24  # elements per device

    def body(seed):
        v = (lax.iota(jnp.int32, n) % 1000 + seed[0]).astype(jnp.float32)
        a, b = jax_rccl.psum(v, "i"), lax.psum(v, "i")
        return jnp.stack([jnp.max(jnp.abs(a - b)), a[12345], b[n - 1]])

    out = np.asarray(per_device(body, mesh)(jnp.arange(8, dtype=jnp.int32)))
    assert out[:, 0].max() == 0.0
    np.testing.assert_array_equal(out[:, 1], 8 * 345 + 28)


@needs_runtime
def test_psum_scalars_and_constants():
    def body(v, lib):
        return lib.psum(v[0], "i"), lib.psum(1, "i"), lib.pmean(v[0], "i"), lib.psum(2.5, "i")

    assert_like_lax(lambda lib: lambda v: body(v, lib), mesh_1d(), jnp.arange(8.0))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "x", "y", ("y", "x")])
def test_psum_2d_mesh(axes):
    fn = lambda lib: lambda v: (lib.psum(v, axes), lib.pmean(v, axes))  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 4, 3), "float32"))


@needs_runtime
@pytest.mark.parametrize("check_vma", [True, False])
def test_psum_axis_index_groups(check_vma):
    groups = [[0, 3, 5, 6], [1, 2, 4, 7]]
    fn = lambda lib: lambda v: lib.psum(v, "i", axis_index_groups=groups)  # noqa: E731
    x = sample((8 * 2,), "int32")
    # jax.lax's psum takes axis_index_groups only without check_vma.
    assert_like_lax(fn, mesh_1d(), x, check_vma=check_vma, lax_check_vma=False)


@needs_runtime
@pytest.mark.parametrize("check_vma", [True, False])
def test_psum_of_an_invariant_value(check_vma):
    def body(lib, v):
        c = jnp.full((3,), 2.0)  # not varying: jax.lax inserts a pvary first
        return lib.psum(c, "i") + 0 * v[0], lib.pmax(c, "i")

    fn = lambda lib: lambda v: body(lib, v)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), jnp.arange(8.0), check_vma=check_vma)


@needs_runtime
def test_mesh_in_a_scrambled_device_order():
    order = [5, 2, 7, 0, 3, 6, 1, 4]

    def fn(lib):
        return lambda v: (
            lib.psum(v, "i"),
            lib.all_gather(v, "i"),
            lib.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]),
        )

    assert_like_lax(fn, mesh_1d(order), sample((8 * 4,), "float32"))


def test_replica_groups_are_physical_device_ids():
    order = [5, 2, 7, 0, 3, 6, 1, 4]
    text = lowered_text(lambda v: jax_rccl.psum(v, "i"), mesh_1d(order), jnp.zeros(8))
    (call,) = custom_calls(text, "all_reduce")
    assert "replica_groups = dense<[5, 2, 7, 0, 3, 6, 1, 4]>" in call, call
    assert "group_size = 8" in call
    text = lowered_text(
        lambda v: jax_rccl.psum(v, "y", axis_index_groups=[[0, 2], [1, 3]]), mesh_2d(), jnp.zeros(8)
    )
    (call,) = custom_calls(text, "all_reduce")
    # rows of the 2x4 mesh: [0 1 2 3], [4 5 6 7]; groups {0,2},{1,3} of each row
    assert "replica_groups = dense<[0, 2, 1, 3, 4, 6, 5, 7]>" in call, call
    assert "group_size = 2" in call


def test_config_sets_algorithm_and_protocol_attributes():
    mesh, x = mesh_1d(), jnp.zeros(8)
    fn = per_device(lambda v: jax_rccl.psum(v, "i"), mesh)
    with jax_rccl.config(algorithm="Tree", protocol="LL"):
        text = fn.lower(x).as_text()
    (call,) = custom_calls(text, "all_reduce")
    assert 'algorithm = "Tree"' in call and 'protocol = "LL"' in call
    (call,) = custom_calls(fn.lower(x).as_text(), "all_reduce")
    assert 'algorithm = ""' in call and 'protocol = ""' in call
    two = per_device(lambda v: jax_rccl.psum(jax_rccl.psum(v, "i") * v, "i"), mesh)
    sites = [c.split("call_site = ")[1].split()[0] for c in custom_calls(two.lower(x).as_text())]
    assert len(sites) == 2 and sites[0] != sites[1], sites
