"""All-reduce across JAX processes on one host: jax_rccl (shared memory, and the network between
the processes with JAX_RCCL_TRANSPORT=socket: our TCP over loopback, and UCX) next to
jax.lax.psum (JAX's CPU collectives, gloo) in the same run, and MPI (mpi4py Allreduce, mpi4jax)
where it is installed.

    .venv/bin/python -P benchmarks/multiprocess.py [--nprocs 4] [--max-mb 64] [--no-mpi]
        [--donate] [--heap-buffers]

The parent starts `--nprocs` JAX processes of one CPU device each (jax.distributed on a local
port); each times float32 all-reduces of 1 KB .. `--max-mb` MB with both libraries, size by
size, and prints its figures; a call's time is the slowest process's mean over a timed loop
(best of `--reps` loops). The socket column is a second JAX job of the same processes with
JAX_RCCL_TRANSPORT=socket; MPI runs as a job under ``mpirun -n <nprocs>``. ``jax_local`` is the
same jitted shard_map program with a local ``v * 1.0`` in place of the collective: what any JAX
collective pays around its communication (dispatch, a fresh output buffer). ``jax_rccl_donated``
is a third JAX job that donates its input and feeds each result to the next call, under
``jax_rccl.config(in_place=True)``: the all-reduce runs in the donated buffer and, like MPI's
reused buffers, nothing is allocated or copied per call; the last ratio columns set MPI against
it. ``jax_rccl_nocheck`` is jax_rccl with ``JAX_RCCL_CHECK_CALLS=0`` (receivers skip the check of
every FIFO step against their own call, docs/multiprocess.md): the ratio ``jax_rccl/
jax_rccl_nocheck`` is what the per-call check costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # _common, under python -P too

import _common  # noqa: E402

TAG = "JAX_RCCL_BENCH "


def sizes(max_mb: float) -> list[int]:
    return _common.sizes(1024, max_mb * 2**20)


def iterations(nbytes: int) -> int:
    return int(max(3, min(200, 2**26 // nbytes)))


def timed(fn, reps: int, iters: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(iters)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


# --- one JAX process ---------------------------------------------------------------------------


def jax_worker(args) -> None:
    _common.join_local_job(args.port, args.nprocs, args.process)
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_rccl

    if args.donate:
        # Donated inputs: the all-reduce runs in their buffers (see jax_rccl.config). The
        # setting is part of the jit key, so it stays on for the whole worker.
        in_place = jax_rccl.config(in_place=True)
        in_place.__enter__()
    devs = jax.devices()
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    spec = P("i")

    def compiled(psum):
        return jax.jit(
            jax.shard_map(lambda v: psum(v, "i"), mesh=mesh, in_specs=spec, out_specs=spec),
            donate_argnums=(0,) if args.donate else (),
        )

    def local_only(v, axis):  # the same program without communication: JAX's own floor
        return v * 1.0

    libs = {
        "jax_rccl": compiled(jax_rccl.psum),
        "lax_gloo": compiled(jax.lax.psum),
        "jax_local": compiled(local_only),
    }
    libs = {k: v for k, v in libs.items() if k in args.libs.split(",")}
    for nbytes in sizes(args.max_mb):
        count = nbytes // 4
        local = np.full((1, count), args.process + 1, np.float32)

        def make(local=local, count=count):
            return jax.make_array_from_callback(
                (n, count), NamedSharding(mesh, spec), lambda idx: local
            )

        x = make()
        iters = iterations(nbytes)
        for lib, f in libs.items():
            if args.donate:
                x = make()  # the previous library consumed it
            y = f(x)  # compile + warm up
            jax.block_until_ready(y)
            want = n * (n + 1) / 2 if lib != "jax_local" else args.process + 1
            got = float(np.asarray(y.addressable_shards[0].data)[0, -1])
            if got != want:
                raise AssertionError(f"{lib} {nbytes} B: got {got}, want {want}")

            state = [y]

            def loop(k, f=f, x=x, state=state):
                if args.donate:  # each call reduces the last result, no fresh buffer
                    for _ in range(k):
                        state[0] = f(state[0])
                    jax.block_until_ready(state[0])
                    return
                out = None
                for _ in range(k):
                    out = f(x)
                jax.block_until_ready(out)

            t = timed(loop, args.reps, iters)
            label = args.label if args.label and lib == "jax_rccl" else lib
            print(TAG + json.dumps({"lib": label, "bytes": nbytes, "s": t}), flush=True)


# --- one MPI rank --------------------------------------------------------------------------------


def mpi_worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mpi4jax_allreduce = None
    try:
        import jax
        import jax.numpy as jnp
        import mpi4jax

        def one(x):
            out = mpi4jax.allreduce(x, op=MPI.SUM, comm=comm)
            return out[0] if isinstance(out, tuple) else out  # older mpi4jax: (value, token)

        mpi4jax_allreduce = jax.jit(one)
    except ImportError:
        pass
    if comm.rank == 0:
        print(TAG + json.dumps({"lib": "_mpi4jax", "available": mpi4jax_allreduce is not None}))
    for nbytes in sizes(args.max_mb):
        src = np.full(nbytes // 4, comm.rank + 1, np.float32)
        dst = np.empty_like(src)
        comm.Allreduce(src, dst, op=MPI.SUM)

        def loop(k, src=src, dst=dst):
            for _ in range(k):
                comm.Allreduce(src, dst, op=MPI.SUM)

        comm.Barrier()
        t = comm.reduce(timed(loop, args.reps, iterations(nbytes)), op=MPI.MAX, root=0)
        if comm.rank == 0:  # one writer: ranks share mpirun's stdout
            print(TAG + json.dumps({"lib": "mpi4py", "bytes": nbytes, "s": t}), flush=True)
        if mpi4jax_allreduce is not None:
            x = jnp.asarray(src)
            y = mpi4jax_allreduce(x)
            jax.block_until_ready(y)
            if float(np.asarray(y)[-1]) != comm.size * (comm.size + 1) / 2:
                raise AssertionError(f"mpi4jax {nbytes} B: wrong sum {np.asarray(y)[-1]}")

            def jloop(k, x=x):
                out = None
                for _ in range(k):
                    out = mpi4jax_allreduce(x)
                jax.block_until_ready(out)

            comm.Barrier()
            t = comm.reduce(timed(jloop, args.reps, iterations(nbytes)), op=MPI.MAX, root=0)
            if comm.rank == 0:
                print(TAG + json.dumps({"lib": "mpi4jax", "bytes": nbytes, "s": t}), flush=True)


# --- the parent ----------------------------------------------------------------------------------


def collect(text: str, into: dict) -> None:
    for line in text.splitlines():
        if line.startswith(TAG):
            r = json.loads(line[len(TAG) :])
            if "available" in r:
                into[r["lib"]] = r["available"]
                continue
            key = (r["lib"], r["bytes"])
            into[key] = max(into.get(key, 0.0), r["s"])  # the slowest process


# --heap-buffers: glibc keeps large blocks in the heap instead of mapping fresh pages for each
# (JAX allocates every call's output; fresh pages fault in one by one), for every worker alike.
HEAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(256 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def run_jax(args, results, libs: str, label: str = "", extra_env=None, donate=None) -> None:
    donate = args.donate if donate is None else donate
    port = _common.free_port()
    procs = []
    for i in range(args.nprocs):
        env = dict(
            os.environ,
            XLA_FLAGS="--xla_force_host_platform_device_count=1",
            JAX_PLATFORMS="cpu",
            JAX_RCCL_TIMEOUT="120",
            **(HEAP_ENV if args.heap_buffers else {}),
            **(extra_env or {}),
        )
        cmd = [
            sys.executable,
            "-P",
            __file__,
            "--role=jax",
            f"--process={i}",
            f"--nprocs={args.nprocs}",
            f"--port={port}",
            f"--max-mb={args.max_mb}",
            f"--reps={args.reps}",
            f"--libs={libs}",
            f"--label={label}",
        ] + (["--donate"] if donate else [])
        out = tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    failed = False
    job: dict = {}
    for i, (p, out) in enumerate(procs):
        try:
            p.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.seek(0)
        text = out.read()
        collect(text, job)
        if p.returncode != 0 and not failed:
            failed = True
            print(f"process {i} failed (rc {p.returncode}):\n" + text[-3000:], file=sys.stderr)
    if failed:
        raise SystemExit(1)
    # --job-repeats: the best of the repeated jobs (each job's figure is its slowest process)
    for k, v in job.items():
        old = results.get(k)
        results[k] = min(old, v) if isinstance(v, float) and isinstance(old, float) else v


def run_jax_jobs(args, results, jax_libs) -> None:
    """One round of the JAX jobs: the libraries of one job, then jax_rccl's own jobs."""
    if jax_libs:
        run_jax(args, results, ",".join(jax_libs))
    # jax_rccl again, as a job of its own under one setting each
    for label, env in (
        ("jax_rccl_socket", {"JAX_RCCL_TRANSPORT": "socket", "JAX_RCCL_NET": "socket"}),
        ("jax_rccl_ucx", {"JAX_RCCL_TRANSPORT": "socket", "JAX_RCCL_NET": "ucx"}),
        ("jax_rccl_nocheck", {"JAX_RCCL_CHECK_CALLS": "0"}),
    ):
        if label in args.libs.split(","):
            run_jax(args, results, "jax_rccl", label=label, extra_env=env)
    if "jax_rccl_donated" in args.libs.split(","):
        run_jax(args, results, "jax_rccl", label="jax_rccl_donated", donate=True)


