"""One process of a multi-process jax_rccl test (started by launcher.py; run with python -P).

``python -P worker.py <program> --process=i --nprocs=N --port=P [options]``: initializes
jax.distributed against 127.0.0.1:P, runs the program, checks its results against NumPy
computed on the full input, and prints ``JAX_RCCL_RESULT {json}`` as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

RESULT_TAG = "JAX_RCCL_RESULT "


def report(**kw) -> None:
    print(RESULT_TAG + json.dumps(kw), flush=True)


def _raised(fn) -> dict:
    """Runs fn() (the call under test): whether it raised, its error, the seconds it took."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the error under test
        return {
            "raised": True,
            "error": f"{type(e).__name__}: {e}",
            "seconds": time.monotonic() - t0,
        }
    return {"raised": False, "seconds": time.monotonic() - t0}


def init(args):
    import jax

    if args.gloo:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{args.port}",
        num_processes=args.nprocs,
        process_id=args.process,
        initialization_timeout=args.init_timeout,
        shutdown_timeout_seconds=args.shutdown_timeout,
        heartbeat_timeout_seconds=args.heartbeat_timeout,
    )
    return jax


def barrier(name: str, timeout_s: float = 60.0) -> None:
    """Every process waits here until all have arrived (JAX's coordination service): a call
    that returned on one process may still be handing its last steps to another, so a test
    that then makes the processes disagree on purpose first waits for all of them."""
    from jax_rccl import _compat

    _compat.distributed_client().wait_at_barrier(name, int(timeout_s * 1000))


def session() -> str | None:
    from jax_rccl import _bootstrap

    w = _bootstrap.world()
    return None if w is None else w["session"]


def hosts() -> list[str]:
    from jax_rccl import _bootstrap

    w = _bootstrap.world()
    return [] if w is None else sorted({d["host"] for d in w["devices"]})


def prog_probe(args):
    """Devices and the world table; optionally a jax.lax psum (does CPU need gloo for it?)."""
    jax = init(args)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    devs = [(d.id, d.process_index) for d in jax.devices()]
    info = {"devices": devs, "local": [d.id for d in jax.local_devices()]}
    if args.lax:
        mesh = Mesh(np.array(jax.devices()), ("i",))
        n = len(jax.devices())
        x = jax.make_array_from_callback(
            (n, 4), NamedSharding(mesh, P("i")), lambda idx: np.ones((n, 4), np.float32)[idx]
        )
        f = jax.jit(
            jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
        )
        try:
            y = f(x)
            info["lax_psum"] = float(np.asarray(y.addressable_shards[0].data)[0, 0])
        except Exception as e:  # noqa: BLE001
            info["lax_error"] = f"{type(e).__name__}: {e}"[:500]
    if args.bootstrap:
        from jax_rccl import _bootstrap, _jax_rccl

        native = hasattr(_jax_rccl, "set_world")
        if not native:  # the runtime predates set_world: check the table we would pass
            _jax_rccl.set_world = lambda world: None
        _bootstrap.ensure_world()
        info["world"] = _bootstrap.world()
        info["peers"] = _bootstrap.peers()
        if native and hasattr(_jax_rccl, "world"):
            info["native_world"] = _jax_rccl.world()
    del jnp
    report(ok=True, **info)


class _LaxTwin:
    """jax.lax with jax_rccl's names (``--backend=lax``): checks the harness's NumPy twin and
    that JAX's own collectives run across these processes."""

    def __init__(self):
        import jax

        self.lax = jax.lax
        self.jnp = jax.numpy

    def config(self, **kw):
        import contextlib

        return contextlib.nullcontext()

    def psum(self, x, a):
        return self.lax.psum(x, a)

    def pmean(self, x, a):
        return self.lax.pmean(x, a)

    def pmax(self, x, a):
        return self.lax.pmax(x, a)

    def pmin(self, x, a):
        return self.lax.pmin(x, a)

    def all_reduce(self, x, a, op="sum", premul=None):
        if premul is not None:
            return self.lax.psum(x * premul, a)
        if op == "prod":  # entries are positive: exp(sum(log))
            return self.jnp.round(self.jnp.exp(self.lax.psum(self.jnp.log(x), a)))
        return {"sum": self.lax.psum, "avg": self.lax.pmean}[op](x, a)

    def all_gather(self, x, a, tiled=False):
        return self.lax.all_gather(x, a, tiled=tiled)

    def psum_scatter(self, x, a, tiled=False):
        return self.lax.psum_scatter(x, a, tiled=tiled)

    def all_to_all(self, x, a, split, concat, tiled=False):
        return self.lax.all_to_all(x, a, split, concat, tiled=tiled)

    def ppermute(self, x, a, perm):
        return self.lax.ppermute(x, a, perm)

    def pbroadcast(self, x, a, source):
        # jax.lax.pbroadcast has no CPU lowering: a masked psum instead.
        keep = self.lax.axis_index(a) == source
        return self.lax.psum(self.jnp.where(keep, x, self.jnp.zeros_like(x)), a)

    def preduce(self, x, a, root):
        s = self.lax.psum(x, a)
        return self.jnp.where(self.lax.axis_index(a) == root, s, self.jnp.zeros_like(s))


