"""jax.export of programs holding jax_rccl collectives on 8 CPU devices: serialized,
deserialized and called (results against the same program written with jax.lax), with
symbolic dimensions, and for several platforms at once."""

import jax
import jax.numpy as jnp
import pytest
from collectives_util import (
    all_axes,
    assert_same,
    mesh_1d,
    mesh_2d,
    needs_runtime,
    per_device,
    sample,
)
from jax import export, lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jax_rccl
from jax_rccl import _ffi

RING = [(j, (j + 1) % 8) for j in range(8)]

# Collectives over "i" of a per-device block [8 k, 4] (the result has any shape).
BODIES = {
    "psum": lambda lib: lambda v: lib.psum(v, "i"),
    "pmax": lambda lib: lambda v: lib.pmax(v, "i"),
    "pmin": lambda lib: lambda v: lib.pmin(v, "i"),
    "pmean": lambda lib: lambda v: lib.pmean(v, "i"),
    "all_gather": lambda lib: lambda v: lib.all_gather(v, "i", axis=1, tiled=True),
    "all_gather_stacked": lambda lib: lambda v: lib.all_gather(v, "i"),
    "psum_scatter": lambda lib: lambda v: lib.psum_scatter(v, "i", tiled=True),
    "all_to_all": lambda lib: lambda v: lib.all_to_all(v, "i", 0, 1, tiled=True),
    "ppermute": lambda lib: lambda v: lib.ppermute(v, "i", RING),
    "pytree": lambda lib: lambda v: lib.psum({"a": v, "b": v[:1].astype(jnp.int32)}, "i"),
    "sequence": lambda lib: (
        lambda v: lib.all_gather(lib.ppermute(lib.psum(v, "i") * v, "i", RING), "i", tiled=True)
    ),
}


def _export(fn, *args, **kw):
    return export.export(fn, disabled_checks=jax_rccl.export_checks(), **kw)(*args)


def _call(exp, mesh, *args):
    """The exported program called on `args` split over the mesh's devices (as exported)."""
    spec = NamedSharding(mesh, P(all_axes(mesh)))
    return exp.call(*jax.device_put(args, spec))


def _round_trip(exp):
    blob = exp.serialize()
    assert isinstance(blob, (bytes, bytearray)) and blob
    return export.deserialize(blob)


def test_export_checks_name_every_target():
    checks = jax_rccl.export_checks()
    assert all(isinstance(c, export.DisabledSafetyCheck) for c in checks)
    names = {c.is_custom_call() for c in checks}
    assert set(_ffi.TARGETS) <= names
    assert all(n.startswith("jax_rccl_") for n in names)


@needs_runtime
def test_export_needs_no_disabled_checks():
    """The targets are registered with jax.export as stable (a versioned contract)."""
    mesh, x = mesh_1d(), sample((64, 4), "float32")
    fn = per_device(BODIES["psum"](jax_rccl), mesh)
    assert "jax_rccl_all_reduce" in export.export(fn)(x).mlir_module()


@needs_runtime
@pytest.mark.parametrize("name", sorted(BODIES))
def test_round_trip_matches_lax(name):
    mesh, x = mesh_1d(), sample((8 * 16, 4), "float32")
    exp = _export(per_device(BODIES[name](jax_rccl), mesh), x)
    assert "jax_rccl_" in exp.mlir_module()
    got = _call(_round_trip(exp), mesh, x)
    want = per_device(BODIES[name](lax), mesh)(x)
    assert_same(got, want)


@needs_runtime
def test_round_trip_2d_mesh_and_dtypes():
    mesh = mesh_2d()
    tree = {
        "f": sample((8 * 4, 3), "float32"),
        "i": sample((8 * 4,), "int32"),
        "bf": sample((8 * 2, 2), "bfloat16"),
        "c": sample((8, 2), "complex64"),
        "b": sample((8 * 2,), "bool"),
    }

    def body(lib):
        def f(t):
            return {
                "sum": lib.psum(t, "y"),
                "gather": lib.all_gather(t["f"], ("x", "y"), tiled=True),
                "max": lib.pmax(t["i"], ("x", "y")),
            }

        return f

    exp = _export(per_device(body(jax_rccl), mesh), tree)
    assert_same(_call(_round_trip(exp), mesh, tree), per_device(body(lax), mesh)(tree))


@needs_runtime
def test_round_trip_of_a_gradient():
    mesh, x = mesh_1d(), sample((8 * 4, 4), "float32")

    def grad_of(lib):
        def loss(v):
            return (lib.psum(v * v, "i") * lib.all_gather(v, "i", tiled=True)[:4]).sum()

        return jax.jit(jax.grad(lambda v: per_device(loss, mesh)(v).sum()))

    exp = _export(grad_of(jax_rccl), x)
    assert_same(_call(_round_trip(exp), mesh, x), grad_of(lax)(x))


# --- symbolic dimensions -------------------------------------------------------------------------
# jax 0.10's Shardy partitioner cannot refine the shapes of a shard_map body when the exported
# program is called ("'sdy.manual_computation' op has dynamic shapes"), for jax.lax's
# collectives as for ours; GSPMD can.


@pytest.fixture
def gspmd():
    before = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    yield
    jax.config.update("jax_use_shardy_partitioner", before)


SYMBOLIC = ["psum", "pmax", "pmean", "all_gather", "all_gather_stacked", "psum_scatter"]
SYMBOLIC += ["all_to_all", "ppermute", "pytree", "sequence"]


