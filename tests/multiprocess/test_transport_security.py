"""The transports against a stranger on the same host (loopback only).

Sockets: a third process that knows the public session id cannot join (it cannot prove the
run's secret), a listener that is not the peer is refused, and idle connections do not delay a
job's first collective. Shared memory: a segment someone else placed under a name of the run
(another user's, a wrong mode or size, a crafted header) is refused with an error naming it and
never used. A job on one host over shared memory opens no listening socket.

The socket and shared-memory cases run plain Python processes through the runtime's
communicator (this file run as a script, test_shm_transport.py's harness); the listener cases
run JAX processes (launcher.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from launcher import run_python  # noqa: E402
from test_shm_transport import load_native, publish, run_cases, spawn, wait_file, world_of  # noqa: E402

HERE = os.path.abspath(__file__)
HELLO_MAGIC_V1 = 0x6A7263636E657431  # "jrccnet1": the hello of the transport before handshakes
HELLO_MAGIC = 0x6A7263636E657432  # "jrccnet2"
SHM_TAG_LABEL = b"jax_rccl shared-memory names"
SHM_MAGIC = 0x6A72636370736D31  # "jrccpsm1"


def _cases(n: int, count: int = 1000) -> list[dict]:
    return [
        {"coll": "all_reduce", "count": count, "algo": "Ring", "proto": "Simple", "call_site": i}
        for i in range(n)
    ]


# ---- the worker (one process of the job) ----


def worker(args: dict) -> dict:
    native = load_native()
    p, nprocs = args["process"], args["nprocs"]
    world = world_of(p, nprocs, 1, args["session"])
    group, local = list(range(nprocs)), [p]
    folder = args.get("folder")
    out: dict = {"process": p}
    try:
        if args["mode"] == "sockets":
            native.set_session_secret(world["secret"])
            port = native.socket_listen("127.0.0.1")
            publish(folder, f"{p}.ep", f"127.0.0.1:{port}")
            deadline = time.monotonic() + 30
            eps = [wait_file(os.path.join(folder, f"{q}.ep"), deadline) for q in range(nprocs)]
            fake = args.get("fake")
            if fake and p == 0:
                eps[1] = fake  # process 0 connects to rank 1: here to a stranger's listener
            world["endpoints"] = eps
            wait_file(os.path.join(folder, "go"), deadline)  # the stranger has done its part
            t0 = time.monotonic()
            cases = args["cases"]
            out["failures"] = run_cases(native, world, group, local, cases[:1], args["timeout"])
            out["first"] = time.monotonic() - t0
            out["failures"] += run_cases(native, None, group, local, cases[1:], args["timeout"])
            out["counts"] = native.socket_listener_counts()
        elif args["mode"] == "shm":
            if p == args.get("late", -1):
                time.sleep(args["delay"])
            out["failures"] = run_cases(native, world, group, local, args["cases"], args["timeout"])
    except Exception as e:  # noqa: BLE001 - reported to the driver
        out["error"] = f"{type(e).__name__}: {e}"
    return out


# ---- sockets ----


def _launch_sockets(folder: str, stranger, **kw) -> list[dict]:
    """Two processes over loopback sockets; `stranger(endpoints)` runs in this process once both
    listen, before the job's first collective."""
    result: dict = {}

    def attack():
        deadline = time.monotonic() + 60
        eps = [wait_file(os.path.join(folder, f"{q}.ep"), deadline) for q in range(2)]
        try:
            result["kept"] = stranger(eps)
        except BaseException as e:  # noqa: BLE001 - reported below
            result["error"] = repr(e)
        finally:
            publish(folder, "go", "")

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    res = spawn(
        HERE,
        2,
        1,
        "sockets",
        timeout_s=90,
        env_extra={"JAX_RCCL_TRANSPORT": "socket"},
        folder=folder,
        **kw,
    )
    t.join(10)
    for s in result.get("kept") or []:
        s.close()
    assert "error" not in result, f"the stranger failed: {result['error']}"
    return res


def _split(ep: str) -> tuple[str, int]:
    host, _, port = ep.rpartition(":")
    return host, int(port)


def _closed_on(s: socket.socket) -> bool:
    """Whether the other end closes `s` without sending anything (within 5 s)."""
    s.settimeout(5)
    try:
        return s.recv(64) == b""
    except ConnectionResetError:  # closed with our bytes unread
        return True


