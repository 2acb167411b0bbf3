// SHA-256 and HMAC-SHA-256, a constant-time comparison and the kernel's random bytes: what the
// socket transport needs to authenticate its peers (a challenge-response over a per-session
// secret).
//
// Two implementations compute the same digests: libcrypto's (OpenSSL 3, when the build finds it;
// JAX_RCCL_OPENSSL=OFF leaves it out) and a builtin one written from FIPS 180-4 (SHA-256) and
// RFC 2104 (HMAC). CryptoBackend::kDefault is libcrypto when linked, else the builtin one.
//
// The digest functions do not fail for kDefault and kBuiltin. kOpenSsl in a build without
// libcrypto is a caller's error: check the backend first (CryptoBackendAvailable, or take it from
// ParseCryptoBackend); the digest functions abort the process with a message rather than return a
// digest they did not compute. So does a failure inside libcrypto (it allocates).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ffi/core/status.h"

namespace jax_rccl::comm {

constexpr size_t kDigestBytes = 32;
using Digest = std::array<uint8_t, kDigestBytes>;

enum class CryptoBackend { kDefault, kBuiltin, kOpenSsl };  // kDefault: OpenSSL when built with it

// Whether this build links libcrypto.
bool HaveOpenSsl();
// "builtin" or "openssl"; kDefault names the backend it resolves to.
const char* CryptoBackendName(CryptoBackend b);
// Ok, or an invalid-argument error when `b` is kOpenSsl and this build has no libcrypto.
Status CryptoBackendAvailable(CryptoBackend b);
// "default", "builtin" or "openssl" (when linked) -> the backend; otherwise an invalid-argument
// error naming `backend` and the values this build accepts.
StatusOr<CryptoBackend> ParseCryptoBackend(std::string_view name);

// SHA-256 of n bytes (FIPS 180-4).
Digest Sha256(const void* data, size_t n, CryptoBackend b = CryptoBackend::kDefault);
// HMAC-SHA-256 of n bytes of `msg` under a key of any length (RFC 2104; keys longer than the
// 64-byte block are hashed first).
Digest HmacSha256(const void* key, size_t keyBytes, const void* msg, size_t n,
                  CryptoBackend b = CryptoBackend::kDefault);

// Constant-time comparison (time independent of where the bytes differ).
bool ConstantTimeEqual(const void* a, const void* b, size_t n);

// Fills `out` with n bytes from the kernel's CSPRNG (getrandom(2), falling back to /dev/urandom);
// an error Status naming the system call on failure.
Status RandomBytes(void* out, size_t n);

}  // namespace jax_rccl::comm
