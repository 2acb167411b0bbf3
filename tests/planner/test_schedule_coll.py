"""Scheduling collectives onto channels (after RCCL enqueue.cc scheduleCollTasksToPlan,
addCBDCollToPlan, addTunedCollToPlan, appendWorkElemColl). Golden numbers worked out by hand
from the reference code; the arithmetic is in the comments."""

import pytest

from jax_rccl import planner
from jax_rccl.planner import Task

MI300X = planner.Topology.preset("mi300x-8")  # 8 ranks, 56 channels, gfx942 (warp 64)


def parts_of(d, task):
    """{channel: [(offset, count), ...]} of one task."""
    out = {}
    for ch in d["channels"]:
        for e in ch["work"]:
            if e["task"] == task:
                out.setdefault(ch["id"], []).append((e["offset"], e["count"]))
    return out


def test_three_all_reduces_aggregate():
    # Three float32 sum all_reduces: 64 Ki (task 0, 256 KiB), 256 Ki (task 1, 1 MiB) and
    # 128 Ki elements (task 2, 512 KiB). RCCL's collCmp queue is in descending count order:
    # task 1, task 2, task 0; all share (coll, op, dtype) and are costed as one aggregate of
    # 458752 elements = 1835008 bytes (agg_bytes of each).
    # Per task getChannnelThreadInfo (threshold 256*64 = 16384 bytes per channel):
    #   task 1: 1048576 >= 56*16384 -> 56; task 2: 524288 -> 32; task 0: 262144 -> 16.
    # usableChannels = min(56, 56+32+16) = 56; maxBytesPerChannel = alignUp(1835008/56, 16) = 32768.
    # Each channel share: 32768 bytes = 8192 elements (a multiple of alignCount 2048):
    #   task 1: 262144/8192 = 32 channels (0..31), task 2: 16 (32..47), task 0: 8 (48..55).
    d = planner.plan(
        [Task("all_reduce", 1 << 16), Task("all_reduce", 1 << 18), Task("all_reduce", 1 << 17)],
        MI300X,
        algorithm="Ring",
        protocol="Simple",
    ).to_dict()
    assert [t["agg_bytes"] for t in d["tasks"]] == [1835008] * 3
    assert [t["nchannels"] for t in d["tasks"]] == [8, 32, 16]
    assert [t["kernel"] for t in d["tasks"]] == [0, 0, 0]
    assert d["kernels"][0]["max_bytes_per_channel"] == 32768
    assert d["kernels"][0]["nwork"] == 56
    for task, first in ((1, 0), (2, 32), (0, 48)):
        parts = parts_of(d, task)
        n = d["tasks"][task]["nchannels"]
        assert parts == {first + i: [(i * 8192, 8192)] for i in range(n)}


def test_different_dtypes_do_not_aggregate():
    # float32 and float16 are separate aggregates: each is costed on its own bytes.
    d = planner.plan(
        [Task("all_reduce", 1 << 18, "float32"), Task("all_reduce", 1 << 18, "float16")],
        MI300X,
        algorithm="Ring",
        protocol="Simple",
    ).to_dict()
    assert [t["agg_bytes"] for t in d["tasks"]] == [1 << 20, 1 << 19]


def test_tuned_task_goes_to_least_loaded_channels():
    # Task 0: 1 MiB float32, channel-by-data: channels 0..41 hold 6144 elements (24576 bytes),
    #   channel 42 holds 4096 (16384 bytes) (see test_chunk). Channels 43..55 are empty.
    # Task 1: 256 Ki float16 (512 KiB); the tuner fixes 4 channels -> user-tuned, scheduled after
    #   the CBD tasks and out of the CBD byte total (maxBytesPerChannel stays 18736).
    # alignCount = 8192/2 = 4096; countPerChannel = alignUp(65536, 4096) = 65536 -> 4 channels.
    # least[] starts as [0,1,2,3] (max 24576 at index 0, strict compares keep it);
    #   c=42 (16384 < 24576) replaces index 0 -> [42,1,2,3], max now index 1;
    #   c=43 -> [42,43,2,3]; c=44 -> [42,43,44,3]; c=45 -> [42,43,44,45], max = 16384 at 0;
    #   c=46 (0 < 16384) -> [46,43,44,45], max 0; c=47..55 are not < 0.
    # Parts in bid order: ch 46 @0, ch 43 @65536, ch 44 @131072, ch 45 @196608.
    # chunkCount = 2097152/2 = 1048576; lastChunkCount = alignUp(divUp(65536, 8), 4096) = 8192.
    def tuner(coll, nbytes, num_pipe_ops):
        assert coll == "all_reduce" and num_pipe_ops == 1
        return (None, None, 4) if nbytes == 1 << 19 else None

    d = planner.plan(
        [Task("all_reduce", 1 << 18, "float32"), Task("all_reduce", 1 << 18, "float16")],
        MI300X,
        algorithm="Ring",
        protocol="Simple",
        tuner=tuner,
    ).to_dict()
    t0, t1 = d["tasks"]
    assert (t0["user_tuned"], t1["user_tuned"]) == (False, True)
    assert (t0["nchannels"], t1["nchannels"]) == (43, 4)
    assert d["kernels"][0]["max_bytes_per_channel"] == 18736
    assert parts_of(d, 1) == {
        46: [(0, 65536)],
        43: [(65536, 65536)],
        44: [(131072, 65536)],
        45: [(196608, 65536)],
    }
    for ch in d["channels"]:
        for e in ch["work"]:
            if e["task"] == 1:
                assert (e["chunk_count"], e["last_chunk_count"]) == (1048576, 8192)