def _false_proof(s: socket.socket) -> None:
    """Reads the listener's challenge (48 bytes) on `s` and answers it with a proof made up
    without the secret (32 random bytes)."""
    challenge = b""
    while len(challenge) < 48:
        chunk = s.recv(48 - len(challenge))
        assert chunk, "the listener closed before its challenge"
        challenge += chunk
    s.sendall(os.urandom(32))


def _hello(session: str, magic: int = HELLO_MAGIC, group: int = 0, lo: int = 0, hi: int = 1):
    return struct.pack(
        "<QQiiii64s16s", magic, group, 0, lo, hi, 0, session.encode(), os.urandom(16)
    )


def test_impersonation_with_the_session_id_is_rejected():
    """A stranger that knows the session id connects to every listener as rank 0 of the group:
    with the hello of the old transport and forged data frames, and with the new hello and a
    made-up proof. Every attempt is dropped and counted; the job's 40 results stay right."""
    session_box: dict = {}

    def stranger(eps):
        session = session_box["session"]
        for ep in eps:
            # The old hello, then a data frame claiming to be a step of the first call.
            with socket.create_connection(_split(ep), timeout=5) as s:
                frame = b"\x01\x00r\x6a" + bytes(60) + struct.pack("<f", 1e6) * 250
                try:
                    s.sendall(_hello(session, HELLO_MAGIC_V1) + frame)
                except (ConnectionResetError, BrokenPipeError):
                    pass  # dropped while we were still sending
                assert _closed_on(s)  # nothing said
            # The new hello, the challenge read, a proof without the secret.
            with socket.create_connection(_split(ep), timeout=5) as s:
                s.sendall(_hello(session))
                _false_proof(s)
                assert _closed_on(s)
        return []

    with tempfile.TemporaryDirectory() as folder:
        session = uuid.uuid4().hex
        session_box["session"] = session
        res = _launch_sockets(folder, stranger, session=session, cases=_cases(40), timeout=20.0)
    for r in res:
        assert "error" not in r, r["error"]
        assert r["failures"] == [], r["failures"]
        assert r["counts"]["dropped"] >= 2, r["counts"]
        assert r["counts"]["unauthorized"] >= 1, r["counts"]


