"""Failure notices between hosts (ffi/comm/notice.h): a process whose communicator failed posts
its error to the listener of each process of its group on another host, which takes it while its
own kernels still wait (GPU groups across hosts name both calls of a mismatch on every process
this way, tests/gpu/test_gpu_calls.py). Here plain processes on loopback: the one that listens
takes the notice of a peer that knows the run's secret, with its code and text whole, prefers a
peer's own finding to a failure another peer learned from a reset, and never takes a stranger's;
a sender gives up on a listener that never answers at its deadline, not after the kernel's
connect retries."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_shm_transport import load_native, publish, wait_file  # noqa: E402

GROUP = 0x5EED
INVALID_USAGE = 2  # Code::kInvalidUsage (ffi/core/status.h)
TIMEOUT = 5  # Code::kTimeout
TEXT = "jax_rccl 'psum': mismatched calls: rank 1 sent a step of its call #3 'pmax' " + "x" * 3000


def role(args: dict) -> dict:
    native = load_native()
    folder, session = args["folder"], args["session"]
    native.set_session_secret(args["secret"].encode())
    deadline = time.monotonic() + 30
    if args["role"] == "listener":
        port = native.socket_listen("127.0.0.1")
        publish(folder, "ep", f"127.0.0.1:{port}")
        if "from" in args:  # waits while the notices come
            return {"got": native.await_failure_notice_from(GROUP, 1, args["from"], 20000)}
        wait_file(os.path.join(folder, "sent"), deadline)
        got = native.take_failure_notice(GROUP, 1)
        again = native.take_failure_notice(GROUP, 1)
        other_group = native.take_failure_notice(GROUP + 1, 1)
        return {"got": got, "again": again, "other_group": other_group}
    ep = args.get("endpoint") or wait_file(os.path.join(folder, "ep"), deadline)
    primary = args.get("primary", True)
    text = args.get("text") or (TEXT if primary else "connection reset by rank 0")
    code = INVALID_USAGE if primary else TIMEOUT
    t0 = time.monotonic()
    took = native.send_failure_notices(
        GROUP, args["process"], session, [(1, ep)], code, text, args.get("timeout", 1.0), primary
    )
    return {"took": took, "seconds": time.monotonic() - t0}


def _run(folder: str, session: str, role_args: dict) -> subprocess.Popen:
    args = dict(role_args, folder=folder, session=session)
    return subprocess.Popen(
        [sys.executable, "-P", os.path.abspath(__file__), json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_a_peer_posts_its_failure_and_a_stranger_cannot():
    secret = uuid.uuid4().hex
    session = uuid.uuid4().hex[:16]
    with tempfile.TemporaryDirectory() as folder:
        listener = _run(folder, session, {"role": "listener", "secret": secret})
        stranger = _run(
            folder, session, {"role": "sender", "process": 2, "secret": uuid.uuid4().hex}
        )
        stranger_took = _result(stranger)["took"]
        # A peer that learned of the failure from a reset (process 3) posts before the one that
        # found it (process 4): the listener's process takes the finding.
        second = _run(
            folder, session, {"role": "sender", "process": 3, "secret": secret, "primary": False}
        )
        second_took = _result(second)["took"]
        peer = _run(folder, session, {"role": "sender", "process": 4, "secret": secret})
        peer_took = _result(peer)["took"]
        publish(folder, "sent", "")
        res = _result(listener)
    assert stranger_took == 0, "a process without the run's secret posted a notice"
    assert peer_took == 1 and second_took == 1
    code, text = res["got"]
    assert code == INVALID_USAGE
    assert text == "process 4 (by network notice): " + TEXT
    assert res["again"] is None, "a notice was taken twice"
    assert res["other_group"] is None


def test_a_wait_for_one_process_takes_its_notice_not_an_earlier_primary_one():
    """A rank that found a mismatch with a rank of process 5 waits for process 5's account of
    its call: a primary notice of process 4 and a reset of process 3 that came first are not it."""
    secret = uuid.uuid4().hex
    session = uuid.uuid4().hex[:16]
    with tempfile.TemporaryDirectory() as folder:
        listener = _run(folder, session, {"role": "listener", "secret": secret, "from": 5})
        for p, primary in ((3, False), (4, True)):
            sender = {"role": "sender", "process": p, "secret": secret, "primary": primary}
            assert _result(_run(folder, session, sender))["took"] == 1
        answer = {"role": "sender", "process": 5, "secret": secret, "primary": False}
        answer["text"] = "rank 5 runs its call #3 'psum' (all_reduce float32 x8192)"
        assert _result(_run(folder, session, answer))["took"] == 1
        res = _result(listener)
    code, text = res["got"]
    assert text == "process 5 (by network notice): " + answer["text"], text


def _silent_listener() -> tuple[socket.socket, list[socket.socket]]:
    """A listening socket whose accept queue is full: the kernel drops further connection
    attempts (SYNs), so a blocking connect would wait for its retries (minutes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    fill = []
    for _ in range(4):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(srv.getsockname())
        except BlockingIOError:
            pass
        fill.append(c)
    time.sleep(0.3)
    return srv, fill


def test_a_listener_that_never_answers_costs_the_deadline_only():
    srv, fill = _silent_listener()
    port = srv.getsockname()[1]
    try:
        res = _result(
            _run(
                "",
                "sess",
                {
                    "role": "sender",
                    "process": 0,
                    "secret": "s" * 32,
                    "endpoint": f"127.0.0.1:{port}",
                },
            )
        )
    finally:
        for c in fill:
            c.close()
        srv.close()
    assert res["took"] == 0
    assert res["seconds"] < 3.0, f"the notice took {res['seconds']:.1f} s with a 1 s deadline"


if __name__ == "__main__":
    print(json.dumps(role(json.loads(sys.argv[1]))))
