"""Chunking of one collective (after RCCL enqueue.cc computeCollChunkInfo, computeCollAlignCount,
computeCollLastChunkInfo, computeCollSteps, initCollWorkElem). Golden numbers worked out by hand
from the reference code; the arithmetic is in the comments."""

import pytest
from jax_rccl._jax_rccl import internal

from jax_rccl import planner

BUFF = (262144, 458752, 4194304)  # LL, LL128, Simple (RCCL defaults)


def test_mi300x_all_reduce_1mb_ring_simple():
    # 8 x MI300X (56 channels, 256 threads), all_reduce of 1 MiB float32 (262144 elements).
    # getChannnelThreadInfo: 1048576 < 56*256*64 = 917504 is false -> 56 channels, 256 threads.
    # One CBD task: usableChannels = min(56, 56) = 56;
    #   maxBytesPerChannel = alignUp(divUp(1048576, 56) = 18725, 16) = 18736.
    # chunk: stepSize = 4194304/8 = 524288; Ring/Simple keeps chunkSteps 4 -> chunkSize 2097152;
    #   ring_twice pattern: no halving; chunkCount = 2097152/4 = 524288.
    # alignCount (Simple) = 64*8*16 / 4 = 2048 elements.
    # channel c: enqBytes = min(18736, left) -> divUp(18736, 4) = 4684
    #   -> alignUp(4684, 2048) = 6144.
    #   262144 = 42*6144 + 4096: channels 0..41 take 6144, channel 42 takes 4096 -> 43 channels.
    # lastChunkCount: rem = 6144 % (8*524288) = 6144
    #   -> alignUp(divUp(6144, 8) = 768, 2048) = 2048;
    #   same for 4096 (512 -> 2048). nWarps = 256/64 = 4.
    topo = planner.Topology.preset("mi300x-8")
    d = planner.plan(
        [planner.Task("all_reduce", 1 << 18, "float32")], topo, algorithm="Ring", protocol="Simple"
    ).to_dict()
    t = d["tasks"][0]
    assert (t["algorithm"], t["protocol"], t["pattern"]) == ("ring", "simple", "ring_twice")
    assert t["nthreads"] == 256
    assert t["step_size"] == 524288
    assert t["chunk_size"] == 2097152
    assert t["chunk_count"] == 524288
    assert (t["chunk_steps"], t["slice_steps"]) == (4, 2)
    assert t["nchannels"] == 43
    assert d["kernels"][0]["max_bytes_per_channel"] == 18736
    assert d["kernels"][0]["threads_per_block"] == 256
    parts = {ch["id"]: ch["work"] for ch in d["channels"]}
    assert sorted(parts) == list(range(43))
    for c in range(42):
        (e,) = parts[c]
        assert (e["offset"], e["count"]) == (c * 6144, 6144)
        assert (e["chunk_count"], e["last_chunk_count"], e["nwarps"]) == (524288, 2048, 4)
        assert e["conn_index"] == 0
    (e,) = parts[42]
    assert (e["offset"], e["count"], e["last_chunk_count"]) == (258048, 4096, 2048)
    assert internal.calc_align_count("simple", "float32", 256, "gfx942") == 2048


