"""jax_rccl's ``jax_plugins`` entry point: JAX imports it and calls `initialize` when it starts
its backends, in every program of an environment where jax_rccl is installed. It imports nothing
of jax_rccl unless ``JAX_RCCL_LAX`` asks for jax_rccl as jax.lax's backend (jax_rccl.install()),
so a program that does not ask is left exactly as it was."""

from __future__ import annotations

import os


def initialize() -> None:
    """Installs jax_rccl as jax.lax's backend when ``JAX_RCCL_LAX`` is set to 1 or names
    platforms (jax_rccl/lax_backend.py checks the value); nothing otherwise."""
    if os.environ.get("JAX_RCCL_LAX", "").strip() in ("", "0"):
        return
    from jax_rccl import lax_backend

    lax_backend.initialize()
