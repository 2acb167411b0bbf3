"""jax_rccl's collectives through JAX on a GPU: the CUDA/ROCM FFI handlers.

On one GPU every group has one device, so each collective is the one-rank plan (device copies,
a scaled copy for premul/avg): every public collective inside jit(shard_map) over a 1-device
mesh against numpy, for f32/bf16/i32 at sizes 0, 1, odd and 1M, plus pytrees and grad. Then
command buffers: a training step holding jax_rccl collectives runs 1,000 times in a subprocess
(so XLA_FLAGS apply) with XLA's command buffers on (execute runs far fewer times than
calls x steps: captured once, replayed) and off (execute runs on every call), every result
checked. Multi-GPU groups are exercised only where the machine has several GPUs. Programs of the
subprocesses: worker_channels_gpu.py, worker_train_step_gpu.py, worker_premul_steps_gpu.py.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

os.environ.setdefault("JAX_RCCL_TIMEOUT", "60")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from gpu_launch import COMMAND_BUFFERS, run_worker  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_rccl  # noqa: E402


@functools.cache
def _gpu_runtime() -> bool:
    try:
        if jax.devices()[0].platform != "gpu":
            return False
        from jax_rccl import _ffi

        return _ffi.gpu_platform() is not None
    except Exception:  # noqa: BLE001 - no backend, or a CPU-only build
        return False


pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_gpu_runtime():
    # Checked per test, not at import: touching jax.devices() while pytest collects would start
    # the CPU backend before tests/jax/conftest.py asks for its 8 virtual devices.
    if not _gpu_runtime():
        pytest.skip("needs a GPU and a GPU build of jax_rccl")


DTYPES = [np.float32, jnp.bfloat16, np.int32]
SIZES = [0, 1, 1001, 1 << 20]


def _mesh(n=1) -> Mesh:
    return Mesh(np.array(jax.devices()[:n]), ("i",))


def _jit(fn, n=1):
    """jit(shard_map(fn)) over `n` GPUs, every argument and result split on its leading axis."""
    return jax.jit(jax.shard_map(fn, mesh=_mesh(n), in_specs=P("i"), out_specs=P("i")))


def _inputs(dtype, size, seed=0):
    rng = np.random.default_rng(seed)
    # Small integers: exact in every dtype, so sums and products compare bit for bit.
    return rng.integers(-3, 4, size=size).astype(np.float32).astype(dtype)


def _f64(a):
    return np.asarray(a).astype(np.float64)


def _all_collectives(x):
    """Every public collective on a 1-device mesh; the expected value of each is in _expected."""
    is_float = jnp.issubdtype(x.dtype, jnp.floating)
    out = {
        "psum": jax_rccl.psum(x, "i"),
        "pmax": jax_rccl.pmax(x, "i"),
        "pmin": jax_rccl.pmin(x, "i"),
        "prod": jax_rccl.all_reduce(x, "i", op="prod"),
        "avg": jax_rccl.all_reduce(x, "i", op="avg"),
        "preduce": jax_rccl.preduce(x, "i", 0),
        "pbroadcast": jax_rccl.pbroadcast(x, "i", 0),
        "all_gather": jax_rccl.all_gather(x, "i", tiled=True),
        "all_gather_untiled": jax_rccl.all_gather(x, "i")[0],
        "psum_scatter": jax_rccl.psum_scatter(x, "i", tiled=True),
        "all_to_all": jax_rccl.all_to_all(x, "i", 0, 0, tiled=True),
        "ppermute": jax_rccl.ppermute(x, "i", [(0, 0)]),
        "ppermute_none": jax_rccl.ppermute(x, "i", []),
    }
    if is_float:
        out["pmean"] = jax_rccl.pmean(x, "i")
        out["premul"] = jax_rccl.all_reduce(x, "i", premul=2.0)
    return out


def _expected(name, x):
    if name == "ppermute_none":
        return np.zeros_like(_f64(x))
    if name == "premul":
        return 2.0 * _f64(x)
    return _f64(x)  # one device: every collective returns its input


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("size", SIZES)
def test_every_collective_on_one_gpu(dtype, size):
    x = _inputs(dtype, size)
    outs = _jit(_all_collectives)(x)
    assert outs
    for name, got in outs.items():
        got = np.asarray(got)
        assert got.shape == x.shape, name
        assert got.dtype == np.dtype(dtype), name
        np.testing.assert_array_equal(_f64(got), _expected(name, x), err_msg=name)


def test_the_same_program_again_with_new_inputs():
    fn = _jit(lambda v: (jax_rccl.psum(v, "i") * 3, jax_rccl.all_gather(v, "i", tiled=True)))
    for seed in range(5):
        x = _inputs(np.float32, 4097, seed)
        a, b = fn(x)
        np.testing.assert_array_equal(np.asarray(a), 3 * x)
        np.testing.assert_array_equal(np.asarray(b), x)


def test_pytrees_of_mixed_leaves():
    tree = {
        "a": _inputs(np.float32, 17),
        "b": (_inputs(jnp.bfloat16, 1), _inputs(np.int32, 1 << 16)),
        "c": [_inputs(np.float32, 1001).reshape(1, 1001)],
    }
    out = _jit(lambda t: (jax_rccl.psum(t, "i"), jax_rccl.all_gather(t, "i", tiled=True)))(tree)
    for got in out:
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(tree), strict=True):
            assert np.asarray(g).dtype == np.asarray(w).dtype
            np.testing.assert_array_equal(_f64(g), _f64(w))


def test_grad_through_collectives():
    x = _inputs(np.float32, 1000) / 4

    def loss(v):
        y = jax_rccl.psum(v * v, "i") + jax_rccl.all_gather(v, "i", tiled=True)
        z = jax_rccl.ppermute(y, "i", [(0, 0)]) * jax_rccl.pmean(v, "i")
        return jnp.sum(z)

    def body(v):
        return jax.grad(loss)(v)

    got = np.asarray(_jit(body)(x))
    # loss = sum((v^2 + v) * v) = sum(v^3 + v^2): d/dv = 3 v^2 + 2 v
    np.testing.assert_allclose(got, 3 * x * x + 2 * x, rtol=1e-6, atol=1e-6)


# The leaf types a premul works on (floating, and complex as float pairs), as on the CPU path.
PREMUL_DTYPES = [np.float32, jnp.bfloat16, np.float16, np.complex64]


def _built(dtype) -> bool:
    """Whether this build's device code reduces over `dtype` (complex: over its parts' type); a
    development build (JAX_RCCL_DEVICE_QUICK) holds only a few types."""
    from jax_rccl import _jax_rccl

    d = np.dtype(dtype)
    if np.issubdtype(d, np.complexfloating):
        d = np.dtype(np.float32) if d == np.complex64 else np.dtype(np.float64)
    return bool(_jax_rccl.gpu.has_dtype(d.name))


def _skip_unless_built(*dtypes) -> None:
    missing = [np.dtype(d).name for d in dtypes if not _built(d)]
    if missing:
        pytest.skip(f"{', '.join(missing)} not in this device build")


def _premul_want(x, s):
    """x * s rounded once to x's type (PreMulSum rounds each product to the element type); s is
    exact in every premul type."""
    x = np.asarray(x)
    if np.iscomplexobj(x):
        return (x.astype(np.complex128) * float(s)).astype(x.dtype)
    return (x.astype(np.float32) * np.float32(s)).astype(x.dtype)


@pytest.mark.parametrize("dtype", PREMUL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("size", SIZES)
def test_premul_array_on_one_gpu(dtype, size):
    """A per-device premul scalar computed on the device (an array, not a Python number): the
    one-rank plan scales by the value the device holds when the kernel runs."""
    _skip_unless_built(dtype)
    x = _inputs(dtype, size)
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        x = x + 1j * _inputs(np.float32, size, seed=1).astype(dtype)
    k = np.array([3.0], np.float32)

    def body(v, c):
        s = c[0] * 0.5 - 0.25  # 1.25, on the device
        return jax_rccl.all_reduce(v, "i", premul=s), jax.lax.psum(v * s.astype(v.dtype), "i")

    got, ref = _jit(body)(x, k)
    want = _premul_want(x, 1.25)
    assert np.asarray(got).dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(ref))


def test_premul_array_over_a_pytree_of_mixed_leaves():
    _skip_unless_built(np.float32, jnp.bfloat16, np.float16)
    tree = {
        "a": _inputs(np.float32, 1001),
        "b": (_inputs(jnp.bfloat16, 17), _inputs(np.float16, 1)),
    }

    def body(t, c):
        return jax_rccl.all_reduce(t, "i", premul=c[0])

    got = _jit(body)(tree, np.array([-2.0], np.float32))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(tree), strict=True):
        np.testing.assert_array_equal(np.asarray(g), _premul_want(w, -2.0))


def test_runtime_stats_count_gpu_calls():
    jax_rccl.reset_runtime_stats()
    fn = _jit(lambda v: jax_rccl.psum(v, "i") + 1)
    x = np.arange(33, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(fn(x)), x + 1)
    s = jax_rccl.runtime_stats()
    assert s["instantiations"] >= 1, s
    assert s["executions"] >= 1, s
    assert s["errors"] == 0, s


def test_groups_of_several_gpus():
    n = len(jax.devices())
    if n < 2:
        pytest.skip("needs 2 GPUs")
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, size=(n, 4099)).astype(np.float32)

    def body(v):
        return (
            jax_rccl.psum(v, "i"),
            jax_rccl.all_gather(v, "i", tiled=True),
            jax_rccl.ppermute(v, "i", [(j, (j + 1) % n) for j in range(n)]),
            jax_rccl.pbroadcast(v, "i", n - 1),
        )

    s, g, p, b = (np.asarray(a) for a in _jit(body, n)(x.reshape(-1)))
    np.testing.assert_array_equal(s.reshape(n, -1), np.tile(x.sum(0), (n, 1)))
    np.testing.assert_array_equal(g.reshape(n, -1), np.tile(x.reshape(-1), (n, 1)))
    np.testing.assert_array_equal(p.reshape(n, -1), np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(b.reshape(n, -1), np.tile(x[n - 1], (n, 1)))


_CONFIGS = [("Ring", "LL"), ("Ring", "Simple"), ("Tree", "LL"), ("Tree", "Simple")]


@pytest.mark.parametrize("algo,proto", _CONFIGS, ids=lambda v: v)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("count", [1, 4099, 1 << 18])
def test_every_collective_on_several_gpus_against_lax(algo, proto, dtype, count):
    """One process, every GPU: jax_rccl's collectives against jax.lax's on the same mesh, the
    reductions under each algorithm and protocol, the rest under Ring with each protocol."""
    n = len(jax.devices())
    if n < 2:
        pytest.skip("needs 2 GPUs")
    rng = np.random.default_rng(count)
    x = rng.integers(-3, 4, size=(n * n * count,)).astype(np.float32).astype(dtype)
    ring = [(j, (j + 1) % n) for j in range(n)]

    def body(lib):
        def f(v):
            with jax_rccl.config(algorithm=algo, protocol=proto):
                out = {
                    "psum": lib.psum(v, "i"),
                    "pmax": lib.pmax(v, "i"),
                    "pmin": lib.pmin(v, "i"),
                }
            with jax_rccl.config(algorithm="Ring", protocol=proto):
                out["all_gather"] = lib.all_gather(v, "i", tiled=True)
                out["psum_scatter"] = lib.psum_scatter(v, "i", tiled=True)
            with jax_rccl.config(protocol=proto):
                out["all_to_all"] = lib.all_to_all(v, "i", 0, 0, tiled=True)
                out["ppermute"] = lib.ppermute(v, "i", ring)
            return out

        return f

    got = _jit(body(jax_rccl), n)(x)
    want = _jit(body(jax.lax), n)(x)
    for name in want:
        np.testing.assert_array_equal(_f64(got[name]), _f64(want[name]), err_msg=name)


@pytest.mark.parametrize("nchannels", ["1", "3", "32"])
def test_groups_of_several_gpus_with_any_channel_count(nchannels):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(os.environ, JAX_RCCL_NCHANNELS=nchannels, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = run_worker("worker_channels_gpu.py", env=env, timeout=120)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


# --- command buffers --------------------------------------------------------------------------


def _run_json(name: str, xla_flags: str, *args: str) -> dict:
    """Runs the worker program `name` in a subprocess with `xla_flags` added to XLA_FLAGS (so they
    apply) and returns the JSON of its last line."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process already holds the GPU's pool
    env.setdefault("JAX_RCCL_TIMEOUT", "60")
    proc = run_worker(name, *args, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _run_steps(xla_flags: str, steps: int = 1001) -> dict:
    out = _run_json("worker_train_step_gpu.py", xla_flags, str(steps))
    assert out["calls"] == 3, out
    assert out["errors"] == 0, out
    assert out["err_stats"] < 1e-4, out
    assert out["err_w"] < 1e-4, out
    return out


def test_training_step_captured_in_command_buffers():
    out = _run_steps(COMMAND_BUFFERS)
    per_step = out["calls"] * out["devices"]  # each device runs each call's handler
    total = per_step * out["steps"]
    # Fresh inputs and donated weights move buffers every step, so XLA re-records the command
    # buffer (calling the handlers) on most steps: results right every time, at most one handler
    # run per call.
    assert out["executions"] <= total, out
    # The same buffers: captured once, then replayed without calling the handlers.
    assert out["replay_same"], out
    assert out["replay_executions"] <= per_step * out["replay_steps"] // 10, out


def test_training_step_without_command_buffers_runs_every_call():
    out = _run_steps("--xla_gpu_enable_command_buffer=")
    per_step = out["calls"] * out["devices"]
    assert out["executions"] == per_step * out["steps"], out
    assert out["replay_executions"] == per_step * out["replay_steps"], out


# --- per-device premul scalars inside command buffers ---------------------------------------------


def _run_premul_steps(xla_flags: str, steps: int = 1000) -> dict:
    types = [np.dtype(d).name for d in PREMUL_DTYPES if _built(d)]
    out = _run_json("worker_premul_steps_gpu.py", xla_flags, str(steps), json.dumps(types))
    print(out)
    assert out["k"] == steps, out
    assert out["bad"] == 0, out
    assert out["errors"] == 0, out
    return out


def test_premul_array_steps_in_command_buffers():
    """1,000 steps, a new per-device scalar each: inside command buffers the launch is captured
    once and replayed (the handler runs on few steps), and each replay reads the scalar the
    device holds then."""
    out = _run_premul_steps(COMMAND_BUFFERS)
    assert out["executions"] <= out["steps"] // 10, out


def test_premul_array_steps_without_command_buffers():
    out = _run_premul_steps("--xla_gpu_enable_command_buffer=")
    assert out["executions"] == out["steps"] - 1, out
