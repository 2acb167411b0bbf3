"""Bad arguments fail at trace time with an error naming the argument."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import mesh_1d, mesh_2d, per_device

import jax_rccl


def _trace(fn, shape=(8 * 8, 8), dtype=jnp.float32, mesh=None):
    jax.eval_shape(per_device(fn, mesh or mesh_1d()), jax.ShapeDtypeStruct(shape, dtype))


def test_unknown_axis_name_lists_bound_names():
    with pytest.raises(NameError, match=r"'j'.*bound axis names: \('i',\)"):
        _trace(lambda v: jax_rccl.psum(v, "j"))
    with pytest.raises(NameError, match=r"'z'.*\('x', 'y'\)"):
        _trace(lambda v: jax_rccl.all_gather(v, ("x", "z")), mesh=mesh_2d())
    with pytest.raises(NameError, match="none"):
        jax.eval_shape(lambda v: jax_rccl.psum(v, "i"), jnp.zeros(3))


@pytest.mark.parametrize(
    "perm, match",
    [
        ([(0, 1), (0, 2)], "repeats a source"),
        ([(0, 1), (2, 1)], "repeats a destination"),
        ([(0, 8)], "outside the axis"),
        ("01", "iterable of"),
        (3, "iterable of"),
        ([(0, 1, 2)], "perm must hold"),
        ([(0.7, 1), (1, 0)], r"perm.*0\.7"),  # once truncated to (0, 1)
        ([(0, 1.0), (1, 0)], "perm.*float"),
        (np.array([[0.0, 1.0], [1.0, 0.0]]), "perm.*float"),
        ([(True, 0)], "perm.*bool"),
    ],
)
def test_bad_permutation(perm, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _trace(lambda v: jax_rccl.ppermute(v, "i", perm))


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda v: jax_rccl.all_to_all(v, "i", 2, 0), "split_axis=2"),
        (lambda v: jax_rccl.all_to_all(v, "i", 0, -3), "concat_axis=-3"),
        (lambda v: jax_rccl.psum_scatter(v, "i", scatter_dimension=5), "scatter_dimension=5"),
        (lambda v: jax_rccl.all_gather(v, "i", axis=3), "axis=3"),
        (lambda v: jax_rccl.all_gather(v, "i", axis=2, tiled=True), "axis=2"),
        (lambda v: jax_rccl.all_to_all(v, "i", 0.5, 0), "split_axis must be an int"),
    ],
)
def test_bad_axis_arguments(fn, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _trace(fn)


@pytest.mark.parametrize(
    "fn, match",
    [
        (
            lambda v: jax_rccl.psum_scatter(v[:3], "i", tiled=True),
            "not divisible by the group size 8",
        ),
        (lambda v: jax_rccl.psum_scatter(v[:4], "i"), "must equal the group size 8"),
        (lambda v: jax_rccl.all_to_all(v[:6], "i", 0, 1, tiled=True), "not divisible"),
        (lambda v: jax_rccl.all_to_all(v[:6], "i", 0, 1), "must equal the group size 8"),
        (lambda v: jax_rccl.psum_scatter(v[0, 0], "i"), "scalar"),
    ],
)
def test_non_divisible_dimensions(fn, match):
    with pytest.raises(ValueError, match=match):
        _trace(fn)


def test_unsupported_dtypes():
    with pytest.raises(TypeError, match="complex values support only"):
        _trace(lambda v: jax_rccl.pmax(v * 1j, "i"))
    with pytest.raises(TypeError, match="complex values support only"):
        _trace(lambda v: jax_rccl.all_reduce(v * 1j, "i", op="prod"))


def test_bad_premul_and_op():
    with pytest.raises(TypeError, match="premul needs floating leaves; leaf 1 has dtype int32"):
        _trace(lambda v: jax_rccl.all_reduce((v, v.astype(jnp.int32)), "i", premul=2.0))
    with pytest.raises(ValueError, match="op='sum' only"):
        _trace(lambda v: jax_rccl.all_reduce(v, "i", op="max", premul=2.0))
    with pytest.raises(ValueError, match="op='mean' is not one of"):
        _trace(lambda v: jax_rccl.all_reduce(v, "i", op="mean"))
    with pytest.raises(ValueError, match="premul must be a scalar"):
        _trace(lambda v: jax_rccl.all_reduce(v, "i", premul=v[0]))


@pytest.mark.parametrize(
    "fn, match",
    [
        (lambda v: jax_rccl.pbroadcast(v, "i", 1.0), "source must be an int"),
        (lambda v: jax_rccl.pbroadcast(v, "i", np.float32(2)), "source must be an int"),
        (lambda v: jax_rccl.preduce(v, "i", 0.7), "root must be an int"),
        (
            lambda v: jax_rccl.psum(v, "i", axis_index_groups=[[0.5, 1, 2, 3], [4, 5, 6, 7]]),
            r"axis_index_groups.*0\.5",
        ),
        (
            lambda v: jax_rccl.all_gather(v, "i", axis_index_groups=np.arange(8.0).reshape(2, 4)),
            "axis_index_groups.*float",
        ),
        (
            lambda v: jax_rccl.psum_scatter(v, "i", scatter_dimension=1.0),
            "scatter_dimension must be an int",
        ),
        (lambda v: jax_rccl.all_gather(v, "i", axis=np.float64(0)), "axis must be an int"),
    ],
)
def test_float_integer_arguments_are_refused(fn, match):
    """Integer arguments given as floats fail at trace time, never truncated."""
    with pytest.raises(TypeError, match=match):
        _trace(fn)


def test_integer_arguments_of_numpy_types():
    groups = np.arange(8).reshape(2, 4)
    _trace(lambda v: jax_rccl.psum(v, "i", axis_index_groups=groups))
    _trace(lambda v: jax_rccl.pbroadcast(v, "i", np.int32(3)))
    _trace(lambda v: jax_rccl.preduce(v, "i", np.uint8(7)))


def test_bad_axis_index_groups_and_roots():
    with pytest.raises(ValueError, match="cover all indices 0..7"):
        _trace(lambda v: jax_rccl.psum(v, "i", axis_index_groups=[[0, 1], [2, 3]]))
    with pytest.raises(ValueError, match="same size"):
        _trace(
            lambda v: jax_rccl.all_gather(v, "i", axis_index_groups=[[0, 1, 2], [3, 4, 5, 6, 7]])
        )
    with pytest.raises(ValueError, match="source=8 is outside the group of size 8"):
        _trace(lambda v: jax_rccl.pbroadcast(v, "i", 8))
    with pytest.raises(ValueError, match="root=2 is outside the group of size 2"):
        _trace(
            lambda v: jax_rccl.preduce(v, "i", 2, axis_index_groups=[[j, j + 4] for j in range(4)])
        )


def test_other_platforms_are_refused_at_lowering():
    fn = per_device(lambda v: jax_rccl.psum(v, "i"), mesh_1d())
    traced = fn.trace(np.zeros(8, np.float32))
    with pytest.raises(NotImplementedError, match=r"platform\(s\) \('cuda',\)"):
        traced.lower(lowering_platforms=("cuda",))


def test_config_rejects_unknown_names_at_once():
    with pytest.raises(ValueError, match="unknown name 'Rnig'"):
        with jax_rccl.config(algorithm="Rnig"):
            pass
    with pytest.raises(ValueError, match="leaves nothing"):
        with jax_rccl.config(protocol="^LL,LL128,Simple"):
            pass
