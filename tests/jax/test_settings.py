"""Every JAX_RCCL_* setting is checked the same way before any data moves: a bad value is a
ValueError ``jax_rccl: VAR='value' <problem>; allowed: <the parameter's allowed values>`` with no
file:line frames of the C++ side, raised when jax_rccl first registers with JAX (lowering the
first program that uses it), not at the first execution. config() names its argument once; a
misspelt variable's warning points at the user's line.

The checks of single values run in this process (the check reads the environment afresh); the
end-to-end cases run a fresh interpreter with the variable set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

import jax_rccl as jr
from jax_rccl import _ffi

#: The allowed text of every parameter, as jax_rccl.params() gives it (declared in params.h).
ALLOWED = {p["env"]: p["allowed"] for p in jr.params()}


def _settings_error(monkeypatch, var: str, value: str) -> str:
    for k in list(os.environ):
        if k.startswith("JAX_RCCL_") and not k.startswith(_ffi.TEST_PREFIX):
            monkeypatch.delenv(k)
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as e:
        _ffi.check_settings()
    return str(e.value)


def _assert_settings_error(message: str, var: str, value: str, problem: str) -> None:
    """The one shape of a settings error: variable, value, problem, the allowed values."""
    assert re.fullmatch(rf"jax_rccl: {var}='{re.escape(value)}' {problem}; allowed: .+", message), (
        message
    )
    assert ALLOWED[var].split(" (")[0] in message, message
    assert not re.search(r"\.(cc|h):\d+|\n\s+at ", message), f"C++ frames in: {message}"


# One case per kind of setting: an integer, a number, a name of a list, a mask of names (NCCL's
# syntax), a list of platforms, a folder.
KINDS = [
    ("JAX_RCCL_NCHANNELS", "abc", "is not an integer"),
    ("JAX_RCCL_NCHANNELS", "1e20", "is not an integer"),
    ("JAX_RCCL_NCHANNELS", "99999999999999999999", "is not an integer"),
    ("JAX_RCCL_NCHANNELS", "-5", "is out of range"),
    ("JAX_RCCL_CHECK_CALLS", "yes", "is not an integer"),
    ("JAX_RCCL_HUGE_PAGES", "2", "is out of range"),
    ("JAX_RCCL_NET_THREADS", "65", "is out of range"),
    ("JAX_RCCL_NET_NCHANNELS", "-1", "is out of range"),
    ("JAX_RCCL_NET_STREAMS", "two", "is not an integer"),
    ("JAX_RCCL_BUFFSIZE", "1000", "is out of range"),
    ("JAX_RCCL_NET_BUFFSIZE", "1048577", "is out of range"),
    ("JAX_RCCL_P2P_LL_THRESHOLD", "-1", "is out of range"),
    ("JAX_RCCL_TIMEOUT", "abc", "is not a number"),
    ("JAX_RCCL_TIMEOUT", "-1", "is out of range"),
    ("JAX_RCCL_TIMEOUT", "0", "is out of range"),
    ("JAX_RCCL_TIMEOUT", "nan", "is out of range"),
    ("JAX_RCCL_STALL_GRACE", "inf", "is out of range"),
    ("JAX_RCCL_DEBUG", "loud", "is not allowed"),
    ("JAX_RCCL_TRANSPORT", "rdma", "is not allowed"),
    ("JAX_RCCL_NET", "verbs", "is not allowed"),
    ("JAX_RCCL_NET", "UCX", "is not allowed"),
    ("JAX_RCCL_ALGO", "bogus", "has an unknown name 'bogus'"),
    ("JAX_RCCL_ALGO", "^tree,ring,direct", "leaves nothing to choose from"),
    ("JAX_RCCL_PROTO", "x", "has an unknown name 'x'"),
    ("JAX_RCCL_LAX", "tpu", "is not allowed"),
    ("JAX_RCCL_NET_TRACE", "/nonexistent/folder", "is not a folder this process can write"),
    ("JAX_RCCL_SOCKET_IFADDR", "my-host", "is not an IPv4 or IPv6 address"),
    ("JAX_RCCL_SOCKET_IFNAME", "^=", "names no interface"),
]


@pytest.mark.parametrize("var,value,problem", KINDS)
def test_every_bad_setting_is_the_same_value_error(monkeypatch, var, value, problem):
    message = _settings_error(monkeypatch, var, value)
    _assert_settings_error(message, var, value, problem)
    if problem in ("is not an integer", "is not a number"):
        assert message.endswith("(unset it for the default)"), message


@pytest.mark.parametrize(
    "var,value",
    [
        ("JAX_RCCL_DEBUG", "info"),
        ("JAX_RCCL_TIMEOUT", "1e3"),
        ("JAX_RCCL_BUFFSIZE", "1048576"),
        ("JAX_RCCL_NET_BUFFSIZE", "65536"),
        ("JAX_RCCL_NET_STREAMS", "4"),
        ("JAX_RCCL_NET", "auto"),
        ("JAX_RCCL_NET", "socket"),
        ("JAX_RCCL_NET", "ucx"),
        ("JAX_RCCL_NET_TRACE", "/tmp"),
        ("JAX_RCCL_ALGO", "^Tree"),
        ("JAX_RCCL_PROTO", "LL,Simple"),
        ("JAX_RCCL_LAX", "cpu,cuda"),
        ("JAX_RCCL_SOCKET_IFADDR", "127.0.0.1"),
        ("JAX_RCCL_SOCKET_IFADDR", "::1"),
        ("JAX_RCCL_SOCKET_IFNAME", "^docker,lo"),
    ],
)
def test_good_values_are_taken(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    _ffi.check_settings()


def test_every_parameter_says_what_it_allows():
    assert all(p["allowed"] for p in jr.params()), [p["env"] for p in jr.params()]


PROGRAM = """
import jax, numpy as np
from jax.sharding import Mesh, PartitionSpec as P
import jax_rccl as jr
mesh = Mesh(np.array(jax.devices()), ("i",))
f = jax.jit(jax.shard_map(lambda v: jr.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                          out_specs=P("i")))
x = np.ones((len(jax.devices()), 4), np.float32)
try:
    f.lower(x)
