"""Several JAX processes sharing one GPU (or one GPU each), through jax.distributed.

Each process owns one GPU device; the group's connection regions are traded as IPC handles
through shared-memory segments. Without MPS the processes' kernels are time-sliced (every FIFO
hand-off waits for a time slice), so the sizes stay small; with MPS running
(`nvidia-cuda-mps-control -d`) the same test runs at full speed.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest

from jax_rccl._mps import Mps

pytestmark = pytest.mark.gpu

_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    process, nprocs, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl

    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))
    out = {"process": process, "n": n, "checks": 0}

    def global_array(count, fn):
        return jax.make_array_from_callback(
            (n * count,), spec, lambda idx: np.asarray(fn(np.arange(n * count)[idx]), np.float32)
        )

    def run(f, x):
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        y = g(x)
        return np.concatenate([np.asarray(s.data) for s in y.addressable_shards])

    # Every algorithm and protocol: all_reduce under Ring and Tree x LL and Simple (and LL128 where
    # the build has it), the rest under Ring x the same protocols (point-to-point: LL or Simple).
    CONFIGS = [(None, None), ("Ring", "LL"), ("Ring", "Simple"), ("Tree", "LL"), ("Tree", "Simple")]
    from jax_rccl import _jax_rccl
    if _jax_rccl.gpu.has_ll128():  # taken only when asked for
        CONFIGS += [("Ring", "LL128"), ("Tree", "LL128")]
    out["configs"] = CONFIGS
    for count in (1, 1000, 65536):
        x = global_array(count, lambda i: (i % 7) - 3)
        full = (np.arange(n * count) % 7 - 3).astype(np.float32).reshape(n, count)
        mine = process  # one device per process: its block is the process's index
        for algo, proto in CONFIGS:
            where = f"count {count}, {algo or 'auto'}/{proto or 'auto'}"
            with jax_rccl.config(algorithm=algo, protocol=proto):
                print(f"{where}: psum", flush=True)  # where a crash happened, in the output
                got = run(lambda v: jax_rccl.psum(v, "i"), x)
                np.testing.assert_array_equal(got, full.sum(0), err_msg=where)
                out["checks"] += 1
            if algo == "Tree":
                continue
            with jax_rccl.config(algorithm=algo, protocol=proto):
                print(f"{where}: pmax", flush=True)
                got = run(lambda v: jax_rccl.pmax(v, "i"), x)
                np.testing.assert_array_equal(got, full.max(0), err_msg=where)
                print(f"{where}: all_gather", flush=True)
                got = run(lambda v: jax_rccl.all_gather(v, "i", tiled=True), x)
                np.testing.assert_array_equal(got, full.reshape(-1), err_msg=where)
                print(f"{where}: psum_scatter", flush=True)
                got = run(lambda v: jax_rccl.psum_scatter(v, "i", tiled=True), global_array(
                    count * n, lambda i: (i % 5) - 2))
                rs = (np.arange(n * n * count) % 5 - 2).astype(np.float32)
                rs = rs.reshape(n, n * count).sum(0)
                mine_rs = rs[mine * count:(mine + 1) * count]
                np.testing.assert_array_equal(got, mine_rs, err_msg=where)
                print(f"{where}: pbroadcast", flush=True)
                got = run(lambda v: jax_rccl.pbroadcast(v, "i", n - 1), x)
                np.testing.assert_array_equal(got, full[n - 1], err_msg=where)
                out["checks"] += 4
            perm = [(k, (k + 1) % n) for k in range(n)]
            print(f"{where}: ppermute", flush=True)
            got = run(lambda v: jax_rccl.ppermute(v, "i", perm), x)
            np.testing.assert_array_equal(got, full[(mine - 1) % n], err_msg=where)
            print(f"{where}: all_to_all", flush=True)
            y = global_array(count * n, lambda i: i % 11)
            got = run(lambda v: jax_rccl.all_to_all(v, "i", 0, 0, tiled=True), y)
            blocks = (np.arange(n * n * count) % 11).astype(np.float32).reshape(n, n, count)
            np.testing.assert_array_equal(got, blocks[:, mine].reshape(-1), err_msg=where)
            out["checks"] += 2
    out["stats"] = {k: int(v) for k, v in jax_rccl.runtime_stats().items()}
    ids = [d.id for d in devs]
    rank = ids.index(jax.local_devices()[0].id)
    out["rank"] = rank
    out["counters"] = [list(r) for r in _jax_rccl.gpu.connection_counters(ids, rank)]
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _gpu_count() -> int:
    try:
        import jax

        return len([d for d in jax.devices() if d.platform == "gpu"])
    except Exception:
        return 0


def _has_gpu_runtime() -> bool:
    from jax_rccl import _jax_rccl

    return hasattr(_jax_rccl, "gpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("share", [True, False])
def test_processes_with_one_gpu_each(nprocs, share):
    if not _has_gpu_runtime() or _gpu_count() == 0:
        pytest.skip("needs a GPU build and a GPU")
    ngpus = _gpu_count()
    if not share and ngpus < nprocs:
        pytest.skip(f"needs {nprocs} GPUs (one per process)")
    port = _free_port()
    procs = []
    for p in range(nprocs):
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = "0" if share else str(p)
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["JAX_RCCL_TIMEOUT"] = "60"
        env["PYTHONFAULTHANDLER"] = "1"  # a crash prints every thread's Python stack
        env["PYTHONSAFEPATH"] = "1"  # a checkout's source folder never shadows the package
        env.pop("XLA_FLAGS", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(p), str(nprocs), str(port)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    texts = []
    for p in procs:
        try:
            text, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a process did not finish within 300 s")
        texts.append(text)
    failed = [k for k, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "\n".join(
        f"--- process {k}: exit {procs[k].returncode}\n{texts[k][-3000:]}" for k in failed
    )
    results = []
    for text in texts:
        line = [ln for ln in text.splitlines() if ln.startswith("RESULT ")][-1]
        results.append(json.loads(line[len("RESULT ") :]))
    for r in results:
        assert r["n"] == nprocs
        # Per count: a psum under every config, six more checks under the non-Tree ones.
        per_count = sum(1 if algo == "Tree" else 7 for algo, _ in r["configs"])
        assert r["checks"] == 3 * per_count, r
        assert r["stats"]["errors"] == 0
    # Every connection ends where it began: the steps a sender filled (its own copy) are the steps
    # its receiver consumed, and the tail the receiver holds (written by the sender).
    by_rank = {
        r["rank"]: {(c, p): (t, h, st) for c, p, t, h, st, _ in r["counters"]} for r in results
    }
    assert sorted(by_rank) == list(range(nprocs))
    moved = 0
    for s in range(nprocs):
        for r in range(nprocs):
            if s == r:
                continue
            for (c, p), (_, _, sent) in by_rank[s].items():
                if p != r:
                    continue
                tail, head, _ = by_rank[r][(c, s)]
                assert sent == head == tail, (s, r, c, sent, head, tail)
                moved += sent
    assert moved > 0
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("jrccl.")]
    assert not leftovers, leftovers


# --- one step of every collective at large sizes, processes sharing the GPU under MPS ----------

# The start of a worker (argv: process, nprocs, port, count, steps): JAX's distributed client,
# and a one-axis mesh "i" over every process's device.
_WORKER_START = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    import jax
    process, nprocs, port, count, steps = (int(a) for a in sys.argv[1:6])
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl
    from jax_rccl import _compat, _jax_rccl

    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))
    """
)

