"""NVIDIA's Multi-Process Service for JAX processes that share one GPU (the GPU tests and
benchmarks run several processes on one GPU; without MPS their kernels are time-sliced)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile


def mps_running() -> bool:
    """Whether an MPS control daemon runs on this machine."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "nvidia-cuda-mps-control":
                    return True
        except OSError:
            continue
    return False


class Mps:
    """MPS for child processes: a running daemon's environment, or a daemon started here (as root)
    in a temporary folder and stopped by stop()."""

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.control: str | None = None
        self.folder: tempfile.TemporaryDirectory | None = None
        self.state = "off"

    def start(self) -> str | None:
        """None when MPS runs, else why not."""
        if mps_running():
            self.state = "already running"
            return None
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            return "nvidia-cuda-mps-control is not on PATH"
        if os.geteuid() != 0:
            return "starting MPS needs root (nvidia-cuda-mps-control -d)"
        self.folder = tempfile.TemporaryDirectory(prefix="jrccl_mps.")
        env = {
            "CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.folder.name, "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.folder.name, "log"),
        }
        for d in env.values():
            os.makedirs(d)
        rc = subprocess.run([control, "-d"], env={**os.environ, **env}, timeout=30).returncode
        if rc != 0:
            self.folder.cleanup()
            self.folder = None
            return f"nvidia-cuda-mps-control -d failed (exit {rc})"
        self.env, self.control, self.state = env, control, "started by this run"
        return None

    def stop(self) -> None:
        if self.control is not None:
            subprocess.run(
                [self.control],
                input="quit\n",
                text=True,
                env={**os.environ, **self.env},
                timeout=30,
            )
            self.control = None
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None
