"""What the GPU tests share to start their worker programs (tests/gpu/worker_*_gpu.py, each run
as `python -P path args...`): whether there is a GPU, a free port, the MPS environment of
processes that share the GPU (the fixture `mps_env`), and the spawn-and-collect-RESULT loop of a
group of JAX processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

import pytest

from jax_rccl._mps import Mps

HERE = os.path.dirname(os.path.abspath(__file__))

# XLA_FLAGS with command buffers on (every fusion and custom call captured, graphs of any size).
COMMAND_BUFFERS = (
    "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
)


def worker(name: str) -> str:
    """The path of the worker program `name` of tests/gpu."""
    return os.path.join(HERE, name)


STEP_WORKER = worker("worker_step_gpu.py")


def xla_flags(cb: bool) -> str:
    """XLA_FLAGS with command buffers on or off (off means off: XLA's default already captures
    custom calls in command buffers)."""
    return COMMAND_BUFFERS if cb else "--xla_gpu_enable_command_buffer="


def gpu_count() -> int:
    try:
        import jax

        return len([d for d in jax.devices() if d.platform == "gpu"])
    except Exception:  # noqa: BLE001 - no backend
        return 0


def has_gpu_runtime() -> bool:
    from jax_rccl import _jax_rccl

    return hasattr(_jax_rccl, "gpu")


def skip_without_gpu() -> None:
    if not has_gpu_runtime() or gpu_count() == 0:
        pytest.skip("needs a GPU build and a GPU")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mps_env():
    """The environment of processes that share the GPU under MPS: a running daemon's, or one this
    fixture starts (as root; `nvidia-cuda-mps-control -d`) and stops again. Skips without MPS:
    time-sliced, a large step waits a time slice per FIFO hand-off."""
    skip_without_gpu()
    mps = Mps()
    why = mps.start()
    if why is not None:
        pytest.skip(f"needs MPS: {why}")
    try:
        yield {**os.environ, **mps.env}
    finally:
        mps.stop()


def process_env(timeout: int, cb: bool | None, **more: str | None) -> dict[str, str | None]:
    """The variables of a process sharing GPU 0 (over its base environment): no preallocated
    pool, JAX_RCCL_TIMEOUT `timeout`, XLA_FLAGS of command buffers on or off (cb None: no
    XLA_FLAGS at all), then `more` (None: the variable unset)."""
    return {
        "CUDA_VISIBLE_DEVICES": "0",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "JAX_RCCL_TIMEOUT": str(timeout),
        "XLA_FLAGS": None if cb is None else xla_flags(cb),
        **more,
    }


def run_processes(
    script: str,
    nprocs: int,
    env_base: Mapping[str, str],
    env_of: Callable[[int], Mapping[str, str | None]],
    args: Sequence[str] = (),
    *,
    timeout: float,
    check_exit: bool = True,
    keep_output: bool = False,
) -> list[dict]:
    """Runs `script` in `nprocs` processes (argv: process, nprocs, port of a free port for JAX's
    coordinator, then `args`), process p with `env_base` and over it `env_of(p)` (a None value
    unsets the variable), stdout and stderr together. Returns each process's RESULT (its RESULT
    lines merged, later keys winning; `keep_output`: key "output" holds the whole output).

    `timeout`: the seconds each process gets to finish; then every process is killed and the test
    fails with the output of those not collected. `check_exit`: every process must exit 0 (the
    workers that leave a failed group may not)."""
    port = free_port()
    procs = []
    for p in range(nprocs):
        env = dict(env_base)
        for k, v in env_of(p).items():
            if v is None:
                env.pop(k, None)
            else:
                env[k] = v
        procs.append(
            subprocess.Popen(
                [sys.executable, "-P", script, str(p), str(nprocs), str(port), *args],
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
    if check_exit:
        failed = [k for k, p in enumerate(procs) if p.returncode != 0]
        assert not failed, "\n".join(
            f"--- process {k}: exit {procs[k].returncode}\n{texts[k][-3000:]}" for k in failed
        )
    out = []
    for k, text in enumerate(texts):
        lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
        assert lines, (
            f"process {k} (exit {procs[k].returncode}) printed no RESULT line:\n{text[-3000:]}"
        )
        res: dict = {}
        for line in lines:
            res.update(json.loads(line[len("RESULT ") :]))
        if keep_output:
            res["output"] = text
        out.append(res)
    return out


def run_step_processes(
    env_base: Mapping[str, str],
    nprocs: int,
    count: int,
    steps: int,
    cb: bool,
    script: str = STEP_WORKER,
    *,
    args: Sequence[str] = (),
    env_of: Callable[[int], Mapping[str, str]] | None = None,
    timeout: float = 240,
    keep_output: bool = False,
) -> list:
    """Runs `script` in `nprocs` processes sharing GPU 0 (argv: process, nprocs, port, count,
    steps, then `args`) and returns each process's RESULT (several RESULT lines of a process:
    merged, later keys win). `env_of(p)`: process p's extra environment, over the defaults below;
    `timeout`: seconds each process gets to finish (then every process is killed and the test
    fails); `keep_output`: each result also holds the process's whole output (key "output")."""

    def env(p: int) -> dict:
        base = process_env(30, cb, PYTHONFAULTHANDLER="1", PYTHONSAFEPATH="1")
        return {**base, **(env_of(p) if env_of is not None else {})}

    return run_processes(
        script,
        nprocs,
        env_base,
        env,
        (str(count), str(steps), *args),
        timeout=timeout,
        keep_output=keep_output,
    )


def run_worker(
    name: str, *args: str, timeout: float, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Runs the worker program `name` of tests/gpu in one process (`env`: its environment, None:
    this process's), its output captured as text."""
    return subprocess.run(
        [sys.executable, "-P", worker(name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