def test_tiny_fifo_splits_group_into_kernels():
    # work_fifo_depth 256, FIFO launch: a budget of 128 works per kernel.
    # Three 1 MiB float32 all_reduces, each tuned to 56 channels (nchannels after
    # getChannnelThreadInfo: 1048576 >= 56*16384 -> 56; that is the budget each must see).
    # Each: countPerChannel = alignUp(divUp(262144, 56) = 4682, 2048) = 6144 -> 43 channels,
    #   43 works. Budget: 128 -> 85 -> 42 < 56: the third task opens kernel 1.
    # The second task takes the least loaded channels: 43..55 (empty) replace picks 0..12, so it
    #   lands on 43..55 and 13..42; its last part (4096 elements at 258048) on channel 42.
    topo = MI300X.replace(work_fifo_depth=256)
    d = planner.plan(
        [Task("all_reduce", 1 << 18) for _ in range(3)],
        topo,
        algorithm="Ring",
        protocol="Simple",
        tuner=lambda c, n, p: (None, None, 56),
        persistent=False,
    ).to_dict()
    assert sorted(t["kernel"] for t in d["tasks"]) == [0, 0, 1]
    assert [k["nwork"] for k in d["kernels"]] == [86, 43]
    assert all(t["nchannels"] == 43 for t in d["tasks"])
    k0 = [t["index"] for t in d["tasks"] if t["kernel"] == 0]
    k1 = [t["index"] for t in d["tasks"] if t["kernel"] == 1]
    first, second = (p for p in (parts_of(d, i) for i in k0))
    if 0 not in first:
        first, second = second, first
    assert sorted(first) == list(range(43))
    assert sorted(second) == list(range(13, 56))
    assert second[43] == [(0, 6144)]
    assert second[13] == [(13 * 6144, 6144)]
    assert second[42] == [(258048, 4096)]
    assert sorted(parts_of(d, k1[0])) == list(range(43))


def test_persistent_plan_is_not_split():
    d = planner.plan(
        [Task("all_reduce", 1 << 18) for _ in range(3)],
        MI300X.replace(work_fifo_depth=256),
        algorithm="Ring",
        protocol="Simple",
        tuner=lambda c, n, p: (None, None, 56),
    ).to_dict()
    assert [k["nwork"] for k in d["kernels"]] == [129]


def test_cbd_estimate_over_budget_fails_like_rccl():
    # RCCL's CBD budget check estimates nChannels = divUp(aggnBytes * usable, totalCBDBytes) with
    # the aggregate's bytes. 100 channels, two 1 MiB float32 all_reduces, depth 256 (budget 128):
    #   task A: divUp(2 MiB * 100, 2 MiB) = 100 <= 128 -> placed on 43 channels (alignUp(
    #   divUp(20976, 4), 2048) = 6144 each) -> budget 85 < 100: next kernel.
    #   kernel 1: only B's 1 MiB is left: divUp(2 MiB * 100, 1 MiB) = 200 > 128 -> nothing fits,
    #   and RCCL reports NCCL_WORK_FIFO_DEPTH as too small.
    topo = MI300X.replace(nchannels=100, work_fifo_depth=256)
    with pytest.raises(ValueError, match="work_fifo_depth"):
        planner.plan(
            [Task("all_reduce", 1 << 18) for _ in range(2)],
            topo,
            algorithm="Ring",
            protocol="Simple",
            persistent=False,
        )


def test_zero_count_tasks_get_no_work():
    d = planner.plan([Task("all_reduce", 0), Task("all_reduce", 1024)], MI300X).to_dict()
    assert d["tasks"][0]["kernel"] == -1
    assert parts_of(d, 0) == {}
    assert d["tasks"][1]["kernel"] == 0