def test_a_listener_that_is_not_the_peer_is_refused():
    """Process 0's table sends it to a stranger's listener for rank 1, which answers the hello
    with a made-up challenge: process 0 fails naming the authentication, sends no data, and
    process 1 (never connected to) fails by its timeout."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    got: list[bytes] = []

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(112)
            conn.sendall(os.urandom(48))
            conn.settimeout(5)
            try:
                while chunk := conn.recv(65536):
                    got.append(chunk)
            except OSError:
                pass

    threading.Thread(target=serve, daemon=True).start()
    fake = f"127.0.0.1:{listener.getsockname()[1]}"
    with tempfile.TemporaryDirectory() as folder:
        res = _launch_sockets(folder, lambda eps: [], fake=fake, cases=_cases(1), timeout=4.0)
    listener.close()
    assert "failed authentication" in res[0].get("error", ""), res[0]
    assert "rank 1" in res[0]["error"], res[0]
    assert "error" in res[1], res[1]
    assert got == [], "data reached the stranger"


@pytest.mark.parametrize("idle", [3, 50, 300])
def test_idle_connections_do_not_delay_the_first_collective(idle):
    """`idle` connections to each listener that never say a word (300: more than the listener
    keeps in their handshakes, so it drops idle ones for the job's): the job's first collective
    (which opens its connections) takes less than a second longer than without them."""

    def stranger(eps):
        kept = []
        for ep in eps:
            for _ in range(idle):
                kept.append(socket.create_connection(_split(ep), timeout=5))
        return kept

    firsts = {}
    for label, fn in (("none", lambda eps: []), ("idle", stranger)):
        with tempfile.TemporaryDirectory() as folder:
            res = _launch_sockets(folder, fn, cases=_cases(2), timeout=20.0)
        for r in res:
            assert "error" not in r, r["error"]
            assert r["failures"] == [], r["failures"]
        firsts[label] = max(r["first"] for r in res)
    assert firsts["idle"] < firsts["none"] + 1.0, firsts


# ---- shared memory ----


def _shm_job(session: str, *, delay: float, check_left: bool = True) -> list[dict]:
    """One all-reduce of 2 processes over shared memory in `session`; process 1 comes `delay`
    seconds late."""
    return spawn(
        HERE,
        2,
        1,
        "shm",
        timeout_s=60,
        env_extra={"JAX_RCCL_TRANSPORT": "shm"},
        session=session,
        check_left=check_left,
        late=1,
        delay=delay,
        cases=_cases(1),
        timeout=8.0,
    )


def _segments(session: str) -> list[str]:
    return sorted(s for s in os.listdir("/dev/shm") if s.startswith(f"jrccl.{session}."))


def _squat(session: str, build, *, as_user: str | None = None):
    """Starts a 2-process job whose process 1 comes 3 s late; once process 0's segment exists,
    places `build(name0, bytes0)` = (mode, content) under process 1's segment name (as `as_user`
    when given) and returns the processes' results and the name."""
    result: dict = {}

    def attack():
        deadline = time.monotonic() + 20
        while not _segments(session):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        name0 = _segments(session)[0]
        assert name0.endswith(".0"), name0
        name1 = name0[:-2] + ".1"
        path0 = os.path.join("/dev/shm", name0)
        while True:  # until its creator has set the magic word (last)
            with open(path0, "rb") as f:
                seg0 = f.read()
            if seg0[:8] == struct.pack("<Q", SHM_MAGIC):
                break
            time.sleep(0.001)
        mode, content = build(name0, seg0)
        result["name"] = name1
        # Written whole under another name, then renamed: the job sees it complete at once.
        code = (
            "import os,sys;p=sys.argv[1];m=int(sys.argv[2]);t=p+'.part';"
            "fd=os.open(t,os.O_CREAT|os.O_EXCL|os.O_WRONLY,m);os.fchmod(fd,m);"
            "os.write(fd,sys.stdin.buffer.read());os.close(fd);os.rename(t,p)"
        )
        cmd = [sys.executable, "-c", code, os.path.join("/dev/shm", name1), str(mode)]
        if as_user is not None:
            cmd = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *cmd]
        subprocess.run(cmd, input=content, check=True)

    t = threading.Thread(target=attack, daemon=True)
    t.start()
    try:
        res = _shm_job(session, delay=3.0, check_left=False)
    finally:
        t.join(10)
        name = result.get("name")
        if name and os.path.exists(os.path.join("/dev/shm", name)):
            os.unlink(os.path.join("/dev/shm", name))
    for s in _segments(session):
        os.unlink(os.path.join("/dev/shm", s))
    return res, result.get("name")


def _crafted_header(seg0: bytes) -> bytes:
    """Process 0's header as process 1's (rank 1), with the region placed far outside the file."""
    seg = bytearray(seg0)
    struct.pack_into("<i", seg, 16, 1)  # rank
    struct.pack_into("<q", seg, 32, 1 << 40)  # regionOffset
    return bytes(seg)


def _refused(res, name: str, what: str):
    err = res[0].get("error", "")
    assert f"refused the shared-memory segment /{name}" in err, res[0]
    assert what in err, res[0]
    # Process 1 cannot create its own segment under the taken name; it is not used either.
    assert "error" in res[1], res[1]


@pytest.mark.parametrize(
    "case",
    ["mode", "size", "header", "connection"],
)
def test_a_segment_placed_by_someone_else_is_refused(case):
    session = uuid.uuid4().hex

    def build(name0, seg0):
        if case == "mode":
            return 0o644, seg0
        if case == "size":
            return 0o600, seg0 + bytes(4096)
        if case == "header":
            return 0o600, _crafted_header(seg0)
        # A connection header of the region whose slot offset points outside the file.
        seg = bytearray(seg0)
        struct.pack_into("<i", seg, 16, 1)
        region = struct.unpack_from("<q", seg, 32)[0]
        conn = region + 4096  # the first connection header (RankRegion::kHeadersOffset)
        # HostConn: tail, head (64 bytes each), slotSizes[8], tags[8] (32 bytes), slotBytes,
        # dataOffset.
        struct.pack_into("<q", seg, conn + 128 + 8 * 8 + 32 * 8 + 8, 1 << 40)
        return 0o600, bytes(seg)

    res, name = _squat(session, build)
    assert name, "process 0 made no segment"
    want = {
        "mode": "with mode 0644",
        "size": "bytes, this process expects",
        "header": "places the region at",
        "connection": "the connection of channel 0 from rank 0",
    }[case]
    _refused(res, name, want)


def _unprivileged() -> str | None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    try:
        return str(pwd.getpwnam("nobody").pw_uid)
    except KeyError:
        return None