_STEP_WORKER = _WORKER_START + textwrap.dedent(
    """
    perm = [(k, (k + 1) % n) for k in range(n)]

    # State (x int32, y float32), both donated: x moves one rank on per step (ppermute), y becomes
    # its psum; every collective of the step reads them, so each step's results have a closed form.
    def body(x, y):
        s_i = jax_rccl.psum(x, "i")
        s_f = jax_rccl.psum(y, "i")
        ag = jax_rccl.all_gather(x, "i", tiled=True)
        rs = jax_rccl.psum_scatter(x, "i", tiled=True)
        pp = jax_rccl.ppermute(x, "i", perm)
        a2a = jax_rccl.all_to_all(x, "i", 0, 0, tiled=True)
        return pp, s_f, (s_i, ag, rs, a2a)

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")),
                                 out_specs=(P("i"), P("i"), (P("i"),) * 4)), donate_argnums=(0, 1))
    x0 = [((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)]
    x = jax.make_array_from_callback((n * count,), spec, lambda idx: np.concatenate(x0)[idx])
    y = jax.jit(lambda v: v.astype(jnp.float32))(x)
    tot = np.sum(x0, axis=0)
    me, b = process, count // n
    bad = {}
    for k in range(steps):
        x, y, outs = step(x, y)
        cur = [x0[(r - k) % n] for r in range(n)]  # this step's inputs
        got = [np.asarray(o.addressable_shards[0].data) for o in (x, y) + tuple(outs)]
        want = [cur[(me - 1) % n], (tot * n ** k).astype(np.float32), tot, np.concatenate(cur),
                tot[me * b:(me + 1) * b], np.concatenate([c[me * b:(me + 1) * b] for c in cur])]
        names = ["ppermute", "psum_f32", "psum_i32", "all_gather", "psum_scatter", "all_to_all"]
        for name, g, w in zip(names, got, want):
            if g.shape != w.shape or not np.array_equal(g, w):
                same_shape = g.shape == w.shape
                bad[f"step {k} {name}"] = int(np.count_nonzero(g != w)) if same_shape else -1
        print(f"step {k} done", flush=True)
    ids = [d.id for d in devs]
    rank = ids.index(jax.local_devices()[0].id)
    print("RESULT " + json.dumps({
        "rank": rank, "bad": bad, "errors": int(jax_rccl.runtime_stats()["errors"]),
        "counters": [list(r) for r in _jax_rccl.gpu.connection_counters(ids, rank)],
    }), flush=True)
    """
)