@pytest.mark.parametrize(
    "proto,dtype,nthreads,arch,expected",
    [
        ("simple", "float32", 256, "gfx942", 64 * 8 * 16 // 4),  # 2048
        ("simple", "float16", 256, "gfx942", 64 * 8 * 16 // 2),  # 4096
        ("simple", "int8", 256, "gfx90a", 64 * 8 * 16),  # 8192
        ("simple", "float32", 512, "sm90", 32 * 8 * 16 // 4),  # warp 32: 1024
        ("ll", "float32", 256, "gfx942", 8 // 4 * 256),  # 512
        ("ll", "int8", 256, "gfx942", 8 * 256),  # 2048
        ("ll128", "bfloat16", 256, "gfx942", 8 // 2 * 256),  # LL128 aligns like LL: 1024
        ("ll", "float64", 128, "gfx942", 1 * 128),  # 128
    ],
)
def test_align_count(proto, dtype, nthreads, arch, expected):
    assert internal.calc_align_count(proto, dtype, nthreads, arch) == expected


def test_ll_and_ll128_chunks():
    # LL: stepSize = 262144/8 = 32768; chunkSteps forced to 1; halved -> 16384 bytes.
    d = internal.coll_chunk_info("all_reduce", "ring", "ll", "float32", 1 << 20, 8)
    assert (d["step_size"], d["chunk_size"], d["chunk_count"]) == (32768, 16384, 4096)
    assert (d["chunk_steps"], d["slice_steps"]) == (1, 1)
    assert d["align_count"] == 512  # 8/4 * 256 threads
    # LL128: stepSize = 458752/8 = 57344; (57344/8)*7 = 50176 bytes; float32 -> 12544.
    d = internal.coll_chunk_info("all_reduce", "ring", "ll128", "float32", 1 << 20, 8)
    assert (d["step_size"], d["chunk_size"], d["chunk_count"]) == (57344, 50176, 12544)


def test_tree_simple_halving():
    # Tree/Simple all_reduce (tree_up_down), depth 7: chunkSteps 1 -> chunkSize = 524288.
    # nBytes = 1 MiB, 8 channels: 1048576/(8*chunk):
    #   loop 1 (< 56 && > 131072): 524288 -> 262144 -> 131072 (stops: not > 131072)
    #   loop 2 (< 28 && > 65536): 1048576/(8*131072) = 1 -> 65536
    #   loop 3 (< 7 && > 32768): 1048576/(8*65536) = 2 -> 32768; float32 -> 8192
    d = internal.coll_chunk_info(
        "all_reduce", "tree", "simple", "float32", 1 << 20, 8, tree_depth=7
    )
    assert d["pattern"] == "tree_up_down"
    assert (d["chunk_size"], d["chunk_count"], d["chunk_steps"]) == (32768, 8192, 1)
    # 1 GiB: 1073741824/(8*524288) = 256 >= 56: no halving.
    d = internal.coll_chunk_info(
        "all_reduce", "tree", "simple", "float32", 1 << 30, 8, tree_depth=7
    )
    assert d["chunk_size"] == 524288


def test_ring_pipeline_halving():
    # Broadcast (pipeline_from), chunkSteps 1: chunkSize = 524288. 1 MiB on 1 channel:
    #   1048576/524288 = 2 < 64 && > 262144 -> 262144 (4, stop: not > 262144)
    #   4 < 32 && > 131072 -> 131072 (8); 8 < 16 && > 65536 -> 65536 (16); 16 < 8 false.
    d = internal.coll_chunk_info(
        "broadcast", "ring", "simple", "int8", 1 << 20, 1, chunk_steps=1, slice_steps=1
    )
    assert d["pattern"] == "pipeline_from"
    assert (d["chunk_size"], d["chunk_count"]) == (65536, 65536)


def test_tree_ll128_uses_log2_nodes_and_ppn():
    # 16 ranks on 2 nodes: ppn = 8, nsteps = 1 + log2i(2) + 0.1*8 = 2.8.
    # LL128 buffer 8x the default: stepSize = 3670016/8 = 458752 -> (458752/8)*7 = 401408.
    # 4 MiB on 2 channels: loop 1 (< 2.8*64/8 = 22.4 && > 131072):
    #   4194304/(2*401408) = 5 -> 200704; 4194304/(2*200704) = 10 -> 100352 (stop: not > 131072)
    #   loop 2 (< 2.8*16/8 = 5.6 && > 32768): 4194304/(2*100352) = 20, not < 5.6 -> 100352.
    def tree_ll128_4mib(nranks, nnodes):
        return internal.coll_chunk_info(
            "all_reduce",
            "tree",
            "ll128",
            "float32",
            4 << 20,
            2,
            nranks=nranks,
            nnodes=nnodes,
            buff_sizes=[262144, 3670016, 4194304],
        )

    d = tree_ll128_4mib(16, 2)
    assert (d["chunk_size"], d["chunk_count"]) == (100352, 25088)
    # One node of 8: nsteps = 1 + 0 + 0.8 = 1.8; 1.8*64/8 = 14.4: 5 < 14.4 -> 200704;
    #   10 < 14.4 -> 100352.
    d = tree_ll128_4mib(8, 1)
    assert d["chunk_size"] == 100352


def test_last_chunk_and_steps():
    # Ring all_reduce part of 6144 float32, chunkCount 524288, 8 ranks:
    #   last = alignUp(divUp(6144 % 4194304, 8), 2048) = alignUp(768, 2048) = 2048
    #   steps = divUp(6144, 8*524288) * 7 * 2 * 4 = 56
    d = internal.coll_chunk_info(
        "all_reduce", "ring", "simple", "float32", 1 << 20, 56, work_count=6144
    )
    assert (d["last_chunk_count"], d["steps"]) == (2048, 56)
    # A part larger than one loop: 4194304 + 100 -> rem 100 -> divUp(100, 8) = 13 -> 2048;
    #   steps = divUp(4194404, 4194304) = 2 -> 2*7*2*4 = 112.
    d = internal.coll_chunk_info(
        "all_reduce", "ring", "simple", "float32", 1 << 20, 56, work_count=4194304 + 100
    )
    assert (d["last_chunk_count"], d["steps"]) == (2048, 112)
    # all_gather ring: lastChunkCount = chunkCount; steps = divUp(6144, 2097152) * 7 * 4 = 28.
    d = internal.coll_chunk_info(
        "all_gather", "ring", "simple", "int8", 1 << 20, 56, work_count=6144
    )
    assert (d["last_chunk_count"], d["steps"]) == (2097152, 28)
    # tree all_reduce: steps = divUp(6144, 8192) * 1 = 1.
    d = internal.coll_chunk_info(
        "all_reduce", "tree", "simple", "float32", 1 << 20, 8, work_count=6144
    )
    assert (d["last_chunk_count"], d["steps"]) == (8192, 1)


def test_chunk_count_field_limit():
    # Simple buffer of 512 MiB: stepSize 64 MiB, chunk 256 MiB of int8 = 2^28 elements, which
    # does not fit the 25-bit chunkCount field.
    with pytest.raises(ValueError, match="chunkCount"):
        internal.coll_chunk_info(
            "all_reduce", "ring", "simple", "int8", 1 << 30, 1, buff_sizes=[262144, 458752, 1 << 29]
        )


def test_empty_protocol_buffer_is_an_error():
    with pytest.raises(ValueError, match="buff_sizes"):
        internal.coll_chunk_info(
            "all_reduce", "ring", "ll", "float32", 1 << 20, 1, buff_sizes=[0, 458752, 4194304]
        )


def test_root_in_elements():
    # Reduce to root 3: every element carries the root.
    topo = planner.Topology.preset("mi300x-8")
    d = planner.plan(
        [planner.Task("reduce", 4096, "float32", root=3)], topo, algorithm="Ring", protocol="Simple"
    ).to_dict()
    for ch in d["channels"]:
        for e in ch["work"]:
            assert e["root"] == 3