def _global(jax, mesh, spec, full):
    from jax.sharding import NamedSharding

    return jax.make_array_from_callback(full.shape, NamedSharding(mesh, spec), lambda i: full[i])


def _check(name, arr, expected, failures):
    import numpy as np

    for shard in arr.addressable_shards:
        got = np.asarray(shard.data)
        want = expected[shard.index]
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-5):
            failures.append(
                f"{name}: device {shard.device.id} rows {shard.index}: got {got.ravel()[:6]} "
                f"shape {got.shape}, want {want.ravel()[:6]} shape {want.shape}"
            )


def _flat_collectives(jr, n, only=(), chain=False):
    """Every public collective over the 1-D axis "i" of n devices; body input v: (m,).

    Independent calls may run in any order on each process (XLA's CPU runtime schedules them);
    with `chain`, each call's input depends on the previous call's result (through a zero),
    which fixes one order everywhere."""
    ops = [
        ("psum", lambda v: jr.psum(v, "i")),
        ("pmean", lambda v: jr.pmean(v, "i")),
        ("pmax", lambda v: jr.pmax(v, "i")),
        ("pmin", lambda v: jr.pmin(v, "i")),
        ("prod", lambda v: jr.all_reduce(v, "i", op="prod")),
        ("avg", lambda v: jr.all_reduce(v, "i", op="avg")),
        ("premul", lambda v: jr.all_reduce(v, "i", premul=0.5)),
        ("psum_int", lambda v: jr.psum(v.astype("int32"), "i")),
        ("all_gather", lambda v: jr.all_gather(v, "i", tiled=True)),
        ("psum_scatter", lambda v: jr.psum_scatter(v, "i", tiled=True)),
        ("all_to_all", lambda v: jr.all_to_all(v.reshape(n, -1), "i", 0, 0, tiled=True)),
        ("ppermute", lambda v: jr.ppermute(v, "i", [(j, (j + 1) % n) for j in range(n)])),
        ("pbroadcast", lambda v: jr.pbroadcast(v, "i", n - 1)),
        ("preduce", lambda v: jr.preduce(v, "i", 1 % n)),
    ]
    ops = [(k, f) for k, f in ops if not only or k in only]

    def body(v):
        out = {}
        dep = None
        for name, f in ops:
            x = v if dep is None else v + dep
            out[name] = f(x)
            if chain:  # a float zero XLA cannot fold away (0 * x is not 0 for NaN x)
                dep = (out[name].astype("float32").reshape(-1)[:1] * 0.0).astype(v.dtype)
        return out

    return body


def _flat_expected(full):
    """The NumPy twin of _flat_collectives: expected[name][r] = device r's output."""
    import numpy as np

    n, m = full.shape
    c = m // n
    rep = lambda row: np.broadcast_to(row, (n, *row.shape))  # noqa: E731
    pre = np.zeros_like(full)
    pre[1 % n] = full.sum(0)
    return {
        "psum": rep(full.sum(0)),
        "pmean": rep(full.mean(0)),
        "pmax": rep(full.max(0)),
        "pmin": rep(full.min(0)),
        "prod": rep(full.prod(0)),
        "avg": rep(full.mean(0)),
        "premul": rep(0.5 * full.sum(0)),
        "psum_int": rep(full.astype(np.int32).sum(0)),
        "all_gather": rep(full.reshape(-1)),
        "psum_scatter": full.sum(0).reshape(n, c),
        "all_to_all": full.reshape(n, n, c).transpose(1, 0, 2),
        "ppermute": np.roll(full, 1, axis=0),
        "pbroadcast": rep(full[n - 1]),
        "preduce": pre,
    }


