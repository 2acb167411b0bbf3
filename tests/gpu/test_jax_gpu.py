"""jax_rccl's collectives through JAX on a GPU: the CUDA/ROCM FFI handlers.

On one GPU every group has one device, so each collective is the one-rank plan (device copies,
a scaled copy for premul/avg): every public collective inside jit(shard_map) over a 1-device
mesh against numpy, for f32/bf16/i32 at sizes 0, 1, odd and 1M, plus pytrees and grad. Then
command buffers: a training step holding jax_rccl collectives runs 1,000 times in a subprocess
(so XLA_FLAGS apply) with XLA's command buffers on (execute runs far fewer times than
calls x steps: captured once, replayed) and off (execute runs on every call), every result
checked. Multi-GPU groups are exercised only where the machine has several GPUs.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

os.environ.setdefault("JAX_RCCL_TIMEOUT", "60")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
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


_CHANNELS_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import jax
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_rccl

    n = len(jax.devices())
    mesh = Mesh(np.array(jax.devices()), ("i",))
    x = np.arange(n * 70001, dtype=np.float32) % 13
    ring = [(j, (j + 1) % n) for j in range(n)]
    f = jax.jit(jax.shard_map(
        lambda v: (jax_rccl.psum(v, "i"), jax_rccl.ppermute(v, "i", ring)),
        mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    s, p = (np.asarray(a).reshape(n, -1) for a in f(x))
    xs = x.reshape(n, -1)
    np.testing.assert_array_equal(s, np.tile(xs.sum(0), (n, 1)))
    np.testing.assert_array_equal(p, np.roll(xs, 1, axis=0))
    print("OK")
    """
)


