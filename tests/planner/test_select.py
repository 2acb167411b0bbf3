"""Algorithm/protocol selection (ffi/planner/select.cc): SetDerived, the tuner hook, the argmin
over the cost model with masks and backup, channel/thread counts, patterns, device functions,
and the NCCL_ALGO / NCCL_PROTO mask syntax.

Expected values come from the cost tables of test_cost_model.py (same topologies); the arithmetic
is in the comments.
"""

import pytest
from jax_rccl._jax_rccl import internal

from planner.topologies import H100, MI300X

# MI250X-like pivot topology (RCCL rome_model_56: pivotA2ANumBiRings=3, tuning 1).
MI250X = dict(
    nRanks=16,
    nNodes=1,
    arch="gfx90a",
    intraLink="xgmi",
    bwIntra=10.0,
    nChannels=32,
    pivotA2ANumBiRings=3,
)

MiB = 1 << 20


def sel(topo, coll="all_reduce", nbytes=MiB, dtype="float32", **kw):
    itemsize = {"float32": 4, "int8": 1, "float16": 2, "int32": 4, "float64": 8}[dtype]
    return internal.select(topo, coll, nbytes // itemsize, dtype, **kw)


def choice(d):
    """What a selection chose: (algorithm, protocol, channels, threads)."""
    return (d["algorithm"], d["protocol"], d["nchannels"], d["nthreads"])


# ---------------------------------------------------------------------------------------------
# SetDerived


def test_set_derived_per_collective():
    # all_gather: count is per rank; nBytes = 1000 * 4 * 8; the data moves as int8 bytes.
    d = internal.select(MI300X, "all_gather", 1000, "float32")
    assert (d["nbytes"], d["work_bytes"], d["count"], d["dtype"]) == (32000, 4000, 4000, "int8")
    assert (d["chunk_steps"], d["slice_steps"]) == (4, 2)  # NCCL_STEPS/2, NCCL_STEPS/4
    # reduce_scatter: per-rank count too, but the type stays.
    d = internal.select(MI300X, "reduce_scatter", 1000, "float32")
    assert (d["nbytes"], d["work_bytes"], d["count"], d["dtype"]) == (32000, 4000, 1000, "float32")
    assert (d["chunk_steps"], d["slice_steps"]) == (4, 2)
    # broadcast: bytes of int8, one step per chunk and slice.
    d = internal.select(MI300X, "broadcast", 1000, "float16")
    assert (d["nbytes"], d["count"], d["dtype"]) == (2000, 2000, "int8")
    assert (d["chunk_steps"], d["slice_steps"]) == (1, 1)
    d = internal.select(MI300X, "reduce", 1000, "float16")
    assert (d["nbytes"], d["count"], d["dtype"]) == (2000, 1000, "float16")
    assert (d["chunk_steps"], d["slice_steps"]) == (1, 1)
    d = internal.select(MI300X, "all_reduce", 1000, "float64")
    assert (d["nbytes"], d["chunk_steps"], d["slice_steps"]) == (8000, 4, 2)


# ---------------------------------------------------------------------------------------------
# The choice


def test_mi300x_choices_by_size():
    # 1 MiB all_reduce (times from the MI300X tables):
    #   ring/ll     23.2 + 1048576/74971.43          = 37.19
    #   tree/ll     23.2 + 1048576/(65600*0.6)       = 49.84   (tuning_model_5 tree corr [14])
    #   ring/simple 67.4 + 1048576/182857.14         = 73.13
    d = sel(MI300X, nbytes=MiB)
    assert (d["algorithm"], d["protocol"]) == ("ring", "ll")
    assert d["predicted_us"] == pytest.approx(
        23.2 + 1048576 / (1000 * 320 * 0.41 * 8 / 14), rel=1e-5
    )
    # channels: 1 MiB >= 16 * 256 threads * 64 (Ring/LL threshold 8*8) -> all 16; AMD keeps 256
    assert (d["nchannels"], d["nthreads"], d["pattern"]) == (16, 256, "ring_twice")
    # 64 MiB: ring/simple 67.4 + 67108864/182857 = 434.4 beats ring/ll 918.3, tree/ll 5138.
    d = sel(MI300X, nbytes=64 * MiB)
    assert choice(d) == ("ring", "simple", 16, 256)
    # 4 KiB: ring/ll 23.2546 vs tree/ll 23.2624; channels shrink while 4096 < nc*256*64 -> 1.
    d = sel(MI300X, nbytes=4096)
    assert choice(d) == ("ring", "ll", 1, 256)


def test_h100_choices_and_threads():
    # 4 KiB: ring/ll 15.0 + 4096/45714 = 15.09 wins. Threads (CUDA path): nc 16 -> 1, then
    # nt 512 -> 256 -> 128 -> 64 while 4096 < nc*nt*64; LL adds no warp; at least 3 warps: 96.
    d = sel(H100, nbytes=4096)
    assert choice(d) == ("ring", "ll", 1, 96)
    # 64 MiB: ring/simple 56 + 67108864/182857 = 423.0 beats ring/ll128 40.6 + 398.9 = 439.5.
    # Ring/Simple adds a sync warp: 512 + 32 = 544.
    d = sel(H100, nbytes=64 * MiB)
    assert choice(d) == ("ring", "simple", 16, 544)
    # Tree/Simple adds four warps: 512 + 4*32 = 640.
    d = sel(H100, nbytes=64 * MiB, algorithm="Tree", protocol="Simple")
    assert (d["algorithm"], d["protocol"], d["nthreads"]) == ("tree", "simple", 640)


def test_masks_are_honoured():
    # Tree only: tree/ll (tree/simple does not exist on one gfx942 node).
    d = sel(MI300X, algorithm="Tree")
    assert (d["algorithm"], d["protocol"], d["pattern"]) == ("tree", "ll", "tree_up_down")
    # No LL: ring/simple (tree/simple missing, LL128 off).
    d = sel(MI300X, protocol="^LL")
    assert (d["algorithm"], d["protocol"]) == ("ring", "simple")
    # H100 at 1 MiB: ring/ll by default; excluding LL leaves tree/ll128 46.76 vs ring/ll128 46.83.
    assert sel(H100)["protocol"] == "ll"
    d = sel(H100, protocol="ll128,simple")
    assert (d["algorithm"], d["protocol"]) == ("tree", "ll128")
    d = sel(H100, algorithm="ring", protocol="LL128")
    assert (d["algorithm"], d["protocol"]) == ("ring", "ll128")


def test_backup_when_masks_leave_nothing():
    # Tree/Simple does not exist on one gfx942 node: with only it allowed, RCCL falls back on a
    # masked Ring at its full bandwidth (ringbdw), over all its protocols: ring/ll at 1 MiB.
    d = sel(MI300X, algorithm="Tree", protocol="Simple")
    assert (d["algorithm"], d["protocol"]) == ("ring", "ll")
    assert d["choice_note"] == (
        "no allowed algorithm/protocol can run all_reduce here (tree/simple: RCCL has no "
        "Tree/Simple on a single gfx94x node); ring/ll runs instead, the cost model's fallback"
    )
    # all_gather has no Tree: the backup Ring serves it.
    d = sel(MI300X, "all_gather", algorithm="Tree")
    assert (d["algorithm"], d["protocol"]) == ("ring", "simple")
    # Every allowed pair, with its reason (LL128 is off on this topology).
    assert d["choice_note"] == (
        "no allowed algorithm/protocol can run all_gather here (tree/ll: Tree runs all_reduce "
        "only; tree/ll128: LL128 is not enabled on this topology; tree/simple: Tree runs "
        "all_reduce only); ring/simple runs instead, the cost model's fallback"
    )
    d = sel(MI300X, "broadcast", 64 * MiB, algorithm="tree", protocol="simple")
    assert (d["algorithm"], d["protocol"], d["pattern"]) == ("ring", "simple", "pipeline_from")


def test_choices_the_cost_model_made_carry_no_note():
    for kw in ({}, {"algorithm": "Tree"}, {"protocol": "^LL"}, {"algorithm": "Ring"}):
        assert sel(MI300X, **kw)["choice_note"] is None
    assert sel(H100, protocol="ll128,simple")["choice_note"] is None


def test_one_rank_is_ring_simple():
    one = dict(MI300X, nRanks=1, bwIntra=0.0)
    d = sel(one, algorithm="Tree", protocol="LL")
    assert (d["algorithm"], d["protocol"], d["nchannels"]) == ("ring", "simple", 16)


def test_patterns():
    assert sel(MI300X, "broadcast")["pattern"] == "pipeline_from"
    assert sel(MI300X, "reduce")["pattern"] == "pipeline_to"
    assert sel(MI300X, "all_gather")["pattern"] == "ring"
    assert sel(MI300X, "reduce_scatter")["pattern"] == "ring"
    assert sel(MI300X, "all_reduce", 64 * MiB)["pattern"] == "ring_twice"


# ---------------------------------------------------------------------------------------------
# RCCL's topology-specific rules


def test_pivot_topology_rule():
    # pivotA2ANumBiRings == 3 and no user steering: <= 2200008 bytes -> tree/ll on
    # min(24, nChannels) channels; above -> ring/simple.
    d = sel(MI250X, nbytes=MiB)
    assert (d["algorithm"], d["protocol"], d["nchannels"]) == ("tree", "ll", 24)
    assert d["choice_note"].startswith("RCCL's all_reduce rule for the MI250X pivot topology")
    assert d["choice_note"].endswith("replaces the cost model's ring/ll")
    assert d["func_index"] == internal.dev_func_id("all_reduce", "sum", "float32", "tree", "ll")
    d = sel(MI250X, nbytes=4 * MiB)
    assert (d["algorithm"], d["protocol"], d["nchannels"]) == ("ring", "simple", 32)
    # Masks count as user input: the cost model decides (ring/ll at 1 MiB here).
    d = sel(MI250X, nbytes=MiB, protocol="^LL128")
    assert (d["algorithm"], d["protocol"], d["nchannels"]) == ("ring", "ll", 32)
    assert d["choice_note"] is None
    # So does a tuner, even one that fixes nothing.
    d = sel(MI250X, nbytes=MiB, tuner=lambda c, n, k: None)
    assert (d["algorithm"], d["protocol"]) == ("ring", "ll")
    # Other collectives are untouched.
    assert sel(MI250X, "all_gather", MiB)["algorithm"] == "ring"


def test_tree_defined_rule():
    topo = dict(MI300X, nRanks=16, nNodes=2, bwInter=12.5, treeDefined=True)
    d = sel(topo, nbytes=64 * MiB)
    assert d["algorithm"] == "tree"
    assert d["pattern"] == "tree_up_down"
    assert d["choice_note"] is None  # the cost model picked tree/simple itself
    # With LL only, the cost model picks ring/ll at 4 MiB; the topology's tree replaces it.
    d = sel(topo, nbytes=4 * MiB, protocol="LL")
    assert (d["algorithm"], d["protocol"]) == ("tree", "ll")
    assert d["choice_note"] == (
        "the topology's tree serves all_reduce (RCCL's rule for a topology file with trees), "
        "replacing the cost model's ring"
    )
    assert sel(topo, "reduce_scatter", 64 * MiB)["algorithm"] == "ring"
    # Deviation from RCCL: a mask that excludes Tree holds.
    assert sel(topo, nbytes=64 * MiB, algorithm="Ring")["algorithm"] == "ring"


# ---------------------------------------------------------------------------------------------
# The tuner


def test_tuner_fixes_algorithm_and_protocol():
    calls = []

    def tuner(coll, nbytes, ops):
        calls.append((coll, nbytes, ops))
        return ("tree", "ll", 0)

    # The tuner's choice stands even against the masks (as in RCCL).
    d = sel(MI300X, nbytes=64 * MiB, algorithm="Ring", tuner=tuner)
    assert (d["algorithm"], d["protocol"], d["user_tuned"]) == ("tree", "ll", False)
    assert calls == [("all_reduce", 64 * MiB, 1)]


def test_tuner_fixes_channels():
    d = sel(MI300X, nbytes=64 * MiB, tuner=lambda c, n, k: (None, None, 4))
    assert d["user_tuned"] is True
    assert (d["algorithm"], d["protocol"], d["nchannels"]) == ("ring", "simple", 4)
    # Channels still shrink for small sizes: 4096 < nc*256*64 down to 1.
    d = sel(MI300X, nbytes=4096, tuner=lambda c, n, k: (None, None, 4))
    assert d["user_tuned"] is True and d["nchannels"] == 1


def test_tuner_half_choice_is_ignored():
    # Only the algorithm: RCCL runs the search (which resets both).
    d = sel(MI300X, nbytes=64 * MiB, tuner=lambda c, n, k: ("tree", None, 0))
    assert (d["algorithm"], d["protocol"]) == ("ring", "simple")


@pytest.mark.parametrize(
    "coll, choice, words",
    [
        ("broadcast", ("tree", "simple", 0), ["tree", "broadcast", "allowed: ring"]),
        ("all_gather", ("tree", "ll", 0), ["tree", "all_gather"]),
        ("all_reduce", ("ring", "ll128", 0), ["ll128", "not enabled"]),
        ("all_reduce", ("ring", "simple", 1000), ["nChannels", "1000"]),
        ("all_reduce", ("ring", "simple", -1), ["nChannels"]),
        ("all_reduce", ("bogus", "simple", 0), ["algorithm", "bogus", "tree, ring"]),
        ("all_reduce", ("ring", "fast", 0), ["protocol", "fast", "ll, ll128, simple"]),
        ("all_reduce", "nonsense", ["tuner"]),
    ],
)
def test_tuner_errors(coll, choice, words):
    with pytest.raises(ValueError) as e:
        sel(MI300X, coll, tuner=lambda c, n, k: choice)
    for w in words:
        assert w in str(e.value)


def test_tuner_exception_propagates():
    def tuner(coll, nbytes, ops):
        raise RuntimeError("tuner exploded")

    with pytest.raises(ValueError, match="tuner exploded"):
        sel(MI300X, tuner=tuner)


# ---------------------------------------------------------------------------------------------
# Mask syntax


@pytest.mark.parametrize(
    "kind, spec, mask",
    [
        ("algo", "", 0b111),
        ("algo", "Ring", 0b010),
        ("algo", "Tree", 0b001),
        ("algo", "Direct", 0b100),
        ("algo", "tree,ring", 0b011),
        ("algo", "Tree,Ring", 0b011),
        ("algo", "RING", 0b010),
        ("algo", "^Tree", 0b110),
        ("algo", "^ring", 0b101),
        ("algo", "^Direct", 0b011),
        ("algo", " Ring , Tree ", 0b011),
        ("proto", "", 0b111),
        ("proto", "LL", 0b001),
        ("proto", "ll128", 0b010),
        ("proto", "Simple", 0b100),
        ("proto", "^LL128", 0b101),
        ("proto", "LL,Simple", 0b101),
        ("proto", "^ll,simple", 0b010),
        ("proto", "SIMPLE,LL128,LL", 0b111),
    ],
)
def test_parse_mask(kind, spec, mask):
    """NCCL_ALGO (kind "algo") and NCCL_PROTO ("proto") strings to masks."""
    assert getattr(internal, f"parse_{kind}_mask")(spec) == mask


def test_parse_mask_errors():
    with pytest.raises(ValueError) as e:
        internal.parse_algo_mask("CollNet")
    assert "JAX_RCCL_ALGO" in str(e.value) and "tree, ring, direct" in str(e.value)
    with pytest.raises(ValueError) as e:
        internal.parse_proto_mask("LL256", "MY_PROTO")
    assert "MY_PROTO" in str(e.value) and "ll, ll128, simple" in str(e.value)
    with pytest.raises(ValueError, match="nothing"):
        internal.parse_algo_mask("^Tree,Ring,Direct")
    with pytest.raises(ValueError) as e:
        sel(MI300X, algorithm="NVLS")
    assert "algorithm" in str(e.value) and "tree, ring" in str(e.value)


# ---------------------------------------------------------------------------------------------
# Device functions


def test_dev_func_golden_ids():
    # Generator order: all_gather (3: ring x ll/ll128/simple, sum, int8), all_reduce
    # (tree, ring) x 3 protos x (5 ops x 15 types - 6 float SumPostDiv = 69) = 414,
    # broadcast 3, reduce 3*69 = 207, reduce_scatter 207 -> 834 Tree/Ring functions; then our
    # Direct ones (Simple only): all_gather 1 + all_reduce 69 + broadcast 1 + reduce 69 +
    # reduce_scatter 69 = 209 (ids 834..1042, see test_direct.py); p2p last: 834 + 209 = 1043.
    assert internal.dev_func_id("all_gather", "sum", "int8", "ring", "ll") == 0
    assert internal.dev_func_id("all_gather", "sum", "int8", "ring", "simple") == 2
    assert internal.dev_func_id("all_reduce", "sum", "int8", "tree", "ll") == 3
    # ring (after 3*69 tree), ll, sum, float32 (type 7): 3 + 207 + 7
    assert internal.dev_func_id("all_reduce", "sum", "float32", "ring", "ll") == 217
    # ring, simple (2*69 further): 355
    assert internal.dev_func_id("all_reduce", "sum", "float32", "ring", "simple") == 355
    assert internal.dev_func_id("broadcast", "sum", "int8", "ring", "ll") == 417
    assert internal.dev_func_id("reduce", "sum", "int8", "ring", "ll") == 420
    assert internal.dev_func_id("reduce_scatter", "sum", "int8", "ring", "ll") == 627
    assert internal.dev_func_id_p2p() == 1043
    assert internal.num_dev_funcs() == 1044


@pytest.mark.parametrize(
    "combo",
    [
        ("all_gather", "sum", "int8", "tree", "ll"),  # no Tree all_gather
        ("reduce", "sum", "float32", "tree", "ll"),  # Tree only for all_reduce
        ("reduce_scatter", "minmax", "int32", "tree", "simple"),
        ("all_reduce", "sumpostdiv", "float32", "ring", "ll"),  # float avg is PreMulSum
        ("all_reduce", "sumpostdiv", "bfloat16", "tree", "simple"),
        ("send", "sum", "int8", "ring", "simple"),  # p2p has its own id
    ],
)
def test_dev_func_invalid_combos(combo):
    assert internal.dev_func_id(*combo) == -1


def test_gather_and_broadcast_ignore_op_and_type():
    # They copy bytes: RCCL's ncclDevFuncId gives one function per protocol whatever the op/type.
    for coll in ("all_gather", "broadcast"):
        for p in ("ll", "ll128", "simple"):
            want = internal.dev_func_id(coll, "sum", "int8", "ring", p)
            assert internal.dev_func_id(coll, "prod", "float32", "ring", p) == want
            assert internal.dev_func_id(coll, "sumpostdiv", "bfloat16", "ring", p) == want


def test_dev_func_ids_are_dense():
    colls = ["broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce"]
    ops = ["sum", "prod", "minmax", "premulsum", "sumpostdiv"]
    types = [
        "int8",
        "uint8",
        "int32",
        "uint32",
        "int64",
        "uint64",
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
        "int16",
        "uint16",
        "bool",
    ]
    ids = []
    for c in colls:
        for o in ops:
            for t in types:
                for a in ("tree", "ring", "direct"):
                    for p in ("ll", "ll128", "simple"):
                        i = internal.dev_func_id(c, o, t, a, p)
                        if i >= 0:
                            ids.append(i)
    assert sorted(set(ids)) == list(range(internal.num_dev_funcs() - 1))
    assert internal.dev_func_id("all_reduce", "sumpostdiv", "int16", "tree", "ll") >= 0


def test_select_reports_func_index():
    d = sel(MI300X, nbytes=64 * MiB)
    assert d["func_index"] == 355
    # all_gather of float32 runs the int8 function.
    d = sel(MI300X, "all_gather", 64 * MiB)
    assert d["func_index"] == internal.dev_func_id("all_gather", "sum", "int8", "ring", "simple")
    # A combination without a function is an error naming it.
    with pytest.raises(ValueError, match="no device function"):
        internal.select(MI300X, "all_reduce", 1024, "float32", devop="sumpostdiv")
