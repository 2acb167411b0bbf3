"""Programs of the call-identity and fault tests (test_calls_mp.py), run by launcher.py like
worker.py's: ``python -P worker_calls.py <program> --process=i --nprocs=N --port=P [options]``.

Each reports ``JAX_RCCL_RESULT {json}``: ``ok`` (the program ran to its end), ``raised`` and
``error`` (the collective under test raised), ``wrong`` (a result differed from NumPy), the
time the failing call took and the session (for the /dev/shm check).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -P: not on the path
from worker import _global, _raised, barrier, init, report, run_programs, session  # noqa: E402


def _setup(args):
    jax = init(args)
    import numpy as np
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    import jax_rccl as jr

    mesh = Mesh(np.array(jax.devices()), ("i",))
    return jax, np, jr, mesh, P


def _meet():
    """The processes meet now (the first collective to run would): the session exists."""
    from jax_rccl import _bootstrap

    _bootstrap.ensure_world()


def _sm(jax, mesh, P, body, out=None):
    return jax.jit(
        jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i") if out is None else out)
    )


def _wrong(np, arr, want) -> list[str]:
    bad = []
    for s in arr.addressable_shards:
        got = np.asarray(s.data)
        if got.shape != want[s.index].shape or not np.allclose(got, want[s.index]):
            bad.append(
                f"device {s.device.id}: got {got.ravel()[:4]}, want {want[s.index].ravel()[:4]}"
            )
    return bad


def prog_identity(args):
    """--mode=extra_lower: process 0 alone lowers (and compiles) one more jitted collective
    first; --mode=order: the processes lower f and g in different orders. Then every process
    runs f and g; both must be right."""
    jax, np, jr, mesh, P = _setup(args)
    n = len(jax.devices())
    full = np.arange(n * 64, dtype=np.float32).reshape(n, 64)
    x = _global(jax, mesh, P("i"), full)
    f = _sm(jax, mesh, P, lambda v: jr.psum(v, "i"))
    g = _sm(jax, mesh, P, lambda v: jr.all_gather(v, "i", tiled=True))
    if args.mode == "extra_lower" and args.process == 0:
        extra = _sm(jax, mesh, P, lambda v: jr.pmax(v * 2, "i"))
        extra.lower(x).compile()
    if args.mode == "order":
        for fn in (f, g) if args.process % 2 == 0 else (g, f):
            fn.lower(x)
    yf, yg = f(x), g(x)
    wrong = _wrong(np, yf, np.broadcast_to(full.sum(0), full.shape))
    wrong += _wrong(np, yg, np.tile(full, (n, 1)))
    report(ok=True, wrong=wrong, session=session())


def prog_swap(args):
    """Executables A (psum) and B (all_gather) run once in order; then process 0 runs A, B and
    the others B, A. --sites=K first runs one program of K distinct psums (K call sites);
    --swap=op then has process 0 run psum where the others run pmax (same shape); --swap=perm
    has process 0 run ppermute [(1, 0)] where the others run [(0, 1)] (both ranks wait to
    receive: only the timeout's question to the peers finds the mismatch)."""
    jax, np, jr, mesh, P = _setup(args)
    n = len(jax.devices())
    full = np.arange(n * 1024, dtype=np.float32).reshape(n, 1024) + 1
    x = _global(jax, mesh, P("i"), full)
    if args.sites:
        sizes = list(range(1, args.sites + 1))

        def many(v):
            return sum(jr.psum(v[:, :k], "i").sum() for k in sizes)[None, None]

        out = _sm(jax, mesh, P, many)(x)
        jax.block_until_ready(out)
        want = sum(full[:, :k].sum() for k in sizes)
        got = [float(np.asarray(s.data).ravel()[0]) for s in out.addressable_shards]
        if any(abs(v - want) > 1e-3 * abs(want) for v in got):
            report(ok=True, wrong=[f"many: {got} want {want}"], session=session())
            return
    a = _sm(jax, mesh, P, lambda v: jr.psum(v, "i"))
    if args.swap == "op":
        b = _sm(jax, mesh, P, lambda v: jr.pmax(v, "i"))
    elif args.swap == "perm":  # each rank's first step a receive: no step ever tells them apart
        a = _sm(jax, mesh, P, lambda v: jr.ppermute(v, "i", [(1, 0)]))
        b = _sm(jax, mesh, P, lambda v: jr.ppermute(v, "i", [(0, 1)]))
    else:
        b = _sm(jax, mesh, P, lambda v: jr.all_gather(v, "i", tiled=True))
    jax.block_until_ready((a(x), b(x)))
    barrier("swap/warm")  # every process done with A and B before the orders differ
    order = (a, b) if args.process == 0 else (b, a)
    if args.swap in ("op", "perm"):
        order = (a,) if args.process == 0 else (b,)
    outs = []

    def run():
        for fn in order:
            outs.append(fn(x))
        jax.block_until_ready(outs)

    res = _raised(run)
    wrong = []
    if not res["raised"]:
        wrong = [
            f"returned without an error: {np.asarray(o.addressable_shards[0].data).ravel()[:4]}"
            for o in outs
        ]
    report(ok=True, wrong=wrong, session=session(), **res)


def prog_fault(args):
    """After one good psum, process --victim is killed (--mode=killed), stops itself with
    SIGSTOP (frozen; a detached killer ends it later) or sleeps without calling (idle); the
    others call the psum again."""
    jax, np, jr, mesh, P = _setup(args)
    n = len(jax.devices())
    f = _sm(jax, mesh, P, lambda v: jr.psum(v, "i"))
    full = np.ones((n, 4096), np.float32)
    x = _global(jax, mesh, P("i"), full)
    jax.block_until_ready(f(x))
    barrier("fault/good")  # the good psum done everywhere before the victim goes
    if args.process == args.victim:
        sys.stdout.flush()
        if args.mode == "killed":
            os.kill(os.getpid(), signal.SIGKILL)
        if args.mode == "frozen":
            subprocess.Popen(
                ["sh", "-c", f"sleep {args.linger}; kill -KILL {os.getpid()}"],
                start_new_session=True,
            )
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(args.linger)
        report(ok=True, victim=True, session=session())
        os._exit(0)
    res = _raised(lambda: jax.block_until_ready(f(x + 1)))
    report(ok=True, session=session(), **res)
    sys.stdout.flush()
    _survivors_meet(args, [q for q in range(args.nprocs) if q != args.victim])
    os._exit(0)  # JAX's shutdown would wait for the victim


def _survivors_meet(args, survivors):
    """Process 0 hosts JAX's coordination service, and the others abort when it goes away: it
    waits (a bounded time) until every other survivor has reported before it exits."""
    from jax_rccl import _compat

    client = _compat.distributed_client()
    try:
        _compat.kv_set(client, f"calls_test/done/{args.process}", "1")
    except Exception:  # noqa: BLE001 - this process's report is out already
        # The service can be gone already (process 0 left its wait early): nothing is lost, the
        # result was printed before the meet.
        if args.process == 0:
            raise
    if args.process != 0:
        return
    for q in survivors:
        try:
            _compat.kv_get(client, f"calls_test/done/{q}", 30.0)
        except Exception:  # noqa: BLE001 - the test reports a survivor that did not finish
            pass


def _psum_of_ones_met(args):
    """(jax, a jitted psum over every device, its input of ones), once the processes met (before
    anyone dies)."""
    jax, np, jr, mesh, P = _setup(args)
    n = len(jax.devices())
    f = _sm(jax, mesh, P, lambda v: jr.psum(v, "i"))
    x = _global(jax, mesh, P("i"), np.ones((n, 256), np.float32))
    _meet()
    return jax, f, x


def _killed_during(jax, f, x):
    """Starts f(x) and is killed (SIGKILL) 0.5 s into it."""
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    jax.block_until_ready(f(x))
    time.sleep(10)


def prog_early_death(args):
    """Process 1 starts the first collective and is killed 0.5 s into it; process 0 sleeps
    first (it has not mapped process 1's segment yet) and then calls (--mode=call) or exits
    without calling (--mode=exit)."""
    jax, f, x = _psum_of_ones_met(args)
    if args.process == 1:
        _killed_during(jax, f, x)
        return
    time.sleep(3)
    res = {"raised": False}
    if args.mode == "call":
        res = _raised(lambda: jax.block_until_ready(f(x)))
    report(ok=True, session=session(), **res)
    sys.stdout.flush()
    if args.mode == "call":
        os._exit(0)  # JAX's shutdown would wait for the dead process
    # --mode=exit: a normal exit (the runtime reaps the dead process's segments at exit)


def prog_coordinator_death(args):
    """Process 0, which holds JAX's coordination service, starts the first collective (it creates
    its segment) and is killed 0.5 s into it, before process 1 (asleep) mapped that segment.
    Process 1 is then ended by JAX, as JAX ends the survivors when the service goes away, or,
    should JAX not have done so within 3 s, ends itself the same way (SIGABRT): no process of the
    job runs its exit handlers."""
    jax, f, x = _psum_of_ones_met(args)
    report(ok=True, session=session())
    if args.process == 0:
        _killed_during(jax, f, x)
        return
    time.sleep(3)
    os.abort()


PROGRAMS = {
    "identity": prog_identity,
    "swap": prog_swap,
    "fault": prog_fault,
    "early_death": prog_early_death,
    "coordinator_death": prog_coordinator_death,
}


def main(argv=None) -> int:
    return run_programs(
        PROGRAMS,
        argv,
        (
            ("--mode", {"default": ""}),
            ("--swap", {"default": "kind"}),
            ("--sites", {"type": int, "default": 0}),
            ("--victim", {"type": int, "default": 2}),
            ("--linger", {"type": float, "default": 12.0}),
        ),
        shutdown_timeout=2,
    )


if __name__ == "__main__":
    sys.exit(main())