_COMMAND_BUFFERS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
)


@pytest.fixture(scope="module")
def mps_env():
    """The environment of processes that share the GPU under MPS: a running daemon's, or one this
    fixture starts (as root; `nvidia-cuda-mps-control -d`) and stops again. Skips without MPS:
    time-sliced, a large step waits a time slice per FIFO hand-off."""
    if not _has_gpu_runtime() or _gpu_count() == 0:
        pytest.skip("needs a GPU build and a GPU")
    mps = Mps()
    why = mps.start()
    if why is not None:
        pytest.skip(f"needs MPS: {why}")
    try:
        yield {**os.environ, **mps.env}
    finally:
        mps.stop()


def _run_step_processes(
    env_base: dict,
    nprocs: int,
    count: int,
    steps: int,
    cb: bool,
    script: str = _STEP_WORKER,
    *,
    env_of: Callable[[int], dict] | None = None,
    timeout: float = 240,
    keep_output: bool = False,
) -> list:
    """Runs `script` in `nprocs` processes sharing GPU 0 (argv: process, nprocs, port, count,
    steps) and returns each process's RESULT (several RESULT lines of a process: merged, later keys
    win). `env_of(p)`: process p's extra environment, over the defaults below; `timeout`: seconds
    each process gets to finish (then every process is killed and the test fails); `keep_output`:
    each result also holds the process's whole output (key "output")."""
    port = _free_port()
    procs = []
    for p in range(nprocs):
        env = dict(env_base)
        env["CUDA_VISIBLE_DEVICES"] = "0"
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["JAX_RCCL_TIMEOUT"] = "30"
        env["PYTHONFAULTHANDLER"] = "1"
        env["PYTHONSAFEPATH"] = "1"  # a checkout's source folder never shadows the package
        # Off means off: XLA's default already captures custom calls in command buffers.
        env["XLA_FLAGS"] = _COMMAND_BUFFERS if cb else "--xla_gpu_enable_command_buffer="
        if env_of is not None:
            env.update(env_of(p))
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    script,
                    str(p),
                    str(nprocs),
                    str(port),
                    str(count),
                    str(steps),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    texts = []
    for k, p in enumerate(procs):
        try:
            text, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            tails = []
            for j, q in enumerate(procs[k:], start=k):
                try:
                    tails.append(f"--- process {j}:\n{q.communicate(timeout=10)[0][-2000:]}")
                except subprocess.TimeoutExpired:
                    tails.append(f"--- process {j}: no output")
            pytest.fail(f"a process did not finish within {timeout:g} s\n" + "\n".join(tails))
        texts.append(text)
    failed = [k for k, p in enumerate(procs) if p.returncode != 0]
    assert not failed, "\n".join(
        f"--- process {k}: exit {procs[k].returncode}\n{texts[k][-3000:]}" for k in failed
    )
    out = []
    for k, text in enumerate(texts):
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"process {k} printed no RESULT line:\n{text[-3000:]}"
        res: dict = {}
        for line in lines:
            res.update(json.loads(line[len("RESULT ") :]))
        if keep_output:
            res["output"] = text
        out.append(res)
    return out