def prog_collectives(args):
    """Each public collective over every device of every process, compared with NumPy; with two
    local devices also a 2-D mesh (processes x local devices): groups across processes only
    and inside each process only."""
    jax = init(args)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    if args.backend == "lax":
        jr = _LaxTwin()
    else:
        import jax_rccl as jr

    if args.algo:
        jr_config = jr.config(algorithm=args.algo)
    else:
        import contextlib

        jr_config = contextlib.nullcontext()
    devs = jax.devices()
    n = len(devs)
    k = len(jax.local_devices())
    failures = []
    mesh = Mesh(np.array(devs), ("i",))
    only = tuple(x for x in args.only.split(",") if x)
    body = _flat_collectives(jr, n, only, chain=args.chain)

    def per_device(v):
        return jax.tree_util.tree_map(lambda y: jnp.expand_dims(y, 0), body(v[0]))

    with jr_config:
        f = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        sizes = [int(s) for s in args.sizes.split(",")]
        rng = np.random.default_rng(0)
        for size in sizes:
            m = n * max(1, size // n)
            full = rng.integers(1, 3, size=(n, m)).astype(np.float32)
            outs = f(_global(jax, mesh, P("i"), full))
            want = _flat_expected(full)
            for name, arr in outs.items():
                _check(f"{name}[m={m}]", arr, want[name], failures)

        if k > 1:
            mesh2 = Mesh(np.array(devs).reshape(args.nprocs, k), ("p", "l"))
            full = rng.integers(1, 3, size=(args.nprocs, k, 8 * k)).astype(np.float32)

            def body2(v):
                v = v[0, 0]
                outs = {
                    "psum_p": jr.psum(v, "p"),
                    "psum_l": jr.psum(v, "l"),
                    "psum_pl": jr.psum(v, ("p", "l")),
                    "gather_p": jr.all_gather(v, "p", tiled=True),
                }
                return jax.tree_util.tree_map(lambda y: y[None, None], outs)

            g = jax.jit(
                jax.shard_map(body2, mesh=mesh2, in_specs=P("p", "l"), out_specs=P("p", "l"))
            )
            outs = g(_global(jax, mesh2, P("p", "l"), full))
            npr = args.nprocs
            want = {
                "psum_p": np.broadcast_to(full.sum(0, keepdims=True), full.shape),
                "psum_l": np.broadcast_to(full.sum(1, keepdims=True), full.shape),
                "psum_pl": np.broadcast_to(full.sum((0, 1), keepdims=True), full.shape),
                # device (p, l) gets the rows of every process at its own l, process-major
                "gather_p": np.stack(
                    [np.stack([full[:, j].reshape(-1)] * npr) for j in range(k)], axis=1
                ),
            }
            for name, arr in outs.items():
                _check(name, arr, want[name], failures)
    if failures:
        raise AssertionError("\n".join(failures[:20]))
    report(
        ok=True,
        session=session(),
        hosts=hosts(),
        checked=sorted(want) if k > 1 else None,
        threads=runtime_threads(),
    )


def runtime_threads() -> list[str]:
    """The names of this process's jax_rccl threads alive now (ffi/core/thread_name.h)."""
    names = set()
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith("jrccl"):
            names.add(name)
    return sorted(names)


def _psum_fn(jax, jr, mesh):
    from jax.sharding import PartitionSpec as P

    return jax.jit(
        jax.shard_map(lambda v: jr.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    )


def _die():
    """A crash, not an exit: no atexit handlers, no jax.distributed shutdown."""
    import signal

    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def prog_killed(args):
    """Process --victim dies before the first collective (--when=before: the survivors wait in
    the bootstrap) or between two collectives (--when=after: they wait in the runtime). The
    survivors must get an error within the timeout; the report carries it and its time."""
    jax = init(args)
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    f = _psum_fn(jax, jr, mesh)
    full = np.ones((n, 1024), np.float32)
    x = _global(jax, mesh, P("i"), full)
    if args.when == "after":
        y = f(x)
        _check("psum", y, np.broadcast_to(full.sum(0), full.shape), failures := [])
        if failures:
            raise AssertionError("\n".join(failures))
        jax.block_until_ready(y)
    if args.process == args.victim:
        _die()
    report(ok=True, session=session(), **_raised(lambda: jax.block_until_ready(f(x + 1))))


def prog_lower_only(args):
    """Process 0 lowers, compiles and exports a jax_rccl program while the others wait at a
    barrier without touching jax_rccl: lowering must meet nobody (it would wait for them until
    JAX_RCCL_TIMEOUT and fail). Then every process runs it: the processes meet then."""
    jax = init(args)
    import numpy as np
    from jax import export
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr
    from jax_rccl import _bootstrap, _jax_rccl

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    f = _psum_fn(jax, jr, mesh)
    full = np.arange(n * 256, dtype=np.float32).reshape(n, 256)
    x = _global(jax, mesh, P("i"), full)
    info = {}
    if args.process == 0:
        t0 = time.monotonic()
        f.lower(x).compile()
        export.export(f)(x)
        info["lower_seconds"] = time.monotonic() - t0
        info["world_after_lowering"] = [_bootstrap.world(), _jax_rccl.world()]
    barrier("lowered", 120)
    y = f(x)
    failures = []
    _check("psum", y, np.broadcast_to(full.sum(0), full.shape), failures)
    if failures:
        raise AssertionError("\n".join(failures))
    w = _bootstrap.world()
    info["world_after_running"] = None if w is None else w["nprocesses"]
    report(ok=True, **info)


def prog_mismatch(args):
    """The processes trace different element counts for the same call site: JAX's checks see
    only the global shapes (equal here), so the runtime must notice and raise, not hang."""
    jax = init(args)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    m = 1024
    count = m if jax.process_index() == 0 else m // 2  # a process-dependent Python value

    def body(v):
        return jnp.sum(jr.psum(v[0, :count], "i"))[None]

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    x = _global(jax, mesh, P("i"), np.ones((n, m), np.float32))
    out = []
    res = _raised(lambda: out.append(jax.block_until_ready(f(x))))
    if out:
        res["values"] = [float(np.asarray(s.data)[0]) for s in out[0].addressable_shards]
    report(ok=True, session=session(), **res)


def listening_sockets() -> list[str]:
    """The TCP sockets this process listens on, as "address:port" (from /proc: every socket in
    LISTEN state whose inode one of this process's descriptors holds)."""
    import socket as pysocket
    import struct

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:[") : -1])
    out = []
    for table, family in (
        ("/proc/net/tcp", pysocket.AF_INET),
        ("/proc/net/tcp6", pysocket.AF_INET6),
    ):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = cols[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if family == pysocket.AF_INET:
                addr = pysocket.inet_ntop(family, struct.pack("<I", int(hexaddr, 16)))
            else:
                words = struct.unpack("<4I", raw)
                addr = pysocket.inet_ntop(family, struct.pack(">4I", *words))
            out.append(f"{addr}:{int(hexport, 16)}")
    return sorted(out)


def prog_listeners(args):
    """The listening sockets jax_rccl opens: those of this process after a psum, minus those
    before (JAX's own coordination service listens in process 0)."""
    jax = init(args)
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr
    from jax_rccl import _jax_rccl

    mesh = Mesh(np.array(jax.devices()), ("i",))
    n = len(jax.devices())
    full = np.arange(n * 4, dtype=np.float32).reshape(n, 4)
    x = _global(jax, mesh, P("i"), full)
    jax.block_until_ready(jax.jit(lambda v: v * 2)(x))  # what JAX itself opens on first use
    before = set(listening_sockets())
    y = _psum_fn(jax, jr, mesh)(x)
    got = np.asarray(y.addressable_shards[0].data)
    ok = bool(np.allclose(got[0], full.sum(0)))
    opened = sorted(set(listening_sockets()) - before)
    from jax_rccl import _bootstrap, _compat

    client = _compat.distributed_client()
    report(
        ok=ok,
        opened=opened,
        secret_left=_compat.kv_try_get(client, _bootstrap.SECRET_KEY) is not None,
        port=int(_jax_rccl.socket_listener_port()),
        endpoints=(_jax_rccl.world() or {}).get("endpoints"),
        session=session(),
    )


PROGRAMS = {
    "probe": prog_probe,
    "collectives": prog_collectives,
    "killed": prog_killed,
    "mismatch": prog_mismatch,
    "lower_only": prog_lower_only,
    "listeners": prog_listeners,
}


def run_programs(programs, argv=None, options=(), shutdown_timeout: int = 10) -> int:
    """The command line every worker module shares: parses ``<program> --process=i --nprocs=N
    --port=P`` and the bootstrap's timeouts, plus `options` ((flag, keyword arguments of
    add_argument) pairs), runs the program and reports an exception it raises (exit 1)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("program", choices=sorted(programs))
    ap.add_argument("--process", type=int, required=True)
    ap.add_argument("--nprocs", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--gloo", action="store_true")
    ap.add_argument("--init-timeout", type=int, default=30)
    ap.add_argument("--shutdown-timeout", type=int, default=shutdown_timeout)
    ap.add_argument("--heartbeat-timeout", type=int, default=100)
    for flag, kw in options:
        ap.add_argument(flag, **kw)
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    try:
        programs[args.program](args)
    except Exception as e:  # noqa: BLE001 - reported to the parent
        traceback.print_exc()
        report(ok=False, error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
        return 1
    return 0


OPTIONS = (
    ("--lax", {"action": "store_true"}),
    ("--bootstrap", {"action": "store_true"}),
    ("--victim", {"type": int, "default": -1}),
    ("--when", {"default": "after"}),
    ("--algo", {"default": ""}),
    ("--backend", {"default": "jax_rccl", "choices": ["jax_rccl", "lax"]}),
    ("--sizes", {"default": "64,40000"}),
    ("--chain", {"action": "store_true", "help": "one order of the collectives"}),
    ("--only", {"default": "", "help": "comma-separated collectives of the flat body"}),
)


def main(argv=None) -> int:
    return run_programs(PROGRAMS, argv, OPTIONS)


if __name__ == "__main__":
    sys.exit(main())
