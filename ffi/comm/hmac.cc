#include "ffi/comm/hmac.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#ifdef JAX_RCCL_WITH_OPENSSL
#include <openssl/evp.h>
#include <openssl/hmac.h>
#endif

namespace jax_rccl::comm {

namespace {

[[noreturn]] void Fatal(const char* what) {
  std::fprintf(stderr, "jax_rccl: fatal: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

// Overwrites key material; the volatile stores are not optimized away.
void Wipe(void* p, size_t n) {
  volatile uint8_t* b = static_cast<volatile uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = 0;
}

CryptoBackend Resolve(CryptoBackend b) {
  if (b != CryptoBackend::kDefault) return b;
  return HaveOpenSsl() ? CryptoBackend::kOpenSsl : CryptoBackend::kBuiltin;
}

// ---- The builtin SHA-256, FIPS 180-4 section 6.2 ----

constexpr size_t kBlockBytes = 64;

// Section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64
// primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

// Section 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8
// primes.
constexpr uint32_t kInitial[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

inline uint32_t Rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}
// Section 4.1.2.
inline uint32_t Choose(uint32_t x, uint32_t y, uint32_t z) {
  return (x & y) ^ (~x & z);
}
inline uint32_t Majority(uint32_t x, uint32_t y, uint32_t z) {
  return (x & y) ^ (x & z) ^ (y & z);
}
inline uint32_t BigSigma0(uint32_t x) {
  return Rotr(x, 2) ^ Rotr(x, 13) ^ Rotr(x, 22);
}
inline uint32_t BigSigma1(uint32_t x) {
  return Rotr(x, 6) ^ Rotr(x, 11) ^ Rotr(x, 25);
}
inline uint32_t SmallSigma0(uint32_t x) {
  return Rotr(x, 7) ^ Rotr(x, 18) ^ (x >> 3);
}
inline uint32_t SmallSigma1(uint32_t x) {
  return Rotr(x, 17) ^ Rotr(x, 19) ^ (x >> 10);
}

inline uint32_t LoadBigEndian(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline void StoreBigEndian(uint32_t v, uint8_t* p) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}

// A running hash: Add the message in pieces of any size, then Finish once.
class Sha256Builtin {
 public:
  Sha256Builtin() { std::memcpy(state_, kInitial, sizeof(state_)); }
  ~Sha256Builtin() {
    Wipe(state_, sizeof(state_));
    Wipe(pending_, sizeof(pending_));
  }
  Sha256Builtin(const Sha256Builtin&) = delete;
  Sha256Builtin& operator=(const Sha256Builtin&) = delete;

  void Add(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (pendingBytes_ > 0) {  // complete the partial block first
      const size_t take = n < kBlockBytes - pendingBytes_ ? n : kBlockBytes - pendingBytes_;
      std::memcpy(pending_ + pendingBytes_, p, take);
      pendingBytes_ += take;
      p += take;
      n -= take;
      if (pendingBytes_ < kBlockBytes) return;
      Compress(pending_);
      pendingBytes_ = 0;
    }
    for (; n >= kBlockBytes; p += kBlockBytes, n -= kBlockBytes) Compress(p);
    if (n > 0) {
      std::memcpy(pending_, p, n);
      pendingBytes_ = n;
    }
  }

  // Section 5.1.1: a 1 bit, zeros up to 56 bytes mod 64, the message length in bits (64-bit big
  // endian).
  Digest Finish() {
    const uint64_t bits = total_ * 8;
    pending_[pendingBytes_++] = 0x80;
    if (pendingBytes_ > kBlockBytes - 8) {  // no room for the length: one more block
      std::memset(pending_ + pendingBytes_, 0, kBlockBytes - pendingBytes_);
      Compress(pending_);
      pendingBytes_ = 0;
    }
    std::memset(pending_ + pendingBytes_, 0, kBlockBytes - 8 - pendingBytes_);
    StoreBigEndian(static_cast<uint32_t>(bits >> 32), pending_ + kBlockBytes - 8);
    StoreBigEndian(static_cast<uint32_t>(bits), pending_ + kBlockBytes - 4);
    Compress(pending_);
    pendingBytes_ = 0;
    Digest out;
    for (int i = 0; i < 8; ++i) StoreBigEndian(state_[i], out.data() + 4 * i);
    return out;
  }

 private:
  // Section 6.2.2: one 512-bit block into the state.
  void Compress(const uint8_t* block) {
    uint32_t w[64];
    for (int t = 0; t < 16; ++t) w[t] = LoadBigEndian(block + 4 * t);
    for (int t = 16; t < 64; ++t) {
      w[t] = SmallSigma1(w[t - 2]) + w[t - 7] + SmallSigma0(w[t - 15]) + w[t - 16];
    }
    uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t t1 = h + BigSigma1(e) + Choose(e, f, g) + kRound[t] + w[t];
      const uint32_t t2 = BigSigma0(a) + Majority(a, b, c);
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
    Wipe(w, sizeof(w));
  }

  uint32_t state_[8];
  uint8_t pending_[kBlockBytes];  // the message's bytes past the last whole block
  size_t pendingBytes_ = 0;
  uint64_t total_ = 0;  // message bytes added
};

Digest BuiltinSha256(const void* data, size_t n) {
  Sha256Builtin h;
  h.Add(data, n);
  return h.Finish();
}

// RFC 2104 section 2: H((K ^ opad) || H((K ^ ipad) || msg)), K the key padded with zeros to the
// block size (a key longer than a block is replaced by its hash first).
Digest BuiltinHmacSha256(const void* key, size_t keyBytes, const void* msg, size_t n) {
  uint8_t k[kBlockBytes] = {};
  if (keyBytes > kBlockBytes) {
    Digest hashed = BuiltinSha256(key, keyBytes);
    std::memcpy(k, hashed.data(), hashed.size());
    Wipe(hashed.data(), hashed.size());
  } else if (keyBytes > 0) {
    std::memcpy(k, key, keyBytes);
  }
  uint8_t pad[kBlockBytes];
  for (size_t i = 0; i < kBlockBytes; ++i) pad[i] = k[i] ^ 0x36;
  Sha256Builtin inner;
  inner.Add(pad, kBlockBytes);
  inner.Add(msg, n);
  Digest innerHash = inner.Finish();
  for (size_t i = 0; i < kBlockBytes; ++i) pad[i] = k[i] ^ 0x5c;
  Sha256Builtin outer;
  outer.Add(pad, kBlockBytes);
  outer.Add(innerHash.data(), innerHash.size());
  Wipe(k, sizeof(k));
  Wipe(pad, sizeof(pad));
  Wipe(innerHash.data(), innerHash.size());
  return outer.Finish();
}

// ---- libcrypto ----

#ifdef JAX_RCCL_WITH_OPENSSL
// libcrypto is given a valid pointer even for empty inputs.
const uint8_t kNothing = 0;

Digest OpenSslSha256(const void* data, size_t n) {
  Digest out;
  unsigned int len = 0;
  if (EVP_Digest(n > 0 ? data : &kNothing, n, out.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != kDigestBytes) {
    Fatal("libcrypto's EVP_Digest(SHA-256) failed");
  }
  return out;
}

Digest OpenSslHmacSha256(const void* key, size_t keyBytes, const void* msg, size_t n) {
  // HMAC() takes an int key length; a longer key is equivalent to its hash (RFC 2104).
  Digest hashedKey{};
  if (keyBytes > static_cast<size_t>(INT_MAX)) {
    hashedKey = OpenSslSha256(key, keyBytes);
    key = hashedKey.data();
    keyBytes = hashedKey.size();
  }
  Digest out;
  unsigned int len = 0;
  const unsigned char* m = n > 0 ? static_cast<const unsigned char*>(msg) : &kNothing;
  if (HMAC(EVP_sha256(), keyBytes > 0 ? key : &kNothing, static_cast<int>(keyBytes), m, n,
           out.data(), &len) == nullptr ||
      len != kDigestBytes) {
    Fatal("libcrypto's HMAC(SHA-256) failed");
  }
  Wipe(hashedKey.data(), hashedKey.size());
  return out;
}
#endif

Status ReadUrandom(uint8_t* out, size_t n, int getrandomErrno) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  const int openErrno = errno;
  JR_REQUIRE(fd >= 0, Code::kSystem,
             "jax_rccl: cannot read random bytes: getrandom: ", ErrnoText(getrandomErrno),
             "; open(/dev/urandom): ", ErrnoText(openErrno));
  while (n > 0) {
    const ssize_t got = ::read(fd, out, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int e = got < 0 ? errno : 0;
      ::close(fd);
      JR_FAIL(Code::kSystem, "jax_rccl: cannot read random bytes: read(/dev/urandom): ",
              e != 0 ? ErrnoText(e) : std::string("end of file"));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
  ::close(fd);
  return Status::Ok();
}

}  // namespace

bool HaveOpenSsl() {
#ifdef JAX_RCCL_WITH_OPENSSL
  return true;
#else
  return false;
#endif
}

const char* CryptoBackendName(CryptoBackend b) {
  return Resolve(b) == CryptoBackend::kOpenSsl ? "openssl" : "builtin";
}

Status CryptoBackendAvailable(CryptoBackend b) {
  JR_REQUIRE(b != CryptoBackend::kOpenSsl || HaveOpenSsl(), Code::kInvalidArgument,
             "backend 'openssl' is not available: this build does not link libcrypto (built "
             "with JAX_RCCL_OPENSSL=OFF, or no OpenSSL 3 was found); backend must be 'default' "
             "or 'builtin'");
  return Status::Ok();
}

StatusOr<CryptoBackend> ParseCryptoBackend(std::string_view name) {
  CryptoBackend b;
  if (name == "default") {
    b = CryptoBackend::kDefault;
  } else if (name == "builtin") {
    b = CryptoBackend::kBuiltin;
  } else if (name == "openssl") {
    b = CryptoBackend::kOpenSsl;
  } else {
    JR_FAIL(Code::kInvalidArgument, "backend must be ",
            HaveOpenSsl() ? "'default', 'builtin' or 'openssl'" : "'default' or 'builtin'",
            " (got '", name, "')");
  }
  JR_CHECK(CryptoBackendAvailable(b));
  return b;
}

Digest Sha256(const void* data, size_t n, CryptoBackend b) {
  switch (Resolve(b)) {
    case CryptoBackend::kOpenSsl:
#ifdef JAX_RCCL_WITH_OPENSSL
      return OpenSslSha256(data, n);
#else
      Fatal("Sha256: backend kOpenSsl asked for in a build without libcrypto");
#endif
    default:
      return BuiltinSha256(data, n);
  }
}

Digest HmacSha256(const void* key, size_t keyBytes, const void* msg, size_t n, CryptoBackend b) {
  switch (Resolve(b)) {
    case CryptoBackend::kOpenSsl:
#ifdef JAX_RCCL_WITH_OPENSSL
      return OpenSslHmacSha256(key, keyBytes, msg, n);
#else
      Fatal("HmacSha256: backend kOpenSsl asked for in a build without libcrypto");
#endif
    default:
      return BuiltinHmacSha256(key, keyBytes, msg, n);
  }
}

bool ConstantTimeEqual(const void* a, const void* b, size_t n) {
  // Every byte is read and folded in; no branch depends on the data.
  const volatile uint8_t* x = static_cast<const volatile uint8_t*>(a);
  const volatile uint8_t* y = static_cast<const volatile uint8_t*>(b);
  uint8_t diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= x[i] ^ y[i];
  return diff == 0;
}

Status RandomBytes(void* out, size_t n) {
  JR_REQUIRE(out != nullptr || n == 0, Code::kInvalidArgument, "RandomBytes: no output buffer for ",
             n, " bytes");
  uint8_t* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    // Blocks only until the kernel's pool is first initialized (early boot); reads of more than
    // 256 bytes may come back short.
    const ssize_t got = ::getrandom(p, n, 0);
    if (got < 0) {
      const int e = errno;
      if (e == EINTR) continue;
      // Kernels before 3.17, or a seccomp filter that forbids the call.
      if (e == ENOSYS || e == EPERM) {
        JR_CHECK(ReadUrandom(p, n, e));
        return Status::Ok();
      }
      JR_FAIL(Code::kSystem, "jax_rccl: cannot read random bytes: getrandom: ", ErrnoText(e));
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

}  // namespace jax_rccl::comm
