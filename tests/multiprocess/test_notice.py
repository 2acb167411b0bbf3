"""Failure notices between hosts (ffi/comm/notice.h): a process whose communicator failed posts
its error to the listener of each process of its group on another host, which takes it while its
own kernels still wait (GPU groups across hosts name both calls of a mismatch on every process
this way, tests/gpu/test_gpu_calls.py). Here three plain processes on loopback: the one that
listens takes the notice of a peer that knows the run's secret, with its code and text whole, and
never one of a stranger that does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_shm_transport import load_native, publish, wait_file  # noqa: E402

GROUP = 0x5EED
INVALID_USAGE = 2  # Code::kInvalidUsage (ffi/core/status.h)
TEXT = "jax_rccl 'psum': mismatched calls: rank 1 sent a step of its call #3 'pmax' " + "x" * 3000


def role(args: dict) -> dict:
    native = load_native()
    folder, session = args["folder"], args["session"]
    native.set_session_secret(args["secret"].encode())
    deadline = time.monotonic() + 30
    if args["role"] == "listener":
        port = native.socket_listen("127.0.0.1")
        publish(folder, "ep", f"127.0.0.1:{port}")
        wait_file(os.path.join(folder, "sent"), deadline)
        got = None
        while got is None and time.monotonic() < deadline:
            got = native.take_failure_notice(GROUP, 1, [0, 2])
            time.sleep(0.01)
        again = native.take_failure_notice(GROUP, 1, [0, 2])
        other_group = native.take_failure_notice(GROUP + 1, 1, [0, 2])
        return {"got": got, "again": again, "other_group": other_group}
    ep = wait_file(os.path.join(folder, "ep"), deadline)
    took = native.send_failure_notices(
        GROUP, args["process"], session, [(1, ep)], INVALID_USAGE, TEXT, 2.0
    )
    return {"took": took}


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
        peer = _run(folder, session, {"role": "sender", "process": 0, "secret": secret})
        peer_took = _result(peer)["took"]
        publish(folder, "sent", "")
        res = _result(listener)
    assert stranger_took == 0, "a process without the run's secret posted a notice"
    assert peer_took == 1
    code, text = res["got"]
    assert code == INVALID_USAGE
    assert text == "process 0 (another host): " + TEXT
    assert res["again"] is None, "a notice was taken twice"
    assert res["other_group"] is None


if __name__ == "__main__":
    print(json.dumps(role(json.loads(sys.argv[1]))))
