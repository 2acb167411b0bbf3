"""Bad JAX_RCCL_* values are a ValueError naming the variable and what is allowed, raised at the
first use (before anything is lowered), not a silent default; config() names its argument.
Each case runs in a fresh interpreter with the variable set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import jax_rccl as jr

PROGRAM = """
import jax, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_rccl as jr
mesh = Mesh(np.array(jax.devices()), ("i",))
f = jax.jit(jax.shard_map(lambda v: jr.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                          out_specs=P("i")))
try:
    print("RESULT", float(f(np.ones((len(jax.devices()), 4), np.float32))[0, 0]))
except ValueError as e:
    print("VALUEERROR", str(e).splitlines()[0])
"""


def _run(env: dict[str, str]) -> str:
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("JAX_RCCL_"):
            del e[k]
    e.update(env, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    out = subprocess.run(
        [sys.executable, "-P", "-c", PROGRAM], env=e, capture_output=True, text=True, timeout=120
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("RESULT", "VALUEERROR"))]
    assert lines, out.stdout + out.stderr
    return lines[-1]


@pytest.mark.parametrize(
    "var,value,allowed",
    [
        ("JAX_RCCL_TIMEOUT", "abc", "is not a number"),
        ("JAX_RCCL_TIMEOUT", "-1", "a finite number of seconds > 0"),
        ("JAX_RCCL_TIMEOUT", "0", "a finite number of seconds > 0"),
        ("JAX_RCCL_TIMEOUT", "nan", "a finite number of seconds > 0"),
        ("JAX_RCCL_NCHANNELS", "abc", "is not an integer"),
        ("JAX_RCCL_NCHANNELS", "-5", "an integer 0..64"),
        ("JAX_RCCL_NCHANNELS", "1e20", "is not an integer"),
        ("JAX_RCCL_NCHANNELS", "99999999999999999999", "is not an integer"),
        ("JAX_RCCL_DEBUG", "loud", "WARN, INFO or TRACE"),
        ("JAX_RCCL_HUGE_PAGES", "2", "0 or 1"),
        ("JAX_RCCL_CHECK_CALLS", "yes", "is not an integer"),
        ("JAX_RCCL_STALL_GRACE", "-1", "a finite number of seconds >= 0"),
        ("JAX_RCCL_STALL_GRACE", "inf", "a finite number of seconds >= 0"),
        ("JAX_RCCL_NET_THREADS", "65", "an integer 0..64"),
        ("JAX_RCCL_NET_NCHANNELS", "-1", "an integer 0..64 (0: no cap)"),
        ("JAX_RCCL_NET_STREAMS", "65", "an integer 0..64 (0: a stream per channel)"),
        ("JAX_RCCL_NET_STREAMS", "two", "is not an integer"),
        ("JAX_RCCL_NET_TRACE", "/nonexistent/folder", "a folder this process can write"),
        ("JAX_RCCL_BUFFSIZE", "1000", "a multiple of 4096 from 65536 to 67108864"),
        ("JAX_RCCL_BUFFSIZE", "134217728", "a multiple of 4096 from 65536 to 67108864"),
        ("JAX_RCCL_NET_BUFFSIZE", "65535", "a multiple of 4096 from 65536 to 67108864"),
        ("JAX_RCCL_NET_BUFFSIZE", "1048577", "a multiple of 4096 from 65536 to 67108864"),
    ],
)
def test_bad_value_names_the_variable(var, value, allowed):
    line = _run({var: value})
    assert line.startswith("VALUEERROR"), line
    assert f"{var}='{value}'" in line and allowed in line, line


@pytest.mark.parametrize(
    "var,value",
    [
        ("JAX_RCCL_DEBUG", "info"),
        ("JAX_RCCL_TIMEOUT", "1e3"),
        ("JAX_RCCL_BUFFSIZE", "1048576"),
        ("JAX_RCCL_NET_BUFFSIZE", "65536"),
        ("JAX_RCCL_NET_STREAMS", "4"),
        ("JAX_RCCL_NET_TRACE", "/tmp"),
    ],
)
def test_good_values_are_taken(var, value):
    assert _run({var: value}) == "RESULT 2.0"


@pytest.mark.parametrize("arg", ["algorithm", "protocol"])
def test_config_names_its_argument(arg):
    with pytest.raises(ValueError, match=rf"jax_rccl.config\({arg}=\.\.\.\): unknown name"):
        with jr.config(**{arg: "Bogus"}):
            pass
