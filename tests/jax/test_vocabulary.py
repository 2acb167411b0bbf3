"""The names the Python package uses (reduction ops, dtypes, collective kinds) are the native
side's: the package takes them from the native module, and both sides accept the same ones."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import custom_calls, lowered_text, mesh_1d
from jax.sharding import PartitionSpec

import jax_rccl
from jax_rccl import _export, _ffi, _jax_rccl, _ragged, lowering, planner
from jax_rccl import primitives as P

NATIVE_OPS = tuple(_jax_rccl.reduction_ops())
NATIVE_DTYPES = tuple(_jax_rccl.dtypes())
NATIVE_KINDS = tuple(_jax_rccl.collective_kinds())
TOPO = planner.Topology.preset("mi300x-8")


def test_native_vocabularies_are_names_without_repeats():
    for names in (NATIVE_OPS, NATIVE_DTYPES, NATIVE_KINDS):
        assert names and all(isinstance(n, str) and n for n in names)
        assert len(set(names)) == len(names)


def test_reduction_ops_and_their_codes():
    # The FFI contract's `op` attribute (docs/architecture.md): 0 sum, 1 prod, 2 max, 3 min, 4 avg.
    assert NATIVE_OPS == ("sum", "prod", "max", "min", "avg")
    assert P.OPS == NATIVE_OPS
    assert planner.OPS == NATIVE_OPS
    assert lowering.OP_CODES == {op: i for i, op in enumerate(NATIVE_OPS)}


def test_primitive_dtypes_are_the_native_ones_less_the_converted():
    names = {np.dtype(d).name for d in P.SUPPORTED_DTYPES}
    assert names <= set(NATIVE_DTYPES)
    assert names == set(NATIVE_DTYPES) - P.CONVERTED_DTYPES
    assert P.CONVERTED_DTYPES <= set(NATIVE_DTYPES)


def test_kinds_are_the_primitives_and_the_targets():
    prims = {p.name for p in (*P.ALL_PRIMITIVES, _ragged.ragged_all_to_all_p)}
    assert prims == {f"jax_rccl_{k}" for k in NATIVE_KINDS}
    assert _ffi.TARGETS == tuple(f"jax_rccl_{k}" for k in NATIVE_KINDS)
    assert set(_ffi.TARGETS) <= set(_jax_rccl.cpu_ffi_targets())
    assert set(_ffi.TARGETS) <= set(_export.target_names())


@pytest.mark.parametrize("op", NATIVE_OPS)
def test_every_native_op_is_accepted(op):
    text = lowered_text(
        lambda v: jax_rccl.all_reduce(v, "i", op=op), mesh_1d(), jnp.ones((8, 4), jnp.float32)
    )
    assert len(custom_calls(text, "all_reduce")) == 1
    p = planner.plan([planner.Task("all_reduce", 64, "float32", op=op)], TOPO)
    assert p.to_dict()["tasks"]


@pytest.mark.parametrize("dtype", NATIVE_DTYPES)
def test_every_native_dtype_moves_and_sums(dtype):
    with jax.enable_x64(np.dtype(dtype).itemsize == 8):
        x = jnp.ones((8, 4), jnp.dtype(dtype))
        assert x.dtype == np.dtype(dtype)
        for fn, kind in (
            (lambda v: jax_rccl.psum(v, "i"), "all_reduce"),
            (lambda v: jax_rccl.all_gather(v, "i"), "all_gather"),
        ):
            assert len(custom_calls(lowered_text(fn, mesh_1d(), x), kind)) == 1
    planner.plan([planner.Task("all_gather", 64, dtype)], TOPO)


def test_unknown_op_lists_the_allowed_ones():
    allowed = ".*".join(NATIVE_OPS)
    with pytest.raises(ValueError, match=f"'bogus'.*{allowed}"):
        jax.eval_shape(
            jax.shard_map(
                lambda v: jax_rccl.all_reduce(v, "i", op="bogus"),
                mesh=mesh_1d(),
                in_specs=PartitionSpec("i"),
                out_specs=PartitionSpec("i"),
            ),
            jax.ShapeDtypeStruct((8,), jnp.float32),
        )
    with pytest.raises(ValueError, match=f"{', '.join(NATIVE_OPS)}.*'bogus'"):
        planner.Task("all_reduce", 4, op="bogus")
