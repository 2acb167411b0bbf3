#include "ffi/planner/types.h"

#include <algorithm>
#include <cctype>
#include <iterator>
#include <sstream>
#include <vector>

namespace jax_rccl {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Looks `s` up among names[0..n) (case-insensitive) and aliases.
template <typename E>
StatusOr<E> ParseName(const std::string& s, const char* what, int n, const char* (*name)(E),
                      std::initializer_list<std::pair<const char*, E>> aliases = {}) {
  std::string key = Lower(Trim(s));
  std::string allowed;
  for (int i = 0; i < n; ++i) {
    E e = static_cast<E>(i);
    if (key == name(e)) return e;
    allowed += (i ? ", " : "");
    allowed += name(e);
  }
  for (const auto& [alias, e] : aliases) {
    if (key == alias) return e;
  }
  return Status(Code::kInvalidArgument,
                detail::StrCat(what, ": unknown value '", s, "'; allowed: ", allowed));
}

// The name of enumerator `e` in a table of one name per value from 0 (the enum's order, kCount
// values); "?" for a value outside it.
template <int kCount, typename E, size_t N>
const char* NameOf(const char* const (&names)[N], E e) {
  static_assert(N == kCount, "one name per enumerator");
  const int i = static_cast<int>(e);
  return i >= 0 && i < int(N) ? names[i] : "?";
}

}  // namespace

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFp8E4M3:
    case DataType::kFp8E5M2:
    case DataType::kBool:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
    case DataType::kInt16:
    case DataType::kUint16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

bool IsFloating(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
    case DataType::kFp8E4M3:
    case DataType::kFp8E5M2:
      return true;
    default:
      return false;
  }
}

bool IsSignedInteger(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kInt32 ||
         t == DataType::kInt64;
}

const char* CollName(Coll c) {
  static constexpr const char* kNames[] = {"broadcast",      "reduce",     "all_gather",
                                           "reduce_scatter", "all_reduce", "send_recv",
                                           "send",           "recv"};
  return NameOf<kNumColls>(kNames, c);
}

const char* DataTypeName(DataType t) {
  static constexpr const char* kNames[] = {"int8",    "uint8",    "int32",         "uint32",
                                           "int64",   "uint64",   "float16",       "float32",
                                           "float64", "bfloat16", "float8_e4m3fn", "float8_e5m2",
                                           "int16",   "uint16",   "bool"};
  return NameOf<kNumDataTypes>(kNames, t);
}

const char* RedOpName(int32_t op) {
  static constexpr const char* kNames[] = {"sum", "prod", "max", "min", "avg"};
  static_assert(std::size(kNames) == kNumRedOps, "one name per op");
  return op >= 0 && op < kNumRedOps ? kNames[op] : "user";
}

const char* DevRedOpName(DevRedOp op) {
  static constexpr const char* kNames[] = {"sum", "prod", "minmax", "premulsum", "sumpostdiv"};
  return NameOf<kNumDevRedOps>(kNames, op);
}

const char* AlgoName(Algo a) {
  static constexpr const char* kNames[] = {"tree", "ring", "direct"};
  return a == Algo::kUndef ? "undef" : NameOf<kNumAlgos>(kNames, a);
}

const char* ProtoName(Proto p) {
  static constexpr const char* kNames[] = {"ll", "ll128", "simple"};
  return p == Proto::kUndef ? "undef" : NameOf<kNumProtos>(kNames, p);
}

const char* PatternName(Pattern p) {
  static constexpr const char* kNames[] = {"ring",         "ring_twice", "pipeline_from",
                                           "pipeline_to",  "tree_up",    "tree_down",
                                           "tree_up_down", "p2p",        "direct"};
  return NameOf<kNumPatterns>(kNames, p);
}

const char* ArchName(Arch a) {
  static constexpr const char* kNames[] = {"cpu", "gfx90a", "gfx942", "sm80", "sm90"};
  return NameOf<kNumArchs>(kNames, a);
}

const char* LinkName(LinkKind l) {
  static constexpr const char* kNames[] = {"loopback", "shm", "pcie",  "xgmi",
                                           "nvlink",   "net", "socket"};
  return NameOf<kNumLinkKinds>(kNames, l);
}

int ArchWarpSize(Arch a) {
  switch (a) {
    case Arch::kGfx90a:
    case Arch::kGfx942:
      return 64;
    default:
      return 32;  // NVIDIA; the CPU executor mirrors the NVIDIA shape
  }
}

