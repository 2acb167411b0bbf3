"""Starts N JAX processes on this host, each with its own virtual CPU devices, and collects them.

Every process runs ``worker.py`` (a program by name) after ``jax.distributed.initialize`` with
a coordinator on a free local port. Each launch is bounded: past `timeout` the processes still
running are killed (by pid) and the result says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
RESULT_TAG = "JAX_RCCL_RESULT "


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out to sockets that bind or connect without one."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free port for JAX's coordinator, below the ephemeral range: a port the kernel picked
    (bind to 0) may be given to another socket's connect or listen before the coordinator binds
    it ("Failed to start RPC server"), one below the range is handed out to nobody."""
    high = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(max(1024, high - 12000), high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Proc:
    process: int
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def result(self) -> dict | None:
        """The JSON the worker printed last (``JAX_RCCL_RESULT {...}``), if any."""
        for line in reversed(self.stdout.splitlines()):
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG) :])
        return None

    def describe(self) -> str:
        tail = "\n".join((self.stdout + self.stderr).splitlines()[-40:])
        return f"process {self.process}: rc={self.returncode} timed_out={self.timed_out}\n{tail}"


def launch(
    program: str,
    nprocs: int,
    local_devices: int,
    *,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    env_of=None,
    timeout: float = 60.0,
    jax_rccl_timeout: float = 10.0,
    worker: str = WORKER,
) -> list[Proc]:
    """Runs `program` of worker.py in `nprocs` processes with `local_devices` CPU devices each.

    `env` applies to every process; `env_of(i)` (a dict) to process i on top of it."""
    port = free_port()
    procs = []
    for i in range(nprocs):
        e = dict(os.environ)
        e.update(
            XLA_FLAGS=f"--xla_force_host_platform_device_count={local_devices}",
            JAX_PLATFORMS="cpu",
            JAX_RCCL_TIMEOUT=str(jax_rccl_timeout),
            PYTHONUNBUFFERED="1",
        )
        e.pop("JAX_RCCL_ALGO", None)
        e.pop("JAX_RCCL_PROTO", None)
        e.update(env or {})
        e.update(env_of(i) if env_of else {})
        cmd = [
            sys.executable,
            "-P",
            worker,
            program,
            f"--process={i}",
            f"--nprocs={nprocs}",
            f"--port={port}",
            *args,
        ]
        # Files, not pipes: a chatty process never blocks on a full pipe while we wait on another.
        so, se = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        procs.append((subprocess.Popen(cmd, env=e, stdout=so, stderr=se), so, se))
    deadline = time.monotonic() + timeout
    out = []
    for i, (p, so, se) in enumerate(procs):
        timed_out = False
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            p.kill()
            p.wait()
        so.seek(0)
        se.seek(0)
        out.append(Proc(i, p.returncode, so.read(), se.read(), timed_out))
        so.close()
        se.close()
    return out


def run_together(commands: list[list[str]], *, timeout: float, **popen) -> list[tuple[int, str]]:
    """Starts every command at once (`popen`: Popen's env, cwd, ...), its stdout and stderr one
    text, then waits for each in turn, up to `timeout` seconds each (past it: TimeoutExpired);
    any still running then is killed. Returns (exit status, output) per command."""
    procs = [
        subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)
        for c in commands
    ]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, text) for p, text in zip(procs, texts, strict=True)]


def run_python(code: str, timeout: float) -> subprocess.CompletedProcess:
    """`code` run by a fresh interpreter (``python -P -c``), its stdout and stderr kept as text."""
    return subprocess.run(
        [sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=timeout
    )


def shm_entries(session: str | None = None) -> list[str]:
    """Names under /dev/shm that belong to jax_rccl (of one session when given)."""
    prefix = "jrccl." if session is None else f"jrccl.{session}."
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []
