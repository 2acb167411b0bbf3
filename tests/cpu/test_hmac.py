"""SHA-256 and HMAC-SHA-256 of the socket transport's handshake (ffi/comm/hmac.*).

Every backend of the build (the builtin implementation; libcrypto's when linked) against the
published vectors: RFC 4231 for HMAC-SHA-256, FIPS 180-4's examples (NIST) for SHA-256; the
builtin one against Python's hashlib/hmac on random keys and messages across the padding and
block boundaries. Also the constant-time comparison and the kernel's random bytes.
"""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jax_rccl import _jax_rccl

AVAILABLE = _jax_rccl.crypto_backends()


def _backend(name):
    marks = ()
    if name not in AVAILABLE:
        marks = pytest.mark.skip(reason=f"this build does not link libcrypto (no '{name}' backend)")
    return pytest.param(name, marks=marks, id=name)


BACKENDS = [_backend("builtin"), _backend("openssl")]

# RFC 4231 section 4: (key, data, HMAC-SHA-256 as published; case 5 lists the first 128 bits).
RFC4231 = {
    1: (
        b"\x0b" * 20,
        b"Hi There",
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
    ),
    2: (
        b"Jefe",
        b"what do ya want for nothing?",
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
    ),
    3: (
        b"\xaa" * 20,
        b"\xdd" * 50,
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
    ),
    4: (
        bytes(range(0x01, 0x1A)),
        b"\xcd" * 50,
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
    ),
    5: (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    6: (
        b"\xaa" * 131,
        b"Test Using Larger Than Block-Size Key - Hash Key First",
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
    ),
    7: (
        b"\xaa" * 131,
        b"This is a test using a larger than block-size key and a larger than block-size data. "
        b"The key needs to be hashed before being used by the HMAC algorithm.",
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
    ),
}

# FIPS 180-4's SHA-256 examples (NIST's "Examples with intermediate values").
NIST = {
    "abc": (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    "448-bit": (
        b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
    ),
    "empty": (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    "million-a": (
        b"a" * 1_000_000,
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
    ),
}


def test_backends_listed():
    assert AVAILABLE[0] == "builtin"
    assert set(AVAILABLE) <= {"builtin", "openssl"}
    assert len(set(AVAILABLE)) == len(AVAILABLE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(RFC4231))
def test_rfc4231(case, backend):
    key, data, want = RFC4231[case]
    got = _jax_rccl.hmac_sha256(key, data, backend)
    assert len(got) == 32
    # Case 5 publishes the tag truncated to 128 bits; the others the whole 256.
    assert got.hex()[: len(want)] == want


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(NIST))
def test_nist_sha256(name, backend):
    data, want = NIST[name]
    assert _jax_rccl.sha256(data, backend).hex() == want


def test_default_is_the_last_available():
    data = b"the default backend"
    key = b"k" * 70
    resolved = AVAILABLE[-1]
    assert _jax_rccl.sha256(data) == _jax_rccl.sha256(data, resolved)
    assert _jax_rccl.sha256(data, "default") == _jax_rccl.sha256(data, resolved)
    assert _jax_rccl.hmac_sha256(key, data) == _jax_rccl.hmac_sha256(key, data, resolved)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_length_across_the_padding_boundaries(backend):
    # Lengths 0..200 cover 55/56 (the length field's fit), 63/64/65 (a block) and two blocks.
    base = bytes(range(256))
    for n in range(201):
        msg = base[:n]
        assert _jax_rccl.sha256(msg, backend) == hashlib.sha256(msg).digest(), n
    for k in (0, 1, 31, 32, 55, 56, 63, 64, 65, 127, 128, 129, 200):
        key = base[255 - k : 255]
        for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 300):
            msg = bytes((7 * i + 3) % 256 for i in range(n))
            want = hmac.new(key, msg, hashlib.sha256).digest()
            assert _jax_rccl.hmac_sha256(key, msg, backend) == want, (k, n)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.binary(min_size=0, max_size=200), msg=st.binary(min_size=0, max_size=300))
def test_builtin_matches_hashlib(key, msg):
    assert _jax_rccl.sha256(msg, "builtin") == hashlib.sha256(msg).digest()
    want = hmac.new(key, msg, hashlib.sha256).digest()
    assert _jax_rccl.hmac_sha256(key, msg, "builtin") == want
    for other in AVAILABLE[1:]:
        assert _jax_rccl.hmac_sha256(key, msg, other) == want


@pytest.mark.parametrize("bad", ["", "Builtin", "OPENSSL", "sha256", "libcrypto", "default "])
def test_bad_backend_is_a_value_error(bad):
    allowed = "'default', 'builtin' or 'openssl'" if "openssl" in AVAILABLE else "'default' or"
    with pytest.raises(ValueError, match="backend must be") as e:
        _jax_rccl.sha256(b"abc", bad)
    assert allowed in str(e.value)
    with pytest.raises(ValueError, match="backend must be"):
        _jax_rccl.hmac_sha256(b"key", b"abc", backend=bad)


@pytest.mark.skipif("openssl" in AVAILABLE, reason="this build links libcrypto")
def test_openssl_without_libcrypto_is_a_value_error():
    for call in (
        lambda: _jax_rccl.sha256(b"abc", "openssl"),
        lambda: _jax_rccl.hmac_sha256(b"k", b"abc", "openssl"),
    ):
        with pytest.raises(ValueError, match="backend 'openssl' is not available") as e:
            call()
        assert "'default' or 'builtin'" in str(e.value)


def test_constant_time_equal():
    eq = _jax_rccl.constant_time_equal
    assert eq(b"", b"")
    digest = _jax_rccl.sha256(b"abc")
    assert eq(digest, bytes(digest))
    for i in range(len(digest)):
        for bit in (0x01, 0x80):
            other = bytearray(digest)
            other[i] ^= bit
            assert not eq(digest, bytes(other)), (i, bit)
    assert not eq(digest, digest[:-1])
    assert not eq(b"", b"\x00")


def test_random_bytes():
    assert _jax_rccl.random_bytes(0) == b""
    # Past 256 bytes getrandom(2) may return short reads; all of them are filled.
    a, b = _jax_rccl.random_bytes(4096), _jax_rccl.random_bytes(4096)
    assert len(a) == len(b) == 4096
    assert a != b
    assert len(set(a)) > 200  # 4 KiB of uniform bytes hit nearly every value
    with pytest.raises(ValueError, match="n must be >= 0"):
        _jax_rccl.random_bytes(-1)