@pytest.mark.skipif(_unprivileged() is None, reason="needs root and setpriv (runs as nobody)")
def test_another_users_segment_is_refused():
    """Another user (nobody) places a world-writable segment with the right size and a valid
    header under process 1's name: refused on its owner, never mapped."""
    session = uuid.uuid4().hex
    res, name = _squat(
        session, lambda name0, seg0: (0o666, _crafted_header(seg0)), as_user=_unprivileged()
    )
    assert name
    _refused(res, name, f"it belongs to uid {_unprivileged()}")


def test_segment_names_carry_a_tag_of_the_secret():
    """The names hold 16 hex digits derived from the run's secret and the group (not from the
    session id or the group alone): no group's names can be predicted from another's."""
    session = uuid.uuid4().hex
    seen: list[str] = []

    def watch():
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            seen.extend(_segments(session))
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    res = _shm_job(session, delay=0.5)
    t.join(10)
    for r in res:
        assert "error" not in r and r["failures"] == [], r
    assert seen
    secret = world_of(0, 2, 1, session)["secret"]
    prefix, group, tag, rank = seen[0].rsplit(".", 3)
    assert prefix == f"jrccl.{session}" and rank in ("0", "1"), seen
    want = hmac.new(secret, SHM_TAG_LABEL + b"|" + group.encode(), hashlib.sha256).hexdigest()
    assert tag == want[:16], (seen, want)


# ---- listeners (JAX processes) ----


def _listeners(env: dict) -> list[dict]:
    from launcher import launch

    procs = launch("listeners", 2, 2, env=env, timeout=90)
    out = []
    for p in procs:
        assert not p.timed_out and p.result is not None and p.result.get("ok"), p.describe()
        out.append(p.result)
    return out


def test_a_job_over_shared_memory_opens_no_listening_socket():
    for r in _listeners({"JAX_RCCL_TRANSPORT": "auto"}):
        assert r["opened"] == [], r
        assert r["port"] == 0 and not r["endpoints"], r


def test_forced_sockets_on_one_host_listen_on_loopback_only():
    res = _listeners({"JAX_RCCL_TRANSPORT": "socket"})
    for r in res:
        assert r["opened"] == [f"127.0.0.1:{r['port']}"], r
        assert r["port"] > 0
    assert res[0]["endpoints"] == [f"127.0.0.1:{r['port']}" for r in res]


@pytest.mark.parametrize("transport", ["auto", "socket"])
def test_the_secret_leaves_the_key_value_store_once_every_process_has_it(transport):
    """Process 0 deletes the run's secret from JAX's key-value store once every process has read
    it (each reads it before it publishes its world entry), so a later reader of the store
    (anyone who reaches the coordinator's port) finds none."""
    for r in _listeners({"JAX_RCCL_TRANSPORT": transport}):
        assert r["secret_left"] is False, r


def test_the_listener_refuses_a_wildcard_address():
    """Run in a fresh process: the listener is process-wide."""
    code = (
        "from jax_rccl import _jax_rccl as n\n"
        "n.set_session_secret(b'k' * 32)\n"
        "for a in ('0.0.0.0', '::', 'not-an-address'):\n"
        "    try:\n"
        "        n.socket_listen(a)\n"
        "        print('listened', a)\n"
        "    except ValueError as e:\n"
        "        print('refused', a, e)\n"
        "print('port', n.socket_listener_port())\n"
    )
    out = run_python(code, timeout=60).stdout
    assert out.count("refused") == 3 and "listened" not in out, out
    assert "JAX_RCCL_SOCKET_IFADDR" in out and "port 0" in out, out


def test_socket_ifname_picks_the_interface_and_names_the_variable():
    from jax_rccl import _bootstrap, _jax_rccl

    interfaces = _jax_rccl.network_interfaces()
    assert ("lo", "127.0.0.1") in interfaces
    assert _bootstrap.match_interfaces("lo", interfaces)[0] == ("lo", "127.0.0.1")
    assert _bootstrap.match_interfaces("=lo", [("lo0", "1.2.3.4"), ("lo", "127.0.0.1")]) == [
        ("lo", "127.0.0.1")
    ]
    assert ("lo", "127.0.0.1") not in _bootstrap.match_interfaces("^lo", interfaces)
    with pytest.raises(ValueError, match="JAX_RCCL_SOCKET_IFNAME"):
        _bootstrap.match_interfaces("^", interfaces)


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))), flush=True)
