"""The world table: which process owns which device, on which host, in this run.

A program of several JAX processes (``jax.distributed.initialize``) compiles one SPMD program in
every process, and a replica group may hold devices of other processes. When the first
collective runs (the runtime connects its first replica group and calls ``ensure_world``, which
``jax_rccl._ffi`` installs with ``set_world_provider``), the processes meet once through JAX's
own distributed key-value store; lowering, compiling or exporting a program waits for nobody:

- process 0 publishes a random session id (``jax_rccl/session``, public: it names the run's
  shared-memory segments, so stale segments of a crashed run never meet a new one) and a random
  256-bit secret (``jax_rccl/secret``): it goes to the runtime (``set_session_secret``) and never
  into a name, a path, a log line or ``world()``; socket connections prove it in their handshake
  and shared-memory names carry a tag derived from it. Every process reads both before it
  publishes its world entry, so once process 0 has read every entry, every process has the
  secret: process 0 then deletes it from the store (a later reader of the store finds none);
- every process publishes ``{"process", "host", "devices", "pid", "settings"}`` under
  ``jax_rccl/world/<process>`` and reads everyone's (each wait bounded by ``JAX_RCCL_TIMEOUT``;
  a process that never publishes is named in the error);
- only when the run needs sockets (processes on several hosts, or ``JAX_RCCL_TRANSPORT=socket``)
  every process starts its TCP listener, bound to the one address it advertises, and publishes
  ``address:port`` under ``jax_rccl/endpoint/<process>``; a run on one host over shared memory
  opens no listening socket; with processes on several hosts and GPUs here, UCX is made loadable
  for the GPU groups' network (``JAX_RCCL_NET`` auto or ucx: jax_rccl/_ucx.py);
- the table goes to the runtime once: ``_jax_rccl.set_world(world)``.

"host" is ``socket.gethostname()``, or ``JAX_RCCL_HOSTNAME`` when set (for tests: processes of
one machine that claim different hosts talk over sockets). The listener's address is
``JAX_RCCL_SOCKET_IFADDR`` when set, else the address of the first interface
``JAX_RCCL_SOCKET_IFNAME`` matches (NCCL's syntax), else loopback when every process runs on this
host, else the local address of the interface that reaches JAX's coordinator, else the address
``gethostbyname(gethostname())`` gives.

A single-process program does nothing here: every device is local.
"""

from __future__ import annotations

import atexit
import json
import os
import secrets
import socket
import threading
import time

import jax

from jax_rccl import _compat, _jax_rccl

KEY_PREFIX = "jax_rccl"
SESSION_KEY = f"{KEY_PREFIX}/session"
SECRET_KEY = f"{KEY_PREFIX}/secret"
TRANSPORTS = ("auto", "shm", "socket")
#: Settings that change the plan or the wire: every process must use the same values (compared
#: when the processes meet).
AGREED_SETTINGS = (
    "JAX_RCCL_ALGO",
    "JAX_RCCL_PROTO",
    "JAX_RCCL_NCHANNELS",
    "JAX_RCCL_TRANSPORT",
    "JAX_RCCL_NET",
    "JAX_RCCL_P2P_LL_THRESHOLD",
)

_lock = threading.Lock()
_done = False
_error: BaseException | None = None
_world: dict | None = None
_peers: list[dict] | None = None


def world_key(process: int) -> str:
    return f"{KEY_PREFIX}/world/{process}"


def endpoint_key(process: int) -> str:
    return f"{KEY_PREFIX}/endpoint/{process}"


def _param(name: str) -> str | None:
    table, _ = _jax_rccl.params()
    for row in table:
        if row.get("name") == name:
            return row.get("value")
    return None


def agreed_settings() -> dict[str, str]:
    """This process's values of AGREED_SETTINGS (as the runtime reads them)."""
    table, _ = _jax_rccl.params()
    return {row["env"]: row["value"] for row in table if row.get("env") in AGREED_SETTINGS}


def _check_settings(peers) -> None:
    for env in AGREED_SETTINGS:
        values = {int(p["process"]): p.get("settings", {}).get(env) for p in peers}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"process {k}: {v!r}" for k, v in sorted(values.items()))
            raise ValueError(
                f"jax_rccl: the processes disagree on {env} ({shown}); it changes the plan or "
                "the wire, so every process must use the same value"
            )


def timeout_s() -> float:
    """JAX_RCCL_TIMEOUT as the runtime parses it (seconds; its default is declared once, in
    ffi/core/params.h)."""
    return float(_param("timeout"))


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (0 when unknown): pids mean the same process only
    between processes of one namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def hostname() -> str:
    """The host this process says it runs on: JAX_RCCL_HOSTNAME (tests) or the host name."""
    return _param("hostname") or socket.gethostname()