@pytest.mark.parametrize(
    "nprocs, count, cb",
    [
        (2, 1 << 24, False),  # 64 MB per rank
        (3, (1 << 22) - 1, False),  # 16 MB per rank (a multiple of 3 elements)
        (3, (1 << 24) - 1, True),
        (4, 1 << 20, True),
        (4, 1 << 22, False),  # 16 MB per rank: issue 21's step
        (4, 1 << 22, True),
        (4, 1 << 24, False),  # 64 MB per rank
    ],
)
def test_step_of_every_collective_sharing_one_gpu(mps_env, nprocs, count, cb):
    """psum (int32, float32), all_gather, psum_scatter, ppermute and all_to_all in one jitted step
    of `nprocs` processes on one GPU, every result against its closed form, three steps; command
    buffers on or off. The connections end where they began (every sent step consumed)."""
    results = _run_step_processes(mps_env, nprocs, count, 3, cb)
    for r in results:
        assert r["bad"] == {}, r["bad"]
        assert r["errors"] == 0
    by_rank = {
        r["rank"]: {(c, p): (t, h, st) for c, p, t, h, st, _ in r["counters"]} for r in results
    }
    assert sorted(by_rank) == list(range(nprocs))
    for s in range(nprocs):
        for (c, p), (_, _, sent) in by_rank[s].items():
            if p != s:
                tail, head, _ = by_rank[p][(c, s)]
                assert sent == head == tail, (s, p, c, sent, head, tail)


# --- a thousand steps, every result checked on the device ----------------------------------------

