"""jax_rccl.all_to_all next to jax.lax.all_to_all under jit(shard_map) on 8 CPU devices."""

import jax.numpy as jnp
import pytest
from collectives_util import (
    assert_like_lax,
    lax_twin_tests,
    maybe_empty,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    sample,
)
from jax import lax

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


test_types_match_lax, test_split_and_concat_axes = lax_twin_tests(_fn, CASES, _x)


@needs_runtime
def test_dtypes_pytree_and_sizes():
    tree = {
        "b": sample((8 * 8,), "bool"),
        "c": sample((8 * 8, 2), "complex64"),
        "i16": sample((8 * 16, 3), "int16"),
        "empty": jnp.zeros((8 * 8, 0), jnp.float32),
        "odd": sample((8 * 8, 77), "bfloat16"),
    }
    fn = lambda lib: lambda t: lib.all_to_all(t, "i", 0, 0, tiled=True)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), maybe_empty(tree))


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "y"])
def test_2d_mesh(axes):
    fn = lambda lib: lambda v: lib.all_to_all(v, axes, 0, 1, tiled=True)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 8, 2), "int32"))


@needs_runtime
def test_axis_index_groups():
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    fn = lambda lib: lambda v: lib.all_to_all(v, "i", 0, 0, axis_index_groups=groups)  # noqa: E731
    assert_like_lax(fn, mesh_1d(), sample((8 * 4, 3), "float32"))