except ValueError as e:
    print("LOWER", repr(str(e)), jr.runtime_stats()["executions"])
else:
    print("RESULT", float(f(x)[0, 0]))
"""


def _run(program: str, env: dict[str, str], path: str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("JAX_RCCL_")}
    e.update(env, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    args = [sys.executable, "-P", path] if path else [sys.executable, "-P", "-c", program]
    return subprocess.run(args, env=e, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "var,value,problem",
    [
        ("JAX_RCCL_ALGO", "bogus", "has an unknown name 'bogus'"),
        ("JAX_RCCL_PROTO", "x", "has an unknown name 'x'"),
        ("JAX_RCCL_TIMEOUT", "abc", "is not a number"),
    ],
)
def test_a_bad_setting_fails_the_first_lowering(var, value, problem):
    """Before anything runs: lowering the first program raises, no execution counted."""
    out = _run(PROGRAM, {var: value})
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith(("LOWER", "RESULT"))]
    assert lines, out.stdout + out.stderr
    kind, rest = lines[-1].split(" ", 1)
    assert kind == "LOWER", lines[-1]
    message, executions = rest.rsplit(" ", 1)
    assert executions == "0"
    _assert_settings_error(eval(message), var, value, problem)  # noqa: S307 - a repr we printed


def test_a_good_setting_runs():
    out = _run(PROGRAM, {"JAX_RCCL_ALGO": "Ring", "JAX_RCCL_TIMEOUT": "1e3"})
    assert "RESULT 2.0" in out.stdout, out.stdout + out.stderr


def test_a_misspelt_setting_warns_at_the_users_line(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        textwrap.dedent(
            """\
            import warnings, jax, numpy as np
            from jax.sharding import Mesh, PartitionSpec as P
            import jax_rccl as jr
            mesh = Mesh(np.array(jax.devices()), ("i",))
            f = jax.jit(jax.shard_map(lambda v: jr.psum(v, "i"), mesh=mesh, in_specs=P("i"),
                                      out_specs=P("i")))
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                f(np.ones((2, 4), np.float32))  # line 9
            for x in w:
                if "JAX_RCCL_ALOG" in str(x.message):
                    print("WARNED", x.filename, x.lineno)
            """
        )
    )
    out = _run("", {"JAX_RCCL_ALOG": "ring"}, path=str(script))
    assert f"WARNED {script} 9" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("arg", ["algorithm", "protocol"])
def test_config_names_its_argument_once(arg):
    with pytest.raises(ValueError) as e:
        with jr.config(**{arg: "Bogus"}):
            pass
    message = str(e.value)
    assert message.startswith(f"jax_rccl.config: {arg}='Bogus' has an unknown name 'Bogus'; ")
    assert message.count("jax_rccl.config") == 1, message
    assert "allowed: " in message