def match_interfaces(spec: str, interfaces: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (name, address) pairs of `interfaces` that JAX_RCCL_SOCKET_IFNAME=`spec` selects, in
    order: comma-separated name prefixes; a leading ``^`` excludes the listed ones instead; a
    leading ``=`` (after ``^`` if both) matches whole names only (NCCL's syntax)."""
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    names = [n.strip() for n in body.split(",") if n.strip()]
    if not names:
        raise ValueError(
            f"jax_rccl: JAX_RCCL_SOCKET_IFNAME={spec!r} names no interface; allowed: "
            "comma-separated name prefixes ('eth,ib'), '^' to exclude ('^docker,lo'), '=' for "
            "exact names ('=eth0')"
        )

    def hit(name: str) -> bool:
        return any(name == n if exact else name.startswith(n) for n in names)

    return [(n, a) for n, a in interfaces if hit(n) != exclude]


def listen_address(all_on_this_host: bool) -> str:
    """The address this process's socket listener binds to and advertises."""
    ifaddr = _param("socket_ifaddr") or ""
    if ifaddr:
        return ifaddr
    ifname = _param("socket_ifname") or ""
    if ifname:
        interfaces = _jax_rccl.network_interfaces()
        chosen = match_interfaces(ifname, interfaces)
        if not chosen:
            have = ", ".join(f"{n} ({a})" for n, a in interfaces) or "none"
            raise ValueError(
                f"jax_rccl: JAX_RCCL_SOCKET_IFNAME={ifname!r} matches none of this host's "
                f"interfaces with an address: {have}"
            )
        return chosen[0][1]
    if all_on_this_host:
        return "127.0.0.1"
    return socket_address()


def socket_address() -> str:
    """The local address of the interface that reaches JAX's coordinator (no packet is sent),
    else gethostbyname(gethostname())."""
    coordinator = _coordinator_address()
    if coordinator:
        host, _, port = coordinator.rpartition(":")
        host = host.strip("[]")
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((host, int(port or 1)))  # no packet: picks the outgoing interface
                return s.getsockname()[0]
        except (OSError, ValueError):
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _coordinator_address() -> str | None:
    return _compat.coordinator_address()


def needs_sockets(transport: str, hosts: list[str]) -> bool:
    """Whether the run's processes talk over sockets: forced, or processes on several hosts."""
    return transport == "socket" or (transport == "auto" and len(set(hosts)) > 1)


def _listen(all_on_this_host: bool) -> str:
    """Starts this process's listener; its endpoint 'address:port'."""
    addr = listen_address(all_on_this_host)
    port = _jax_rccl.socket_listen(addr)
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"{addr}:{port}"


def _prepare_network(hosts: list[str]) -> None:
    """Makes UCX loadable (jax_rccl/_ucx.py: a system UCX first, else the libucx wheel's) when
    this process's groups may reach other processes on it (a build with the UCX backend, and
    JAX_RCCL_NET=ucx, or auto with processes on several hosts): the runtime loads it when it
    first makes such a group's network. On one host, auto stays on our TCP (the processes of a
    host meet over shared memory unless JAX_RCCL_TRANSPORT=socket asks for the network)."""
    net = _param("net") or "auto"
    if net == "socket" or (net == "auto" and len(set(hosts)) <= 1):
        return
    if not _jax_rccl.net_ucx_info()["built"]:
        return
    from jax_rccl import _ucx

    _ucx.load()


def ensure_world() -> dict | None:
    """Meets the other processes once (no-op in a single-process program); the world or None.

    A failure is remembered: a half-published world cannot be published again, so later calls
    raise the same error."""
    global _done, _error
    if _done:
        if _error is not None:
            raise _error
        return _world
    with _lock:
        if not _done:
            try:
                _bootstrap()
            except BaseException as e:
                _error = e
                raise
            finally:
                _done = True
        elif _error is not None:
            raise _error
    return _world


def world() -> dict | None:
    """The table handed to the runtime (None in a single-process program or before first use)."""
    return _world


def peers() -> list[dict] | None:
    """What every process published (process, host, devices, pid, endpoint), by process index."""
    return None if _peers is None else [dict(p) for p in _peers]


def check_ready() -> None:
    """Raises what would stop the processes from meeting and needs none of them to tell: run
    before a program is lowered, so the error comes at trace time (a no-op with one process)."""
    _ready()


def _ready():
    """(client, transport) of a multi-process run; None with one process."""
    nprocesses = jax.process_count()
    if nprocesses <= 1:
        return None
    client = _compat.distributed_client()
    if client is None:
        raise RuntimeError(
            f"jax_rccl: this program runs {nprocesses} JAX processes but "
            "jax.distributed.initialize() was not called in this process; jax_rccl meets the "
            "other processes through JAX's distributed key-value store"
        )
    transport = _param("transport") or "auto"
    if transport not in TRANSPORTS:
        raise ValueError(
            f"jax_rccl: JAX_RCCL_TRANSPORT={transport!r} is not a transport; allowed: "
            f"{', '.join(TRANSPORTS)}"
        )
    return client, transport


def _bootstrap() -> None:
    global _world, _peers
    ready = _ready()
    if ready is None:
        return
    client, transport = ready
    nprocesses = jax.process_count()
    me = jax.process_index()
    timeout = timeout_s()
    deadline = time.monotonic() + timeout

    if me == 0:
        _compat.kv_set(client, SESSION_KEY, secrets.token_hex(8))
        _compat.kv_set(client, SECRET_KEY, secrets.token_hex(32))
    # The session and the secret first: a world entry says its process holds both.
    session = _get(client, SESSION_KEY, deadline, timeout, nprocesses, me, waiting_for=[0])
    secret = _get(client, SECRET_KEY, deadline, timeout, nprocesses, me, waiting_for=[0])
    _jax_rccl.set_session_secret(bytes.fromhex(secret))
    del secret
    mine = {
        "process": me,
        "host": hostname(),
        "devices": [int(d.id) for d in jax.local_devices()],
        "pid": os.getpid(),
        "pid_namespace": _pid_namespace(),
        "settings": agreed_settings(),
    }
    _compat.kv_set(client, world_key(me), json.dumps(mine))
    peers = []
    for p in range(nprocesses):
        if p == me:
            peers.append(mine)
            continue
        raw = _get(client, world_key(p), deadline, timeout, nprocesses, me, waiting_for=[p])
        entry = json.loads(raw)
        if int(entry.get("process", -1)) != p:
            raise RuntimeError(
                f"jax_rccl: the world entry of process {p} names process {entry.get('process')}"
            )
        peers.append(entry)
    if me == 0:  # every process has read the secret (see above)
        _compat.kv_delete(client, SECRET_KEY)

    _check_settings(peers)
    devices = []
    for entry in peers:
        for d in entry["devices"]:
            devices.append({"id": int(d), "process": int(entry["process"]), "host": entry["host"]})
    devices.sort(key=lambda d: d["id"])
    _check_devices(devices)
    table = {"process": me, "nprocesses": nprocesses, "session": session, "devices": devices}
    # A peer of this host that dies before its segments are mapped is named as exited by its pid.
    table["pids"] = [int(p.get("pid", 0)) for p in peers]
    table["pid_namespaces"] = [int(p.get("pid_namespace", 0)) for p in peers]
    hosts = [p["host"] for p in peers]
    if needs_sockets(transport, hosts):
        mine["endpoint"] = _listen(all(h == mine["host"] for h in hosts))
        _compat.kv_set(client, endpoint_key(me), mine["endpoint"])
        endpoints = []
        for p in range(nprocesses):
            if p == me:
                endpoints.append(mine["endpoint"])
                continue
            ep = _get(
                client,
                endpoint_key(p),
                deadline,
                timeout,
                nprocesses,
                me,
                waiting_for=[p],
                key_of=endpoint_key,
                what="their socket endpoints",
            )
            peers[p]["endpoint"] = ep
            endpoints.append(ep)
        table["endpoints"] = endpoints
        _prepare_network(hosts)
    _jax_rccl.set_world(table)
    # Before JAX's own shutdown (atexit runs last-registered first), which may abort the
    # process when a peer is gone: segments of processes that died before every peer
    # mapped them are unlinked here.
    atexit.register(_jax_rccl.reap_shm_session, session)
    _world = table
    _peers = peers


def _get(
    client,
    key,
    deadline,
    timeout,
    nprocesses,
    me,
    *,
    waiting_for,
    key_of=world_key,
    what="their devices",
):
    remaining = deadline - time.monotonic()
    try:
        if remaining <= 0:
            raise TimeoutError(key)
        return _compat.kv_get(client, key, remaining)
    except Exception as e:  # noqa: BLE001 - a deadline is an XlaRuntimeError, not TimeoutError
        missing = [
            p
            for p in range(nprocesses)
            if p != me and _compat.kv_try_get(client, key_of(p)) is None
        ]
        if not missing:
            missing = list(waiting_for)
        raise RuntimeError(
            f"jax_rccl: process {me} waited {timeout:g} s (JAX_RCCL_TIMEOUT) for the other "
            f"processes to publish {what}; process(es) {missing} never did (key "
            f"{key!r}; did every process reach its first jax_rccl collective?)"
        ) from e


def _check_devices(devices) -> None:
    """The published table must agree with JAX's view of the devices."""
    table = {d["id"]: d["process"] for d in devices}
    if len(table) != len(devices):
        raise RuntimeError("jax_rccl: two processes published the same device id")
    jax_view = {int(d.id): int(d.process_index) for d in jax.devices()}
    if table != jax_view:
        diff = sorted(
            i for i in set(table) | set(jax_view) if table.get(i, -1) != jax_view.get(i, -1)
        )
        raise RuntimeError(
            "jax_rccl: the devices the processes published disagree with jax.devices() on "
            f"device ids {diff}"
        )