_LOOP_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    process, nprocs, port, count, steps = (int(a) for a in sys.argv[1:6])
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl

    devs = jax.devices()
    n = len(devs)
    b = count // n
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))
    perm = [(j, (j + 1) % n) for j in range(n)]
    NAMES = ["psum_i32", "psum_f32", "all_gather", "psum_scatter", "ppermute", "all_to_all"]

    # At step k rank m holds x = f((m - k) mod n), f(r) = ((i + 7 r) % 13) - 6 over i < count; the
    # ppermute of the step hands rank m + 1 its next x. Every result's closed form is computed on
    # the device from (m, k) and compared there: a mismatch count per collective, carried (with
    # k and x) in donated buffers, so a captured command buffer replays with the same addresses.
    def f(r):
        return (lax.iota(jnp.int32, count) + 7 * r) % 13 - 6

    def body(x, k, bad):
        m = lax.axis_index("i")
        kk = k[0]
        src = [f((r - kk) % n) for r in range(n)]  # every rank's input of this step
        tot = sum(src)
        got = [
            jax_rccl.psum(x, "i"),
            jax_rccl.psum(x.astype(jnp.float32), "i"),
            jax_rccl.all_gather(x, "i", tiled=True),
            jax_rccl.psum_scatter(x, "i", tiled=True),
            jax_rccl.ppermute(x, "i", perm),
            jax_rccl.all_to_all(x, "i", 0, 0, tiled=True),
        ]
        want = [
            tot,
            tot.astype(jnp.float32),
            jnp.concatenate(src),
            lax.dynamic_slice(tot, (m * b,), (b,)),
            f((m - 1 - kk) % n),
            jnp.concatenate([lax.dynamic_slice(c, (m * b,), (b,)) for c in src]),
        ]
        bad = bad + jnp.stack([jnp.sum(g != w).astype(jnp.int32) for g, w in zip(got, want)])[None]
        return got[4], k + 1, bad

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")),
                   donate_argnums=(0, 1, 2))
    x0 = np.concatenate([((np.arange(count) + 7 * r) % 13 - 6).astype(np.int32) for r in range(n)])
    x = jax.make_array_from_callback((n * count,), spec, lambda idx: x0[idx])
    k = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.int32)[idx])
    bad = jax.make_array_from_callback(
        (n, len(NAMES)), spec, lambda idx: np.zeros((n, len(NAMES)), np.int32)[idx])
    for _ in range(steps):
        x, k, bad = step(x, k, bad)
    jax.block_until_ready(bad)
    counts = np.asarray(bad.addressable_shards[0].data)[0]
    ids = [d.id for d in devs]
    print("RESULT " + json.dumps({
        "rank": ids.index(jax.local_devices()[0].id),
        "steps": int(np.asarray(k.addressable_shards[0].data)[0]),
        "bad": {name: int(c) for name, c in zip(NAMES, counts) if c},
        "errors": int(jax_rccl.runtime_stats()["errors"]),
    }), flush=True)
    """
)


@pytest.mark.parametrize(
    "nprocs, count",
    [
        (2, 1 << 24),  # 64 MB per rank
        (3, (1 << 24) - 1),  # 64 MB per rank less 4 bytes (a multiple of 3 elements)
        (4, 1 << 24),
    ],
)
@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
def test_a_thousand_steps_sharing_one_gpu(mps_env, nprocs, count, cb):
    """1,000 jitted steps of psum (int32, float32), all_gather, psum_scatter, ppermute and
    all_to_all on 64 MB per rank, `nprocs` processes sharing the GPU, command buffers on and off:
    every result of every step equals its closed form, compared on the device."""
    steps = 1000
    results = _run_step_processes(mps_env, nprocs, count, steps, cb, script=_LOOP_WORKER)
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["steps"] == steps, r
        assert r["bad"] == {}, r
        assert r["errors"] == 0, r


# --- per-device premul scalars: processes sharing the GPU, command buffers on and off ----------

_PREMUL_WORKER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import jax
    process, nprocs, port, count, steps = (int(a) for a in sys.argv[1:6])
    jax.distributed.initialize(f"127.0.0.1:{port}", nprocs, process, initialization_timeout=120)
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import jax_rccl

    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    spec = NamedSharding(mesh, P("i"))

    # Rank r holds x_r = base * (r + 1) and scalar s_r = ((k + 3 r) % 16) / 4 - 1 at step k (a new
    # value every step, different on every rank): the sum is base * sum_r (r + 1) s_r, exact in
    # float32, checked on the device. The state (k, mismatches) is donated, so the buffers keep
    # their addresses and a captured command buffer is replayed as it is.
    def body(base, k, bad):
        r = lax.axis_index("i").astype(jnp.float32)
        s = ((k[0] + 3.0 * r) % 16.0) * 0.25 - 1.0
        got = jax_rccl.all_reduce(base * (r + 1.0), "i", premul=s)
        w = sum((j + 1.0) * (((k[0] + 3.0 * j) % 16.0) * 0.25 - 1.0) for j in range(n))
        bad = bad + jnp.sum(got != base * w).astype(jnp.int32).reshape(1)
        return k + 1.0, bad

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")),
                   donate_argnums=(1, 2))
    b0 = ((np.arange(count) % 13) - 6).astype(np.float32)
    base = jax.make_array_from_callback((n * count,), spec, lambda idx: np.tile(b0, n)[idx])
    k = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.float32)[idx])
    bad = jax.make_array_from_callback((n,), spec, lambda idx: np.zeros(n, np.int32)[idx])
    k, bad = step(base, k, bad)
    jax.block_until_ready(bad)
    jax_rccl.reset_runtime_stats()
    for _ in range(1, steps):
        k, bad = step(base, k, bad)
    stats = jax_rccl.runtime_stats()
    ids = [d.id for d in devs]
    print("RESULT " + json.dumps({
        "rank": ids.index(jax.local_devices()[0].id),
        "k": float(np.asarray(k.addressable_shards[0].data)[0]),
        "bad": {"premul": int(np.asarray(bad.addressable_shards[0].data)[0])},
        "executions": int(stats["executions"]), "errors": int(stats["errors"]),
    }), flush=True)
    """
)


@pytest.mark.parametrize("cb", [False, True], ids=["plain", "command_buffers"])
@pytest.mark.parametrize("nprocs, count", [(2, 1000), (3, 4097), (4, 1 << 20)])
def test_premul_array_sharing_one_gpu(mps_env, nprocs, count, cb):
    """all_reduce with a per-device premul scalar (a new value every step, different on every
    rank) in 200 steps of `nprocs` processes on one GPU, each result checked on the device; with
    command buffers the launch is replayed and reads each step's scalar."""
    steps = 200
    results = _run_step_processes(mps_env, nprocs, count, steps, cb, script=_PREMUL_WORKER)
    assert sorted(r["rank"] for r in results) == list(range(nprocs))
    for r in results:
        assert r["k"] == steps, r
        assert r["bad"] == {"premul": 0}, r
        assert r["errors"] == 0, r
        if cb:
            assert r["executions"] <= steps // 10, r
        else:
            assert r["executions"] == steps - 1, r
