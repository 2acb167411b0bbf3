"""Reduction ops, bit for bit: hostToDevRedOp, the PreMulSum op table and handle mangling.

After RCCL rocm-6.2.0 src/enqueue.cc (hostToDevRedOp, ncclRedOpCreatePreMulSum, ncclRedOpDestroy)
and src/include/comm.h (ncclUserRedOpMangle).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from jax_rccl import _jax_rccl

internal = _jax_rccl.internal
RedOpTable = _jax_rccl.RedOpTable
h2d = internal.host_to_dev_red_op

INT_TYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
FLOAT_TYPES = ["float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2"]
ALL_TYPES = INT_TYPES + FLOAT_TYPES + ["bool"]
OPS = ["sum", "prod", "min", "max", "avg"]
NRANKS = [1, 2, 3, 8]

# MinMax xor masks (RCCL: signBit for signed integers, ^ allBits for max, over 8*sizeof bits).
# Floating types and bool are not in RCCL's signed list, so min -> 0 and max -> all bits.
MINMAX_MASK = {
    #             min                    max
    "int8": (0x80, 0x7F),
    "uint8": (0x00, 0xFF),
    "int16": (0x8000, 0x7FFF),
    "uint16": (0x0000, 0xFFFF),
    "int32": (0x80000000, 0x7FFFFFFF),
    "uint32": (0x00000000, 0xFFFFFFFF),
    "int64": (0x8000000000000000, 0x7FFFFFFFFFFFFFFF),
    "uint64": (0x0000000000000000, 0xFFFFFFFFFFFFFFFF),
    "float16": (0x0000, 0xFFFF),
    "bfloat16": (0x0000, 0xFFFF),
    "float32": (0x00000000, 0xFFFFFFFF),
    "float64": (0x0000000000000000, 0xFFFFFFFFFFFFFFFF),
    "float8_e4m3fn": (0x00, 0xFF),
    "float8_e5m2": (0x00, 0xFF),
    "bool": (0x00, 0xFF),
}

# avg on floating types: PreMulSum with 1/n in the element's format (RCCL: float(1.0/n) first).
#  1/1: f16 exp 15 -> 0x3c00; bf16 = top half of f32 0x3f800000; e4m3fn exp field 7 -> 0b0111_000
#       = 0x38; e5m2 exp field 15 -> 0b01111_00 = 0x3c.
#  1/2, 1/8: exponent fields one and three lower (f16 -1 -> -0x400 per step, bf16 -0x80,
#       f32 -0x800000, e4m3fn -0x08, e5m2 -0x04).
#  1/3 = 1.0101...b * 2^-2:
#       f64 0x3fd5555555555555; f32 rounds 0x...555|5 up -> 0x3eaaaaab;
#       f16: exp 13 -> 0x3400 | mantissa 0101010101|0101.. (below half) -> 0x3555;
#       bf16: f32 0x3eaaaaab, low half 0xaaab > 0x8000 -> round up -> 0x3eab;
#       e4m3fn: exp field 5, 3 bits of .0101.. = 010|101.. above half -> 011 -> 0x2b (0.34375);
#       e5m2: exp field 13, 2 bits 01|0101.. below half -> 01 -> 0x35 (0.3125).
RECIP_BITS = {
    "float16": {1: 0x3C00, 2: 0x3800, 3: 0x3555, 8: 0x3000},
    "bfloat16": {1: 0x3F80, 2: 0x3F00, 3: 0x3EAB, 8: 0x3E00},
    "float32": {1: 0x3F800000, 2: 0x3F000000, 3: 0x3EAAAAAB, 8: 0x3E000000},
    "float64": {
        1: 0x3FF0000000000000,
        2: 0x3FE0000000000000,
        3: 0x3FD5555555555555,
        8: 0x3FC0000000000000,
    },
    "float8_e4m3fn": {1: 0x38, 2: 0x30, 3: 0x2B, 8: 0x20},
    "float8_e5m2": {1: 0x3C, 2: 0x38, 3: 0x35, 8: 0x30},
}

NP_TYPES = {
    "float16": (np.float16, np.uint16),
    "bfloat16": (ml_dtypes.bfloat16, np.uint16),
    "float32": (np.float32, np.uint32),
    "float64": (np.float64, np.uint64),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, np.uint8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, np.uint8),
}


def np_bits(value: float, dtype: str) -> int:
    """The bit pattern numpy/ml_dtypes give `value`, going through float32 as RCCL does."""
    ftype, utype = NP_TYPES[dtype]
    src = np.float64 if dtype == "float64" else np.float32
    with np.errstate(over="ignore", invalid="ignore"):
        return int(np.array([value], src).astype(ftype).view(utype)[0])


def expected(op: str, dtype: str, n: int) -> dict:
    if op == "sum":
        return {"op": "sum", "scalar_arg": 0, "scalar_arg_is_ptr": False, "proxy_op": "sum"}
    if op == "prod":
        return {"op": "prod", "scalar_arg": 0, "scalar_arg_is_ptr": False, "proxy_op": "prod"}
    if op in ("min", "max"):
        mask = MINMAX_MASK[dtype][0 if op == "min" else 1]
        return {"op": "minmax", "scalar_arg": mask, "scalar_arg_is_ptr": False, "proxy_op": op}
    assert op == "avg"
    if dtype in INT_TYPES:
        return {"op": "sumpostdiv", "scalar_arg": n, "scalar_arg_is_ptr": False, "proxy_op": "avg"}
    return {
        "op": "premulsum",
        "scalar_arg": RECIP_BITS[dtype][n],
        "scalar_arg_is_ptr": False,
        "proxy_op": "avg",
    }


def py_mangle(comm_id: int, op: int) -> int:
    """ncclUserRedOpMangle with the comm id in place of the comm pointer."""
    if op < 5:
        return op
    h = comm_id
    h ^= h >> 32
    h = (h * 0x9E3779B97F4A7C13) & (2**64 - 1)
    h >>= 32
    h &= 0x7FFFFFFF
    op1 = h ^ op
    return op if op1 < 5 else op1


# --------------------------------------------------------------------------------------------
# hostToDevRedOp over the whole table


@pytest.mark.parametrize("n", NRANKS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_host_to_dev_table(dtype, op, n):
    if op == "avg" and dtype == "bool":
        with pytest.raises(ValueError, match="avg.*bool"):
            h2d(op, dtype, n)
        return
    assert h2d(op, dtype, n) == expected(op, dtype, n)


@pytest.mark.parametrize("dtype", ALL_TYPES)
def test_op_given_as_int_matches_name(dtype):
    for value, name in enumerate(["sum", "prod", "max", "min"]):
        assert h2d(value, dtype, 4) == h2d(name, dtype, 4)


@pytest.mark.parametrize("n", NRANKS)
@pytest.mark.parametrize("dtype", FLOAT_TYPES)
def test_recip_bits_match_numpy(dtype, n):
    assert RECIP_BITS[dtype][n] == np_bits(1.0 / n, dtype)
    # and the pattern reads back as the rounded reciprocal
    ftype, utype = NP_TYPES[dtype]
    back = internal.float_from_bits(RECIP_BITS[dtype][n], dtype)
    assert back == float(np.array([RECIP_BITS[dtype][n]], utype).view(ftype)[0])


def test_recip_bits_spot_checks():
    assert np.float16(1 / 3).view(np.uint16) == 0x3555
    assert np.array([1 / 3], np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)[0] == 0x3EAB
    assert np.array([1 / 3], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0] == 0x2B
    assert np.array([1 / 3], np.float32).astype(ml_dtypes.float8_e5m2).view(np.uint8)[0] == 0x35


@pytest.mark.parametrize("dtype", INT_TYPES)
def test_avg_integer_divides_by_nranks(dtype):
    for n in (1, 5, 1000, 2**31 - 1):
        assert h2d("avg", dtype, n)["scalar_arg"] == n


def test_avg_float_other_rank_counts_match_numpy():
    for n in range(1, 300):
        for dtype in FLOAT_TYPES:
            got = h2d("avg", dtype, n)
            assert got["op"] == "premulsum"
            assert got["scalar_arg"] == np_bits(1.0 / n, dtype), (dtype, n)


# --------------------------------------------------------------------------------------------
# float_bits / float_from_bits


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_float_from_bits_every_pattern(dtype):
    ftype, utype = NP_TYPES[dtype]
    nbits = 8 * np.dtype(utype).itemsize
    patterns = np.arange(2**nbits, dtype=np.uint64).astype(utype)
    with np.errstate(invalid="ignore"):
        ref = patterns.view(ftype).astype(np.float64)
    for bits, want in zip(patterns.tolist(), ref.tolist(), strict=True):
        got = internal.float_from_bits(bits, dtype)
        if math.isnan(want):
            assert math.isnan(got), (dtype, hex(bits))
        else:
            assert got == want and math.copysign(1, got) == math.copysign(1, want), (
                dtype,
                hex(bits),
            )


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_float_bits_match_ml_dtypes(dtype):
    rng = np.random.default_rng(1234)
    # random float32 bit patterns (all magnitudes) plus values near the formats' edges
    raw = rng.integers(0, 2**32, size=20000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array(
        [
            0.0,
            -0.0,
            1.0,
            -1.0,
            448,
            460,
            464,
            465,
            480,
            57344,
            61440,
            61439,
            65504,
            65519,
            65520,
            2.0**-9,
            2.0**-10,
            2.0**-10 * 1.5,
            2.0**-16,
            2.0**-17,
            2.0**-24,
            2.0**-25,
            2.0**-25 * 1.5,
            2.0**-133,
            3.0e38,
            np.inf,
            -np.inf,
        ],
        np.float32,
    )
    for v in np.concatenate([raw, edges, -edges]).tolist():
        if math.isnan(v):
            continue
        assert internal.float_bits(v, dtype) == np_bits(v, dtype), (dtype, v)


def test_float_bits_nan():
    # quiet NaNs keeping the sign: e4m3fn has one NaN per sign (S.1111.111)
    assert internal.float_bits(math.nan, "float8_e4m3fn") == 0x7F
    assert internal.float_bits(-math.nan, "float8_e4m3fn") == 0xFF
    assert internal.float_bits(math.nan, "float8_e5m2") == 0x7E
    assert internal.float_bits(math.nan, "float16") == 0x7E00
    assert internal.float_bits(-math.nan, "float16") == 0xFE00
    assert internal.float_bits(math.nan, "bfloat16") == 0x7FC0
    for dtype in FLOAT_TYPES:
        assert math.isnan(internal.float_from_bits(internal.float_bits(math.nan, dtype), dtype))


def test_float_bits_overflow_documented():
    # e4m3fn has no infinity: past 464 (the tie between 448 and the NaN code) -> NaN.
    assert internal.float_bits(464.0, "float8_e4m3fn") == 0x7E
    assert internal.float_bits(465.0, "float8_e4m3fn") == 0x7F
    assert internal.float_bits(math.inf, "float8_e4m3fn") == 0x7F
    # e5m2 is IEEE-like: from 61440 (tie between 57344 and 65536) on -> inf.
    assert internal.float_bits(61439.0, "float8_e5m2") == 0x7B
    assert internal.float_bits(61440.0, "float8_e5m2") == 0x7C
    assert internal.float_bits(-1e9, "float8_e5m2") == 0xFC
    assert internal.float_bits(65520.0, "float16") == 0x7C00


def test_float_bits_wide_types():
    assert internal.float_bits(1 / 3, "float64") == 0x3FD5555555555555
    assert internal.float_bits(1 / 3, "float32") == 0x3EAAAAAB
    assert internal.float_from_bits(0x3FD5555555555555, "float64") == 1 / 3
    assert internal.float_from_bits(0x3EAAAAAB, "float32") == float(np.float32(1 / 3))


def test_float_bits_integer_types():
    assert internal.float_bits(3.9, "int32") == 3
    assert internal.float_bits(-1, "int8") == 0xFF
    assert internal.float_bits(-2, "int64") == 0xFFFFFFFFFFFFFFFE
    assert internal.float_bits(-3.7, "int16") == 0xFFFD
    assert internal.float_bits(2.0**63, "uint64") == 2**63
    assert internal.float_bits(7, "bool") == 1
    assert internal.float_bits(0, "bool") == 0
    assert internal.float_from_bits(0xFF, "int8") == -1
    assert internal.float_from_bits(0xFF, "uint8") == 255
    assert internal.float_from_bits(0x8000, "int16") == -32768
    assert internal.float_from_bits(0xFFFFFFFFFFFFFFFF, "int64") == -1
    assert internal.float_from_bits(2, "bool") == 1


# --------------------------------------------------------------------------------------------
# The op table: free list, handles


def test_free_list_grows_by_doubling_from_four():
    t = RedOpTable(comm_id=0)
    assert (t.capacity, t.free_head, t.live_count) == (0, 0, 0)
    handles = []
    for i in range(4):
        handles.append(t.create_premul(0.5, "float32"))
        assert (t.capacity, t.free_head, t.live_count) == (4, i + 1, i + 1)
    handles.append(t.create_premul(0.5, "float32"))
    assert (t.capacity, t.free_head, t.live_count) == (8, 5, 5)
    # comm_id 0 hashes to 0: handles are the plain 5 + index
    assert handles == [5, 6, 7, 8, 9]
    for _ in range(5, 8):
        t.create_premul(1.0, "float64")
    assert (t.capacity, t.free_head) == (8, 8)
    t.create_premul(1.0, "float64")
    assert (t.capacity, t.free_head, t.live_count) == (16, 9, 9)


def test_destroy_pushes_and_create_reuses_lifo():
    t = RedOpTable(comm_id=0xABCDEF0123)
    hs = [t.create_premul(float(i), "float32") for i in range(5)]
    assert [t.lookup(h)["index"] for h in hs] == [0, 1, 2, 3, 4]
    t.destroy(hs[2])
    assert (t.free_head, t.live_count) == (2, 4)
    again = t.create_premul(9.0, "float16")
    assert again == hs[2]  # same slot, same mangled handle
    assert t.lookup(again)["dtype"] == "float16"
    assert t.lookup(again)["scalar_arg"] == 0x4880  # 9.0 in float16: exp 18, mantissa 0x080
    assert t.free_head == 5
    t.destroy(hs[1])
    t.destroy(hs[3])
    assert t.free_head == 3
    assert t.lookup(t.create_premul(1.0, "float32"))["index"] == 3
    assert t.lookup(t.create_premul(1.0, "float32"))["index"] == 1
    assert t.free_head == 5
    assert t.capacity == 8


@pytest.mark.parametrize("comm_id", [0, 1, 0x1234, 0xDEADBEEF, 0x7F00_1234_5678_9ABC, 2**64 - 1])
def test_mangle_formula(comm_id):
    t = RedOpTable(comm_id=comm_id)
    assert t.comm_id == comm_id
    for op in list(range(0, 40)) + [2**31 - 1, 2**30, 123456789]:
        assert t.mangle(op) == py_mangle(comm_id, op)
        assert t.mangle(t.mangle(op)) == op  # its own inverse
    for op in range(5):
        assert t.mangle(op) == op  # built-ins pass through
    hs = [t.create_premul(1.0, "float32") for _ in range(6)]
    assert hs == [py_mangle(comm_id, 5 + i) for i in range(6)]
    assert all(5 <= h <= 2**31 - 1 for h in hs)


def test_mangle_golden():
    # comm_id 0x1234: h = 0x1234 ^ (0x1234 >> 32) = 0x1234;
    # h * 0x9e3779b97f4a7c13 mod 2^64 = 0x09d3c4a117da89dc; >> 32 -> 0x09d3c4a1;
    # & 0x7fffffff -> 0x09d3c4a1; index 0 is op 5: 0x09d3c4a1 ^ 5 = 0x09d3c4a4 = 164873380.
    t = RedOpTable(comm_id=0x1234)
    assert t.create_premul(1.0, "float32") == 164873380
    assert py_mangle(0x1234, 5) == 164873380


def test_handles_distinct_across_comm_ids():
    a, b = RedOpTable(comm_id=1), RedOpTable(comm_id=2)
    ha = [a.create_premul(1.0, "float32") for _ in range(5)]
    hb = [b.create_premul(1.0, "float32") for _ in range(5)]
    assert len(set(ha)) == 5 and len(set(hb)) == 5
    assert not set(ha) & set(hb)
    # a handle of one table is unknown to the other
    with pytest.raises(ValueError, match="unknown to this RedOpTable"):
        b.lookup(ha[0])
    with pytest.raises(ValueError, match="unknown to this RedOpTable"):
        b.destroy(ha[0])
    with pytest.raises(ValueError, match="unknown"):
        h2d(ha[0], "float32", 2, b)


def test_builtin_values_unmangled_in_h2d_with_table():
    t = RedOpTable(comm_id=0x55AA)
    for name in OPS:
        assert h2d(name, "float32", 4, t) == h2d(name, "float32", 4)


# --------------------------------------------------------------------------------------------
# User ops through hostToDevRedOp


def test_user_op_host_immediate():
    t = RedOpTable(comm_id=77)
    cases = [
        (0.5, "float16", 0x3800),
        (0.5, "bfloat16", 0x3F00),
        (1 / 3, "float32", 0x3EAAAAAB),
        (1 / 3, "float64", 0x3FD5555555555555),
        (0.5, "float8_e4m3fn", 0x30),
        (0.5, "float8_e5m2", 0x38),
        (-3, "int8", 0xFD),
        (-3, "int16", 0xFFFD),
        (255, "uint8", 0xFF),
        (2**62, "int64", 2**62),
        (-1, "int64", 2**64 - 1),
        (2**64 - 1, "uint64", 2**64 - 1),
        (4.0, "int32", 4),
        (7, "float32", 0x40E00000),
    ]
    for scalar, dtype, bits in cases:
        h = t.create_premul(scalar, dtype)
        for n in (1, 8):
            got = h2d(h, dtype, n, t)
            assert got == {
                "op": "premulsum",
                "scalar_arg": bits,
                "scalar_arg_is_ptr": False,
                "proxy_op": "user",
            }, (scalar, dtype)
        info = t.lookup(h)
        assert (info["dtype"], info["scalar_arg"], info["scalar_arg_is_ptr"]) == (
            dtype,
            bits,
            False,
        )


def test_user_op_device_residence():
    t = RedOpTable(comm_id=3)
    for addr in (0x7F12_3456_7890, 0xDEAD_BEEF_00, 2**64 - 8):
        h = t.create_premul(addr, "float32", "device")
        got = h2d(h, "float32", 8, t)
        assert got["op"] == "premulsum"
        assert got["scalar_arg_is_ptr"] is True
        assert got["scalar_arg"] == addr
        assert t.lookup(h)["scalar_arg"] == addr


# --------------------------------------------------------------------------------------------
# Errors


def test_destroy_builtin():
    t = RedOpTable()
    for op, name in enumerate(["sum", "prod", "max", "min", "avg"]):
        with pytest.raises(ValueError, match=f"op {op} \\({name}\\) is a built-in op"):
            t.destroy(op)
    with pytest.raises(ValueError, match="built-in"):
        t.destroy("sum")
    with pytest.raises(ValueError, match="built-in"):
        t.lookup(2)


def test_destroy_garbage():
    t = RedOpTable()
    for op in (-1, -(2**31), 2**31, 2**40):
        with pytest.raises(ValueError, match=f"op:? {op} is garbage"):
            t.destroy(op)
    with pytest.raises(ValueError, match="garbage"):
        t.lookup(-5)


def test_destroy_unknown_and_double():
    t = RedOpTable(comm_id=0)
    with pytest.raises(ValueError, match="op 5 is unknown to this RedOpTable"):
        t.destroy(5)  # never made (capacity 0)
    h = t.create_premul(1.0, "float32")
    with pytest.raises(ValueError, match="op 6 is unknown"):
        t.destroy(6)  # within capacity, never made
    with pytest.raises(ValueError, match="op 1000 is unknown"):
        t.destroy(1000)  # beyond capacity
    t.destroy(h)
    with pytest.raises(ValueError, match=f"op {h} is unknown.*destroyed already"):
        t.destroy(h)  # double destroy
    with pytest.raises(ValueError, match="unknown"):
        t.lookup(h)
    with pytest.raises(ValueError, match="unknown"):
        h2d(h, "float32", 2, t)
    assert (t.live_count, t.free_head, t.capacity) == (0, 0, 4)


def test_dtype_mismatch():
    t = RedOpTable(comm_id=9)
    h = t.create_premul(0.5, "float32")
    with pytest.raises(
        ValueError,
        match="data type supplied to a user op does not match.*float32.*float16",
    ):
        h2d(h, "float16", 2, t)


def test_user_op_without_table():
    with pytest.raises(ValueError, match="no RedOpTable"):
        h2d(5, "float32", 2)


def test_avg_on_bool():
    for n in NRANKS:
        with pytest.raises(ValueError, match="avg is not defined for dtype bool"):
            h2d("avg", "bool", n)


def test_unknown_op_string():
    with pytest.raises(ValueError, match="op") as e:
        h2d("median", "float32", 2)
    msg = str(e.value)
    assert msg.startswith("op: unknown value 'median'")
    for name in OPS:
        assert name in msg


def test_unknown_op_value_garbage():
    with pytest.raises(ValueError, match="garbage"):
        h2d(-1, "float32", 2)
    with pytest.raises(ValueError, match="garbage"):
        h2d(2**31, "float32", 2)


def test_bad_dtype_and_nranks():
    with pytest.raises(ValueError, match="dtype"):
        h2d("sum", "complex64", 2)
    with pytest.raises(ValueError, match="nranks"):
        h2d("avg", "float32", 0)


def test_create_premul_errors():
    t = RedOpTable()
    with pytest.raises(ValueError, match="dtype bool"):
        t.create_premul(1, "bool")
    with pytest.raises(ValueError, match="residence.*host, device"):
        t.create_premul(1.0, "float32", "managed")
    with pytest.raises(ValueError, match="scalar is null"):
        t.create_premul(0, "float32", "device")
    with pytest.raises(ValueError, match="device address"):
        t.create_premul(1.5, "float32", "device")
    with pytest.raises(ValueError, match="out of range for dtype int8"):
        t.create_premul(300, "int8")
    with pytest.raises(ValueError, match="out of range for dtype uint32"):
        t.create_premul(-1, "uint32")
    with pytest.raises(ValueError, match="not an integer"):
        t.create_premul(0.5, "int32")
    with pytest.raises(TypeError):
        t.create_premul("x", "float32")
    # nothing was allocated by the failures
    assert (t.capacity, t.live_count) == (0, 0)