@pytest.mark.parametrize("nchannels", ["1", "3", "32"])
def test_groups_of_several_gpus_with_any_channel_count(nchannels):
    if len(jax.devices()) < 2:
        pytest.skip("needs 2 GPUs")
    env = dict(os.environ, JAX_RCCL_NCHANNELS=nchannels, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _CHANNELS_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


# --- command buffers --------------------------------------------------------------------------

_STEP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_rccl

    STEPS, D, LR = int(sys.argv[1]), 4096, 0.05
    n = len(jax.devices())  # data parallel over every visible GPU
    mesh = Mesh(np.array(jax.devices()), ("i",))

    def body(w, x, y):  # w: this device's copy of the weights, x and y: its batch
        def loss(w):
            return jnp.mean((x * w - y) ** 2)

        l, g = jax.value_and_grad(loss)(w)
        g = jax_rccl.psum(g, "i") * (1.0 / n)              # a temp in, a temp out
        l = jax_rccl.pmean(l.reshape(1), "i")
        s = jax_rccl.all_gather(jnp.sum(x).reshape(1), "i", tiled=True)
        stats = jnp.concatenate([l, s]) * 2.0 + 0.5  # results reach outputs through a fusion
        return w - LR * g, stats

    spec = P("i")
    step = jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec), donate_argnums=0
    )
    sharding = jax.sharding.NamedSharding(mesh, spec)
    rng = np.random.default_rng(0)
    w0 = rng.uniform(-1, 1, D).astype(np.float32)
    xs_np = [rng.uniform(0.5, 1.5, (n, D)).astype(np.float32) for _ in range(STEPS)]
    ys_np = [rng.uniform(-1, 1, (n, D)).astype(np.float32) for _ in range(STEPS)]
    put = lambda a: jax.device_put(a.reshape(-1), sharding)
    xs, ys = [put(a) for a in xs_np], [put(a) for a in ys_np]
    w_init = lambda: put(np.tile(w0, (n, 1)))
    calls = step.trace(w_init(), xs[0], ys[0]).lower().as_text().count(
        "custom_call @jax_rccl_"
    )

    w = w_init()
    w, st = step(w, xs[0], ys[0])  # compile and first run
    jax.block_until_ready(w)
    jax_rccl.reset_runtime_stats()
    stats = []
    for i in range(1, STEPS):
        w, st = step(w, xs[i], ys[i])
        stats.append(st)
    w_final = np.asarray(w).reshape(n, D)
    stats = np.stack([np.asarray(s).reshape(n, 1 + n) for s in stats])
    counters = jax_rccl.runtime_stats()

    # numpy, float64: the same steps (every device holds the same weights and statistics)
    wr = w0.astype(np.float64)
    want = []
    for i in range(STEPS):
        x, y = xs_np[i].astype(np.float64), ys_np[i].astype(np.float64)
        r = x * wr - y
        if i > 0:
            row = [np.mean(np.mean(r * r, axis=1)) * 2.0 + 0.5] + list(x.sum(1) * 2.0 + 0.5)
            want.append(np.tile(row, (n, 1)))
        wr = wr - LR * (2.0 * r * x / D).mean(0)
    want = np.asarray(want)
    err_stats = float(np.max(np.abs(stats - want) / (np.abs(want) + 1e-3)))
    err_w = float(np.max(np.abs(w_final - wr[None, :])))

    # Replay: the same step on the same buffers (no donation) 200 times. Captured once, a
    # command buffer is replayed without calling the handlers again.
    step2 = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))
    w2 = w_init()
    ref = step2(w2, xs[1], ys[1])
    jax.block_until_ready(ref)
    jax_rccl.reset_runtime_stats()
    same = True
    for _ in range(200):
        out = step2(w2, xs[1], ys[1])
        same = same and bool(np.array_equal(np.asarray(out[1]), np.asarray(ref[1])))
    replay_execs = jax_rccl.runtime_stats()["executions"]
    print(json.dumps({
        "devices": n, "calls": calls, "steps": STEPS - 1, "executions": counters["executions"],
        "errors": counters["errors"], "err_stats": err_stats, "err_w": err_w,
        "replay_steps": 200, "replay_executions": replay_execs, "replay_same": same,
    }))
    """
)


def _run_steps(xla_flags: str, steps: int = 1001) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # this process already holds the GPU's pool
    env.setdefault("JAX_RCCL_TIMEOUT", "60")
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _STEP_SCRIPT, str(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["calls"] == 3, out
    assert out["errors"] == 0, out
    assert out["err_stats"] < 1e-4, out
    assert out["err_w"] < 1e-4, out
    return out


def test_training_step_captured_in_command_buffers():
    out = _run_steps(
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    )
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

_PREMUL_STEP_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax, jax.numpy as jnp
    from jax.sharding import Mesh, PartitionSpec as P
    import jax_rccl

    STEPS = int(sys.argv[1])
    TYPES = json.loads(sys.argv[2])  # the leaf types this build's device code reduces over
    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
    rng = np.random.default_rng(0)
    ints = lambda: rng.integers(-3, 4, 4099).astype(np.float32)
    leaf = {"float32": lambda: ints(), "bfloat16": lambda: ints().astype(jnp.bfloat16),
            "float16": lambda: ints().astype(np.float16),
            "complex64": lambda: (ints() + 1j * ints()).astype(np.complex64)}
    xs = tuple(leaf[t]() for t in TYPES)

    # The state (step counter, mismatches) is donated, the inputs stay: every buffer keeps its
    # address from step to step, so a captured command buffer is replayed as it is. The premul
    # scalar is computed on the device from the step counter, a new value every step, and each
    # result is compared on the device with its closed form.
    def body(xs, k, bad):
        s = (k[0] % 16.0) * 0.25 - 1.0  # -1 .. 2.75 in quarters: exact in every type
        ys = jax_rccl.all_reduce(xs, "i", premul=s)
        for x, y in zip(xs, ys):
            if jnp.issubdtype(x.dtype, jnp.complexfloating):
                want = x * s.astype(x.dtype)
            else:
                want = (x.astype(jnp.float32) * s).astype(x.dtype)
            bad = bad + jnp.sum(y != want).astype(jnp.int32).reshape(1)
        return k + 1.0, bad

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")),
                   donate_argnums=(1, 2))
    xd = tuple(jax.device_put(x) for x in xs)
    k, bad = jnp.zeros(1, jnp.float32), jnp.zeros(1, jnp.int32)
    k, bad = step(xd, k, bad)  # compile and first run
    jax.block_until_ready(bad)
    jax_rccl.reset_runtime_stats()
    for _ in range(1, STEPS):
        k, bad = step(xd, k, bad)
    stats = jax_rccl.runtime_stats()
    print(json.dumps({"steps": STEPS, "k": float(np.asarray(k)[0]), "bad": int(np.asarray(bad)[0]),
                      "executions": int(stats["executions"]), "errors": int(stats["errors"])}))
    """
)


def _run_premul_steps(xla_flags: str, steps: int = 1000) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + xla_flags).strip()
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.setdefault("JAX_RCCL_TIMEOUT", "60")
    types = [np.dtype(d).name for d in PREMUL_DTYPES if _built(d)]
    proc = subprocess.run(
        [sys.executable, "-P", "-c", _PREMUL_STEP_SCRIPT, str(steps), json.dumps(types)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    assert out["k"] == steps, out
    assert out["bad"] == 0, out
    assert out["errors"] == 0, out
    return out


def test_premul_array_steps_in_command_buffers():
    """1,000 steps, a new per-device scalar each: inside command buffers the launch is captured
    once and replayed (the handler runs on few steps), and each replay reads the scalar the
    device holds then."""
    out = _run_premul_steps(
        "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
    )
    assert out["executions"] <= out["steps"] // 10, out


def test_premul_array_steps_without_command_buffers():
    out = _run_premul_steps("--xla_gpu_enable_command_buffer=")
    assert out["executions"] == out["steps"] - 1, out
