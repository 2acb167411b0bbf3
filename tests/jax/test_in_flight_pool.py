"""Too many calls in flight for XLA's CPU thread pool (one process, CPU runtime).

XLA's CPU client runs every device's part of a call on one pool of threads (max(cores, devices),
or PJRT_NPROC) and lets each device run a number of calls ahead; a launch past that limit holds a
pool thread. With hundreds of calls dispatched without waiting on a pool as large as the mesh,
every thread is taken (the present ranks of the oldest call wait in jax_rccl's rendezvous, the
others in XLA's limit) while a missing rank's part of that call waits for a thread: nothing can
move. jax.lax.psum stalls the same way. jax_rccl must not hang until JAX_RCCL_TIMEOUT and then
blame a rank as if it were slow: it detects the idle, exhausted pool after JAX_RCCL_STALL_GRACE
(2 s) and says what happened and how to avoid it, and the process ends at once after it. A slow
device that computes before the collective is not a stall.

Each scenario runs in a subprocess (XLA reads the device count and the pool size at start);
PJRT_NPROC fixes the pool size so the scenarios do not depend on the host's cores.
"""

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

TIMEOUT = 20  # JAX_RCCL_TIMEOUT in the children
BOUND = 120  # seconds a child may take at most

_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    cfg = json.loads(sys.argv[1])
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={cfg['devices']}"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl

    n = cfg["mesh"]
    mesh = Mesh(np.array(jax.devices()[:n]), ("i",))
    work = cfg.get("work", 0)

    def body(v):
        if work:  # rank 0 computes for seconds before the collective, the others wait for it
            def heavy(v):
                m = jnp.full((256, 256), 1e-3, jnp.float32)
                m = jax.lax.fori_loop(0, work, lambda _, a: jnp.tanh(a @ a), m)
                return v + 0.0 * m[0, : v.shape[0]]
            v = jax.lax.cond(jax.lax.axis_index("i") == 0, heavy, lambda v: v, v)
        return jax_rccl.psum(v, "i")

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = jax.device_put(jnp.arange(8.0 * n), NamedSharding(mesh, P("i")))
    want = np.tile(np.asarray(x).reshape(n, 8).sum(0), n)
    np.testing.assert_allclose(np.asarray(f(x)), want)  # compiled and run once
    out = {"threads_before": len(os.listdir("/proc/self/task"))}
    t0 = time.monotonic()
    outs = []
    error = None
    try:
        for k in range(cfg["calls"]):
            outs.append(f(x))
            if cfg.get("every") and (k + 1) % cfg["every"] == 0:
                outs[-1].block_until_ready()
        for y in outs:
            np.testing.assert_allclose(np.asarray(y), want)
    except Exception as e:  # JAX's runtime error class varies
        error = str(e)
    out["seconds"] = time.monotonic() - t0
    out["error"] = error
    # After an error every later call in flight must end at once too.
    t1 = time.monotonic()
    failed = 0
    for y in outs:
        try:
            y.block_until_ready()
        except Exception:
            failed += 1
    out["drain_seconds"] = time.monotonic() - t1
    out["failed_outputs"] = failed
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _run(cfg, **env_extra):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    env["JAX_RCCL_TIMEOUT"] = str(TIMEOUT)
    env.update(env_extra)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-P", "-c", _CHILD, json.dumps(cfg)],
        env=env,
        capture_output=True,
        text=True,
        timeout=BOUND,
    )
    wall = time.monotonic() - t0
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :]), wall


def test_too_many_calls_in_flight_fail_fast_and_say_why():
    # 500 calls on a 16-device mesh with a pool of 16 threads: without the check this waited the
    # whole JAX_RCCL_TIMEOUT and then said "ranks [..] never arrived".
    res, wall = _run({"devices": 16, "mesh": 16, "calls": 500}, PJRT_NPROC="16")
    err = res["error"]
    assert err is not None, res
    assert res["seconds"] < TIMEOUT / 2, res  # the grace (2 s), not the timeout
    assert "never arrived" not in err, err
    assert "too many calls in flight" in err, err
    assert "XLA's CPU thread pool cannot start the part of rank" in err, err
    assert "in the oldest execution in flight" in err, err
    # The stalled call's own error, or (the part of rank 0 that ran after it) the communicator's
    # "failed earlier" that carries it as the first failure: both name the cause.
    if "failed earlier" in err:
        assert "the first failure: jax_rccl: 'psum over ('i',)': too many calls" in err, err
    assert "block_until_ready" in err, err
    assert "--xla_force_host_platform_device_count=32" in err, err
    assert "PJRT_NPROC=32" in err, err
    # Nothing hangs after the error: the calls still in flight fail at once.
    assert res["failed_outputs"] > 0 and res["drain_seconds"] < 10, res
    assert wall < BOUND / 2, wall


@pytest.mark.parametrize(
    "cfg, env",
    [
        ({"devices": 16, "mesh": 16, "calls": 500, "every": 16}, {"PJRT_NPROC": "16"}),
        ({"devices": 16, "mesh": 16, "calls": 500}, {"PJRT_NPROC": "32"}),
        ({"devices": 16, "mesh": 8, "calls": 500}, {"PJRT_NPROC": "16"}),
    ],
    ids=["block-every-16", "pool-twice-the-mesh", "spare-host-devices"],
)
def test_the_advice_works(cfg, env):
    res, _ = _run(cfg, **env)
    assert res["error"] is None, res


def test_a_device_that_computes_is_not_a_stall():
    # Rank 0 computes for seconds before each collective while its peers wait, on a host made
    # busier by CPU hogs: slow, not stalled. The grace is 1 s here, so that the computation (about
    # 2.5 s a call on a 2-core machine, less on a faster one) outlasts it with room to spare.
    grace = 1.0
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count())
    ]
    try:
        res, _ = _run(
            {"devices": 8, "mesh": 8, "calls": 3, "work": 5000},
            PJRT_NPROC="8",
            JAX_RCCL_STALL_GRACE=str(grace),
        )
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert res["error"] is None, res
    assert res["seconds"] > 3 * 1.5 * grace, res  # each call's wait outlasted the grace


def test_check_off_waits_for_the_timeout():
    # JAX_RCCL_STALL_GRACE=0: the old behaviour, the deadline and a timeout error.
    res, _ = _run(
        {"devices": 16, "mesh": 16, "calls": 500},
        PJRT_NPROC="16",
        JAX_RCCL_STALL_GRACE="0",
        JAX_RCCL_TIMEOUT="5",
    )
    err = res["error"]
    assert err is not None and "JAX_RCCL_TIMEOUT" in err, res
    assert "too many calls in flight" not in err, err
    assert res["seconds"] >= 5, res