@needs_runtime
@pytest.mark.parametrize("name", SYMBOLIC)
def test_symbolic_leading_dimension(name, gspmd):
    """One export with a block of 8 b rows per device, called with b = 1 and b = 3."""
    mesh = mesh_1d()
    (b,) = export.symbolic_shape("b")
    spec = jax.ShapeDtypeStruct((64 * b, 4), jnp.float32)
    exp = _round_trip(_export(per_device(BODIES[name](jax_rccl), mesh), spec))
    for rows in (1, 3):
        x = sample((64 * rows, 4), "float32", seed=rows)
        assert_same(_call(exp, mesh, x), per_device(BODIES[name](lax), mesh)(x))


@needs_runtime
def test_symbolic_trailing_dimensions(gspmd):
    mesh = mesh_2d()
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("8, m, n"), jnp.float32)

    def body(lib):
        return lambda v: (lib.psum(v, "x"), lib.all_gather(v, ("x", "y"), axis=2, tiled=True))

    exp = _round_trip(_export(per_device(body(jax_rccl), mesh), spec))
    for shape in ((8, 1, 1), (8, 3, 5)):
        x = sample(shape, "float32", seed=shape[1])
        assert_same(_call(exp, mesh, x), per_device(body(lax), mesh)(x))


def test_symbolic_size_that_must_be_static_names_it():
    """A symbolic dimension that must equal (or divide by) the group size is refused with the
    argument named, never a bare InconclusiveDimensionOperation."""
    mesh = mesh_1d()
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("8*b, c"), jnp.float32)
    fn = per_device(lambda v: jax_rccl.psum_scatter(v, "i", scatter_dimension=1, tiled=True), mesh)
    with pytest.raises(ValueError, match="scatter_dimension 1 .* symbolic"):
        _export(fn, spec)
    fn = per_device(lambda v: jax_rccl.all_to_all(v, "i", 1, 0), mesh)
    with pytest.raises(ValueError, match="split_axis 1 .* symbolic"):
        _export(fn, spec)


# --- several platforms ---------------------------------------------------------------------------


@needs_runtime
@pytest.mark.parametrize("name", ["psum", "all_gather", "sequence"])
def test_multi_platform_export_runs_on_cpu(name):
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    exp = _export(per_device(BODIES[name](jax_rccl), mesh), x, platforms=("cpu", "cuda"))
    assert exp.platforms == ("cpu", "cuda")
    assert "stablehlo.case" not in exp.mlir_module()  # the calls stay chained in program order
    assert_same(_call(_round_trip(exp), mesh, x), per_device(BODIES[name](lax), mesh)(x))


@needs_runtime
@pytest.mark.parametrize("platforms", [("cuda",), ("rocm",), ("cuda", "rocm")])
def test_gpu_export_lowers_without_a_gpu(platforms):
    """Lowering for a GPU platform needs neither a GPU nor the GPU runtime here: the program
    is compiled where it is called."""
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    fn = per_device(BODIES["sequence"](jax_rccl), mesh)
    exp = _round_trip(_export(fn, x, platforms=platforms))
    assert exp.platforms == platforms
    text = exp.mlir_module()
    for kind in ("all_reduce", "ppermute", "all_gather"):
        # one rule for every platform: each call once, not one copy per platform
        assert text.count(f"@jax_rccl_{kind}(") == 1, text


def test_export_for_a_platform_without_runtime_uses_xla_there():
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    fn = per_device(BODIES["psum"](jax_rccl), mesh)
    text = _export(fn, x, platforms=("cpu", "tpu")).mlir_module()
    assert "jax_rccl_all_reduce" in text and "stablehlo.all_reduce" in text


def test_export_of_preduce_for_a_platform_without_runtime_names_it():
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    fn = per_device(lambda v: jax_rccl.preduce(v, "i", 0), mesh)
    with pytest.raises(NotImplementedError, match="no jax_rccl runtime for platform"):
        _export(fn, x, platforms=("cpu", "tpu"))


@needs_runtime
def test_exported_call_with_explicit_shardings():
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    x = jax.device_put(x, NamedSharding(mesh, P("i")))
    exp = _round_trip(_export(per_device(BODIES["all_to_all"](jax_rccl), mesh), x))
    got = jax.jit(exp.call)(x)
    assert_same(got, per_device(BODIES["all_to_all"](lax), mesh)(x))
    assert got.sharding.is_equivalent_to(NamedSharding(mesh, P("i")), got.ndim)


def test_per_device_premul_exports_for_cpu_and_gpus():
    """A per-device premul scalar runs on both runtimes (GPU kernels read it from device memory):
    it exports for CPU and CUDA together, and the CPU round trip matches the scaled sum."""
    mesh, x = mesh_1d(), sample((8 * 8, 4), "float32")
    fn = per_device(lambda v: jax_rccl.all_reduce(v, "i", premul=v[0, 0]), mesh)
    exp = _round_trip(_export(fn, x, platforms=("cpu", "cuda")))
    assert "@jax_rccl_all_reduce(" in exp.mlir_module()
    assert_same(_call(exp, mesh, x), fn(x))


@needs_runtime
@pytest.mark.parametrize("name", ["all_gather", "psum"])
def test_called_in_another_device_order_is_an_error(name):
    """The program holds the devices of its mesh: called on the same devices in another mesh
    order it fails naming the partition and both devices, never returns blocks in the wrong
    order; in the exported order it runs."""
    x = sample((8 * 8, 4), "float32")
    exp = _round_trip(_export(per_device(BODIES[name](jax_rccl), mesh_1d()), x))
    assert_same(_call(exp, mesh_1d(), x), per_device(BODIES[name](lax), mesh_1d())(x))
    with pytest.raises(Exception, match=r"partition \d+ .*device \d+.*device \d+"):
        jax.block_until_ready(_call(exp, mesh_1d(order=list(range(8))[::-1]), x))
