"""jax.export of jax_rccl programs: the versioned contract of the custom calls.

A program serialized by an earlier release (tests/jax/data: contract version 1, before the
`abi_version` attribute) keeps running; programs export with no `disabled_checks`; a program of
a newer contract version fails naming both versions; and under jax_rccl.install() an export for
a platform without a jax_rccl runtime keeps XLA's collective there."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_util import mesh_1d, needs_runtime
from jax import export, lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_rccl
from jax_rccl import lowering

pytestmark = needs_runtime

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def _x():
    return jnp.arange(64 * 3, dtype=jnp.float32).reshape(64, 3)


def _body(x):
    return (
        jax_rccl.psum(x, "i"),
        jax_rccl.all_gather(x, "i", tiled=True),
        jax_rccl.ppermute(x, "i", [(j, (j + 1) % 8) for j in range(8)]),
        jax_rccl.psum_scatter(x, "i", tiled=True),
    )


def _expected(x):
    blocks = np.asarray(x).reshape(8, 8, 3)
    total = blocks.sum(0)
    return (
        total,
        np.asarray(x),
        np.roll(blocks, 1, axis=0).reshape(64, 3),
        total.reshape(8, 1, 3).reshape(8, 3),
    )


def _call(exp, x):
    mesh = mesh_1d()
    return exp.call(jax.device_put(x, NamedSharding(mesh, P("i"))))


def _check(outs, x):
    for got, want in zip(outs, _expected(x), strict=True):
        np.testing.assert_array_equal(np.asarray(got), want)


def test_version_1_program_still_runs():
    with open(os.path.join(DATA, "abi_v1_collectives.jaxexport"), "rb") as f:
        exp = export.deserialize(bytearray(f.read()))
    text = exp.mlir_module()
    assert "jax_rccl_all_reduce" in text and "abi_version" not in text
    _check(_call(exp, _x()), _x())


def _jitted_body():
    return jax.jit(
        jax.shard_map(
            _body,
            mesh=mesh_1d(),
            in_specs=P("i"),
            out_specs=(P(), P(), P("i"), P("i")),
            check_vma=False,
        )
    )


def _exported():
    f = _jitted_body()
    return export.export(f)(_x())


def test_export_needs_no_disabled_checks():
    exp = _exported()
    assert f"abi_version = {lowering.ABI_VERSION} : i32" in exp.mlir_module()
    blob = exp.serialize()
    _check(_call(export.deserialize(blob), _x()), _x())


def test_a_newer_version_fails_naming_both():
    exp = _exported()
    text = exp.mlir_module().replace(
        f"abi_version = {lowering.ABI_VERSION} : i32", "abi_version = 99 : i32"
    )
    mesh = mesh_1d()
    from jax._src.interpreters import mlir as jmlir  # the module's text, compiled as it is

    del jmlir
    from jax._src.lib import xla_client

    del xla_client
    # Build the exported program anew around the edited module text.
    edited = exp.__class__(**{**exp.__dict__, "mlir_module_serialized": _serialize(text)})
    with pytest.raises(Exception, match=r"contract version 99.*runs versions 1 to 2"):
        jax.block_until_ready(edited.call(jax.device_put(_x(), NamedSharding(mesh, P("i")))))


def _serialize(text: str) -> bytes:
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib.mlir import ir

    with jmlir.make_ir_context():
        module = ir.Module.parse(text)
        return jmlir.module_to_bytecode(module)


def test_multi_platform_export_keeps_xla_where_no_runtime():
    """platforms=("cpu", "tpu"): jax_rccl's call for the CPU, XLA's all-reduce for the TPU."""
    mesh = mesh_1d()
    f = jax.jit(
        jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
    )
    with jax_rccl.install(platforms=("cpu",)):
        exp = export.export(f, platforms=("cpu", "tpu"))(_x())
    text = exp.mlir_module()
    assert "jax_rccl_all_reduce" in text and "stablehlo.all_reduce" in text
    np.testing.assert_array_equal(
        np.asarray(_call(exp, _x())), np.asarray(_x()).reshape(8, 8, 3).sum(0)
    )


def test_own_primitives_export_for_a_platform_without_runtime():
    """jax_rccl's own functions exported for ("cpu", "tpu"): XLA's collectives on the TPU."""
    f = _jitted_body()
    exp = export.export(f, platforms=("cpu", "tpu"))(_x())
    text = exp.mlir_module()
    assert "jax_rccl_all_reduce" in text
    for op in ("stablehlo.all_reduce", "stablehlo.all_gather", "stablehlo.collective_permute"):
        assert op in text, op
    _check(_call(exp, _x()), _x())


def test_grouped_call_exports_for_a_platform_without_runtime():
    """A pytree psum is one grouped call on the CPU and one XLA all-reduce per leaf elsewhere."""
    mesh = mesh_1d()
    f = jax.jit(
        jax.shard_map(
            lambda v: jax_rccl.psum((v, 2 * v), "i"), mesh=mesh, in_specs=P("i"), out_specs=P()
        )
    )
    exp = export.export(f, platforms=("cpu", "tpu"))(_x())
    assert exp.mlir_module().count("stablehlo.all_reduce") == 2
    a, b = _call(exp, _x())
    total = np.asarray(_x()).reshape(8, 8, 3).sum(0)
    np.testing.assert_array_equal(np.asarray(a), total)
    np.testing.assert_array_equal(np.asarray(b), 2 * total)


@pytest.mark.parametrize("kind", ["psum", "ppermute", "all_gather"])
def test_symbolic_shapes_under_install_keep_xla(kind):
    """jax.export with shape polymorphism of a jax.lax program under install(): XLA's collective
    (the custom call's results could not be refined inside shard_map's body), same results."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",))

    def body(b):
        if kind == "psum":
            return lax.psum(b, "x")
        if kind == "ppermute":
            return lax.ppermute(b, "x", [(0, 1), (1, 0)])
        return lax.all_gather(b, "x", tiled=True)

    out = P(None, None) if kind == "psum" else P("x", None)
    f = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("x", None), out_specs=out, check_vma=False)
    )
    a = np.arange(16, dtype=np.float32).reshape(4, 4)
    with jax_rccl.install(platforms=("cpu",)):
        exp = export.export(f)(*export.symbolic_args_specs((a,), "_,b2"))
        got = exp.call(jax.device_put(a, NamedSharding(mesh, P())))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(f(a)))


def test_the_lowering_writes_exactly_the_attributes_the_runtime_reads():
    """The attribute names are declared once on each side (ffi/handlers/common.h:
    JAX_RCCL_CALL_ATTRS; jax_rccl/lowering.py and _ragged.py): every call of a program holds
    exactly those."""
    from jax_rccl import _explain, _jax_rccl

    mesh = mesh_1d()

    def body(x, off, sizes):
        return (
            *_body(x),
            jax_rccl.pbroadcast(x, "i", 0),
            jax_rccl.ragged_all_to_all(x, jnp.zeros_like(x), off, sizes, off, sizes, axis_name="i"),
        )

    x = jax.device_put(_x(), NamedSharding(mesh, P("i")))
    off = jnp.zeros(64, jnp.int32)
    spec = (P("i"), P("i"), P("i"))
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P("i"), check_vma=False))
    module = f.lower(x, off, off).compiler_ir("stablehlo")
    calls = _explain.lowered_calls(module)
    assert len(calls) >= 6, calls
    names = set(_jax_rccl.call_attribute_names())
    for call in calls:
        assert set(call["attrs"]) == names, (call["kind"], sorted(call["attrs"]), sorted(names))