def run_mpi(args, results) -> str:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return "mpirun not found"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return "mpi4py is not installed"
    cmd = [
        mpirun,
        "--oversubscribe",
        "--allow-run-as-root",
        "-n",
        str(args.nprocs),
        sys.executable,
        "-P",
        __file__,
        "--role=mpi",
        f"--max-mb={args.max_mb}",
        f"--reps={args.reps}",
    ]
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        OMPI_MCA_btl="self,vader",
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        **(HEAP_ENV if args.heap_buffers else {}),
    )
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return "mpirun timed out"
    if r.returncode != 0:
        return f"mpirun failed (rc {r.returncode}): {(r.stdout + r.stderr)[-500:]}"
    collect(r.stdout, results)
    return ""


def fmt_size(b: int) -> str:
    return f"{b // 2**20} MB" if b >= 2**20 else f"{b // 1024} KB"


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="parent", choices=["parent", "jax", "mpi"])
    ap.add_argument("--process", type=int, default=0)
    ap.add_argument("--nprocs", type=int, default=4)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-mb", type=float, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument(
        "--job-repeats",
        type=int,
        default=1,
        help="run the JAX jobs this many times, alternating, and keep each figure's best (a "
        "shared or noisy machine: e.g. jax_rccl against jax_rccl_nocheck)",
    )
    ap.add_argument(
        "--libs",
        default="jax_rccl,jax_rccl_nocheck,jax_rccl_donated,jax_rccl_socket,lax_gloo,jax_local",
        help="JAX libraries to time (jax_rccl_socket: jax_rccl with JAX_RCCL_TRANSPORT=socket "
        "on our TCP; jax_rccl_ucx: the same on UCX (JAX_RCCL_NET=ucx); "
        "jax_rccl_donated: jax_rccl with --donate, in the same run; jax_rccl_nocheck: jax_rccl "
        "with JAX_RCCL_CHECK_CALLS=0; jax_local: the same program "
        "with v * 1.0 instead of a collective, JAX's own floor)",
    )
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)
    ap.add_argument(
        "--donate",
        action="store_true",
        help="JAX libraries donate their input and feed each result to the next call (no fresh "
        "output buffer per call, as a training loop that donates its state); jax_rccl runs "
        "under jax_rccl.config(in_place=True)",
    )
    ap.add_argument(
        "--heap-buffers",
        action="store_true",
        help="every worker runs with glibc's MALLOC_MMAP_THRESHOLD_/MALLOC_TRIM_THRESHOLD_ raised, "
        "so large buffers are reused from the heap instead of mapped fresh and faulted in",
    )
    args = ap.parse_args(argv)
    if args.role == "jax":
        jax_worker(args)
        return 0
    if args.role == "mpi":
        mpi_worker(args)
        return 0

    results: dict = {}
    t0 = time.monotonic()
    extra_jobs = ("jax_rccl_socket", "jax_rccl_ucx", "jax_rccl_donated", "jax_rccl_nocheck")
    jax_libs = [lib for lib in args.libs.split(",") if lib not in extra_jobs]
    for _ in range(max(1, args.job_repeats)):
        run_jax_jobs(args, results, jax_libs)
    mpi_note = "skipped (--no-mpi)" if args.no_mpi else run_mpi(args, results)
    libs = args.libs.split(",") + (["mpi4py"] if not mpi_note else [])
    if results.get("_mpi4jax"):
        libs.append("mpi4jax")
    elif not mpi_note:
        mpi_note = "mpi4jax: not installed"
    print(
        f"all-reduce (sum, float32), {args.nprocs} processes x 1 CPU device, one host, "
        f"{os.cpu_count()} cores; time per call (slowest process, best of {args.reps} loops)"
        + ("; --donate" if args.donate else "")
        + ("; --heap-buffers (large blocks reused from the heap)" if args.heap_buffers else "")
    )
    # Ratios against the first library; and MPI's against the donated (in-place) run, where
    # neither side allocates per call.
    pairs = [(lib, libs[0]) for lib in libs[1:] if lib != "jax_rccl_nocheck"]
    if "jax_rccl_nocheck" in libs and "jax_rccl" in libs:
        pairs.append(("jax_rccl", "jax_rccl_nocheck"))  # the cost of the per-call check
    if "jax_rccl_donated" in libs and libs[0] != "jax_rccl_donated":
        pairs += [(m, "jax_rccl_donated") for m in ("mpi4py", "mpi4jax") if m in libs]
    head = ["size"] + libs + [f"{a}/{b}" for a, b in pairs]
    rows = []
    for b in sizes(args.max_mb):
        t = {lib: results.get((lib, b)) for lib in libs}
        ratios = [f"{t[a] / t[b]:.2f}x" if t[a] and t[b] else "-" for a, b in pairs]
        rows.append([fmt_size(b)] + [fmt_time(t[lib]) for lib in libs] + ratios)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    if mpi_note:
        print(f"MPI: {mpi_note}")
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
