"""jax_rccl.all_to_all next to jax.lax.all_to_all under jit(shard_map) on 8 CPU devices."""

import jax.numpy as jnp
import pytest
from collectives_util import (
    assert_same,
    assert_same_types,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

# (split_axis, concat_axis, tiled) on a per-device [8, 8, 3] block
CASES = [
    (0, 0, False),
    (0, 1, False),
    (1, 0, False),
    (0, 2, False),
    (1, 2, False),
    (0, 0, True),
    (0, 1, True),
    (1, 0, True),
    (1, 2, True),
    (-2, -1, True),
]


def _x():
    return sample((8 * 8, 8, 3), "float32")


def _fn(lib, case):
    s, c, tiled = case
    if lib is lax:  # jax 0.10.2's all_to_all crashes XLA on negative axes (0.11 normalizes)
        s, c = s % 3, c % 3
    return lambda v: lib.all_to_all(v, "i", s, c, tiled=tiled)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_types_match_lax(case):
    assert_same_types(lambda lib: _fn(lib, case), mesh_1d(), _x())


@needs_runtime
@pytest.mark.parametrize("case", CASES, ids=str)
def test_split_and_concat_axes(case):
    mesh, x = mesh_1d(), _x()
    assert_same(per_device(_fn(jax_rccl, case), mesh)(x), per_device(_fn(lax, case), mesh)(x))


@needs_runtime
def test_dtypes_pytree_and_sizes():
    mesh = mesh_1d()
    tree = {
        "b": sample((8 * 8,), "bool"),
        "c": sample((8 * 8, 2), "complex64"),
        "i16": sample((8 * 16, 3), "int16"),
        "empty": jnp.zeros((8 * 8, 0), jnp.float32),
        "odd": sample((8 * 8, 77), "bfloat16"),
    }
    tree = maybe_empty(tree)
    fn = lambda lib: lambda t: lib.all_to_all(t, "i", 0, 0, tiled=True)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(tree), per_device(fn(lax), mesh)(tree))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "y"])
def test_2d_mesh(axes):
    mesh = mesh_2d()
    x = sample((8 * 8, 2), "int32")
    fn = lambda lib: lambda v: lib.all_to_all(v, axes, 0, 1, tiled=True)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(x), per_device(fn(lax), mesh)(x))


@needs_runtime
def test_axis_index_groups():
    mesh, x = mesh_1d(), sample((8 * 4, 3), "float32")
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    fn = lambda lib: lambda v: lib.all_to_all(v, "i", 0, 0, axis_index_groups=groups)  # noqa: E731
    assert_same(per_device(fn(jax_rccl), mesh)(x), per_device(fn(lax), mesh)(x))
