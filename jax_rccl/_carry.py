"""How leaves of the small dtypes travel through the runtime, so results are jax.lax's bits.

XLA's CPU backend (jax.lax on CPU) reduces the small floats and integers in a wider type: its
float normalization widens an all-reduce or reduce-scatter of an 8- or 4-bit float to float16
(float8_e8m0fnu, whose range float16 lacks, to float32), reduces in rank order and rounds back;
a 4- or 2-bit integer goes through 8 bits and is truncated back (sums wrap). The runtime does
the same:

- float8_e4m3fn and float8_e5m2 travel natively (one byte an element on the wire); the runtime's
  reductions step in float16 for them (ffi/compute/reduce_functors.h), as XLA does. XLA moves
  float8_e5m2 through float16, rewriting its NaNs to 0x7f: data movement does the same.
- The other small floats (float8_e4m3fnuz, float8_e5m2fnuz, float8_e4m3b11fnuz, float8_e3m4,
  float8_e4m3, float4_e2m1fn, float8_e8m0fnu, whatever the installed ml_dtypes has): reductions
  widen them to float16 (float32 where float16 cannot hold every value) and round the result
  back; data movement carries their bytes as uint8 (float4_e2m1fn as float8_e4m3fn, which holds
  every float4 value exactly), NaNs first rewritten as XLA's round trip through the wider type
  rewrites them (the type's NaN of the same sign).
- Sub-byte integers (int4, uint4, int2, uint2) widen to int8 / uint8 and are truncated back.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from jax import lax

#: 8-bit floats the runtime reduces and moves itself (DataType kFp8E4M3 / kFp8E5M2).
NATIVE_FLOATS = frozenset(np.dtype(d) for d in (ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2))

_HALF = np.dtype(np.float16)


def _is_small_float(dt: np.dtype) -> bool:
    return jnp.issubdtype(dt, jnp.floating) and dt.itemsize == 1 and dt not in NATIVE_FLOATS


def _is_sub_byte_int(dt: np.dtype) -> bool:
    return jnp.issubdtype(dt, jnp.integer) and ml_dtypes.iinfo(dt).bits < 8


def _float_carrier(dt: np.dtype) -> np.dtype:
    """float16 when it holds every value of `dt` exactly, else float32 (as XLA widens)."""
    fi, half = ml_dtypes.finfo(dt), np.finfo(np.float16)
    fits = (
        fi.nmant <= half.nmant
        and float(fi.max) <= float(half.max)
        and float(fi.smallest_subnormal) >= float(half.smallest_subnormal)
    )
    return _HALF if fits else np.dtype(np.float32)


def carried_names() -> list[str]:
    """The dtypes this module converts, by name (for error messages and docs)."""
    names = [
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e4m3b11fnuz",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e8m0fnu",
        "float4_e2m1fn",
        "int4",
        "uint4",
        "int2",
        "uint2",
    ]
    return [n for n in names if hasattr(ml_dtypes, n)]


def encode(x, use: str) -> tuple[list, Callable] | None:
    """(leaves, decode) for a leaf of a carried dtype, None for any other. `use`: sum, avg,
    prod, max, min (reductions) or move (data movement)."""
    dt = np.dtype(x.dtype)
    if dt in NATIVE_FLOATS:
        if use != "move" or dt != np.dtype(ml_dtypes.float8_e5m2):
            return None
        # XLA moves float8_e5m2 through float16 too: NaNs come back as its NaN, 0x7f
        return [_canonical_nan_bytes(x, dt)], lambda ys: lax.bitcast_convert_type(ys[0], dt)
    if _is_sub_byte_int(dt):
        wide = np.int8 if jnp.issubdtype(dt, jnp.signedinteger) else np.uint8
        return [x.astype(wide)], lambda ys: ys[0].astype(dt)
    if not _is_small_float(dt):
        return None
    if use != "move":
        return [x.astype(_float_carrier(dt))], lambda ys: ys[0].astype(dt)
    if ml_dtypes.finfo(dt).bits == 8:
        return [_canonical_nan_bytes(x, dt)], lambda ys: lax.bitcast_convert_type(ys[0], dt)
    # 4-bit floats: every value (and -0) is exact in float8_e4m3fn, one byte an element.
    e4m3 = np.dtype(ml_dtypes.float8_e4m3fn)
    return [x.astype(e4m3)], lambda ys: ys[0].astype(dt)


def _canonical_nan_bytes(x, dt: np.dtype):
    """x's bytes with every NaN replaced by the type's NaN of the same sign: XLA moves these
    types through a wider float, and its conversion back writes that NaN."""
    b = lax.bitcast_convert_type(x, np.uint8)
    nans = np.array([np.nan, -np.nan], np.float16).astype(dt).view(np.uint8)
    if dt == np.dtype(ml_dtypes.float8_e5m2):
        nans = np.array([0x7F, 0x7F], np.uint8)  # XLA's conversion from float16 drops the sign
    negative = (b & np.uint8(0x80)) != 0
    canonical = jnp.where(negative, nans[1], nans[0])
    return jnp.where(jnp.isnan(x), canonical, b)
