"""jax_rccl.pbroadcast (next to jax.lax.pbroadcast) and jax_rccl.preduce on 8 CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import (
    assert_same,
    assert_same_types,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    mixed_tree,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl


def test_types_match_lax():
    assert_same_types(
        lambda lib: lambda v: lib.pbroadcast(v, "i", 3), mesh_1d(), sample((8 * 2,), "float32")
    )


@needs_runtime
@pytest.mark.parametrize("source", [0, 5, 7])
def test_pbroadcast(source):
    tree = mixed_tree("uint8")
    got = per_device(lambda t: jax_rccl.pbroadcast(t, "i", source), mesh_1d())(tree)
    # jax.lax.pbroadcast lowers only on GPU: compare with the source's slice.
    want = jax.tree_util.tree_map(
        lambda v: jnp.broadcast_to(
            v.reshape(8, v.shape[0] // 8, *v.shape[1:])[source], (8, v.shape[0] // 8, *v.shape[1:])
        ),
        tree,
    )
    assert_same(got, want)


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "y"])
def test_pbroadcast_2d_mesh(axes):
    mesh, x = mesh_2d(), sample((8 * 3,), "int32")
    got = per_device(lambda v: jax_rccl.pbroadcast(v, axes, 1), mesh)(x)
    want = per_device(lambda v: lax.psum(jnp.where(lax.axis_index(axes) == 1, v, 0), axes), mesh)(x)
    assert_same(got, want)


@needs_runtime
@pytest.mark.parametrize("root", [0, 6])
def test_preduce(root):
    mesh = mesh_1d()
    tree = {
        "f": sample((8 * 3, 2), "float32"),
        "i": sample((8 * 1001,), "int16"),
        "c": sample((8,), "complex64"),
        "empty": jnp.zeros((8, 0), jnp.float32),
    }
    tree = maybe_empty(tree)
    got = per_device(lambda t: jax_rccl.preduce(t, "i", root), mesh)(tree)
    want = per_device(
        lambda t: jax.tree_util.tree_map(
            lambda v: jnp.where(lax.axis_index("i") == root, lax.psum(v, "i"), jnp.zeros_like(v)), t
        ),
        mesh,
    )(tree)
    assert_same(got, want)


@needs_runtime
def test_preduce_axis_index_groups():
    mesh, x = mesh_1d(), sample((8 * 2,), "float32")
    groups = [[3, 2, 1, 0], [4, 5, 6, 7]]
    got = np.asarray(
        per_device(lambda v: jax_rccl.preduce(v, "i", 1, axis_index_groups=groups), mesh)(x)
    )
    xs = np.asarray(x).reshape(8, 2)
    want = np.zeros_like(xs)
    want[2], want[5] = xs[:4].sum(0), xs[4:].sum(0)
    np.testing.assert_array_equal(got, want)