StatusOr<Coll> ParseColl(const std::string& s) {
  auto r = ParseName<Coll>(s, "coll", kNumColls, CollName,
                           {{"allreduce", Coll::kAllReduce},
                            {"allgather", Coll::kAllGather},
                            {"reducescatter", Coll::kReduceScatter}});
  if (r.ok() && r.value() == Coll::kSendRecv) {
    return Status(Code::kInvalidArgument,
                  "coll: 'send_recv' is not a task; issue a 'send' and a 'recv'");
  }
  return r;
}

StatusOr<DataType> ParseDataType(const std::string& s) {
  return ParseName<DataType>(s, "dtype", kNumDataTypes, DataTypeName,
                             {{"half", DataType::kFloat16},
                              {"float", DataType::kFloat32},
                              {"double", DataType::kFloat64},
                              {"f16", DataType::kFloat16},
                              {"f32", DataType::kFloat32},
                              {"f64", DataType::kFloat64},
                              {"bf16", DataType::kBfloat16},
                              {"fp8_e4m3", DataType::kFp8E4M3},
                              {"float8_e4m3", DataType::kFp8E4M3},
                              {"fp8_e5m2", DataType::kFp8E5M2},
                              {"char", DataType::kInt8},
                              {"int", DataType::kInt32}});
}

StatusOr<int32_t> ParseRedOp(const std::string& s) {
  std::string key = Lower(Trim(s));
  for (int32_t op = 0; op < kNumRedOps; ++op) {
    if (key == RedOpName(op)) return op;
  }
  if (key == "mean") return int32_t(kAvg);
  return Status(Code::kInvalidArgument,
                detail::StrCat("op: unknown value '", s,
                               "'; allowed: sum, prod, max, min, avg (or a user op handle)"));
}

StatusOr<Arch> ParseArch(const std::string& s) {
  return ParseName<Arch>(s, "arch", kNumArchs, ArchName,
                         {{"mi300x", Arch::kGfx942},
                          {"mi250x", Arch::kGfx90a},
                          {"h100", Arch::kSm90},
                          {"h200", Arch::kSm90},
                          {"a100", Arch::kSm80}});
}

StatusOr<LinkKind> ParseLink(const std::string& s) {
  return ParseName<LinkKind>(s, "link", kNumLinkKinds, LinkName,
                             {{"nvswitch", LinkKind::kNvlink}, {"pci", LinkKind::kPcie}});
}

StatusOr<Algo> ParseAlgo(const std::string& s) {
  return ParseName<Algo>(s, "algorithm", kNumAlgos, AlgoName);
}

StatusOr<Proto> ParseProto(const std::string& s) {
  return ParseName<Proto>(s, "protocol", kNumProtos, ProtoName);
}

namespace {

// NCCL's list syntax: items separated by commas; a leading '^' turns the list into exclusions.
template <typename E>
StatusOr<uint32_t> ParseMask(const std::string& spec, const std::string& what, int n,
                             const char* (*name)(E)) {
  std::string s = Trim(spec);
  uint32_t all = (1u << n) - 1;
  if (s.empty()) return all;
  bool exclude = s[0] == '^';
  if (exclude) s = s.substr(1);
  uint32_t mask = 0;
  std::stringstream ss(s);
  std::string item;
  std::string allowed;
  for (int i = 0; i < n; ++i) allowed += detail::StrCat(i ? ", " : "", name(static_cast<E>(i)));
  while (std::getline(ss, item, ',')) {
    std::string key = Lower(Trim(item));
    if (key.empty()) continue;
    int found = -1;
    for (int i = 0; i < n; ++i) {
      if (key == name(static_cast<E>(i))) found = i;
    }
    if (found < 0) {
      return Status(Code::kInvalidArgument,
                    detail::StrCat(what, "='", spec, "' has an unknown name '", Trim(item),
                                   "'; allowed: ", allowed,
                                   " (a comma list, '^' in front to exclude; empty: all)"));
    }
    mask |= 1u << found;
  }
  if (exclude) mask = all & ~mask;
  if (mask == 0) {
    return Status(Code::kInvalidArgument,
                  detail::StrCat(what, "='", spec, "' leaves nothing to choose from; allowed: ",
                                 allowed, " (a comma list, '^' in front to exclude; empty: all)"));
  }
  return mask;
}

}  // namespace

StatusOr<uint32_t> ParseAlgoMask(const std::string& spec, const std::string& what) {
  return ParseMask<Algo>(spec, what, kNumAlgos, AlgoName);
}

StatusOr<uint32_t> ParseProtoMask(const std::string& spec, const std::string& what) {
  return ParseMask<Proto>(spec, what, kNumProtos, ProtoName);
}

}  // namespace jax_rccl
