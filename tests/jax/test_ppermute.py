"""jax_rccl.ppermute next to jax.lax.ppermute under jit(shard_map) on 8 CPU devices."""

import numpy as np
import pytest
from collectives_util import (
    assert_like_lax,
    assert_same,
    lax_twin_tests,
    mesh_1d,
    mesh_2d,
    mixed_tree,
    needs_runtime,
    per_device,
    sample,
)
from jax import lax

import jax_rccl

PERMS = {
    "shift": [(j, (j + 1) % 8) for j in range(8)],
    "swap_pairs": [(j, j ^ 1) for j in range(8)],
    "partial": [(0, 3), (3, 5), (6, 0)],  # devices without a sender get zeros
    "identity": [(j, j) for j in range(8)],
    "empty": [],
}


test_types_match_lax, test_permutations = lax_twin_tests(
    lambda lib, name: lambda v: lib.ppermute(v, "i", PERMS[name]),
    list(PERMS),
    lambda: sample((8 * 2,), "float32"),
    lambda: mixed_tree("int8"),
)


@needs_runtime
@pytest.mark.parametrize("axes", [("x", "y"), "x", "y"])
def test_2d_mesh(axes):
    n = 8 if axes == ("x", "y") else (2 if axes == "x" else 4)
    perm = [(j, (j + 1) % n) for j in range(n)]
    fn = lambda lib: lambda v: lib.ppermute(v, axes, perm)  # noqa: E731
    assert_like_lax(fn, mesh_2d(), sample((8 * 3,), "float32"))


def _perm_forms(n):
    """The same permutation in every form jax.lax takes: any iterable of integer pairs."""
    src, dst = list(range(n)), [(j + 3) % n for j in range(n)]
    return {
        "list": lambda: [(s, d) for s, d in zip(src, dst, strict=True)],
        "zip": lambda: zip(src, dst, strict=True),
        "generator": lambda: ((s, (s + 3) % n) for s in range(n)),
        "ndarray": lambda: np.stack([src, dst], axis=1),
        "int32 rows": lambda: [np.asarray(p, np.int32) for p in zip(src, dst, strict=True)],
        "numpy ints": lambda: [(np.int64(s), np.uint8(d)) for s, d in zip(src, dst, strict=True)],
        "dict items": lambda: dict(zip(src, dst, strict=True)).items(),
    }


@needs_runtime
@pytest.mark.parametrize("form", list(_perm_forms(8)))
def test_perm_as_any_iterable_of_pairs(form):
    mesh, x = mesh_1d(), sample((8 * 3,), "float32")
    make = _perm_forms(8)[form]  # a fresh iterator per call: a generator is used up once read
    fn = lambda lib: lambda v: lib.ppermute(v, "i", make())  # noqa: E731
    want = per_device(fn(lax), mesh)(x)
    assert_same(per_device(fn(jax_rccl), mesh)(x), want)
    assert_same(per_device(lambda v: lax.ppermute(v, "i", _perm_forms(8)["list"]()), mesh)(x), want)
