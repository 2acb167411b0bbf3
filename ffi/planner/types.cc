#include "ffi/planner/types.h"

#include <algorithm>
#include <cctype>
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
  switch (c) {
    case Coll::kBroadcast:
      return "broadcast";
    case Coll::kReduce:
      return "reduce";
    case Coll::kAllGather:
      return "all_gather";
    case Coll::kReduceScatter:
      return "reduce_scatter";
    case Coll::kAllReduce:
      return "all_reduce";
    case Coll::kSendRecv:
      return "send_recv";
    case Coll::kSend:
      return "send";
    case Coll::kRecv:
      return "recv";
  }
  return "?";
}

const char* DataTypeName(DataType t) {
  switch (t) {
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kUint32:
      return "uint32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint64:
      return "uint64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFp8E4M3:
      return "float8_e4m3fn";
    case DataType::kFp8E5M2:
      return "float8_e5m2";
    case DataType::kInt16:
      return "int16";
    case DataType::kUint16:
      return "uint16";
    case DataType::kBool:
      return "bool";
  }
  return "?";
}

const char* RedOpName(int32_t op) {
  switch (op) {
    case kSum:
      return "sum";
    case kProd:
      return "prod";
    case kMax:
      return "max";
    case kMin:
      return "min";
    case kAvg:
      return "avg";
    default:
      return "user";
  }
}

const char* DevRedOpName(DevRedOp op) {
  switch (op) {
    case DevRedOp::kSum:
      return "sum";
    case DevRedOp::kProd:
      return "prod";
    case DevRedOp::kMinMax:
      return "minmax";
    case DevRedOp::kPreMulSum:
      return "premulsum";
    case DevRedOp::kSumPostDiv:
      return "sumpostdiv";
  }
  return "?";
}

const char* AlgoName(Algo a) {
  switch (a) {
    case Algo::kTree:
      return "tree";
    case Algo::kRing:
      return "ring";
    case Algo::kDirect:
      return "direct";
    case Algo::kUndef:
      return "undef";
  }
  return "?";
}

const char* ProtoName(Proto p) {
  switch (p) {
    case Proto::kLL:
      return "ll";
    case Proto::kLL128:
      return "ll128";
    case Proto::kSimple:
      return "simple";
    case Proto::kUndef:
      return "undef";
  }
  return "?";
}

const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kRing:
      return "ring";
    case Pattern::kRingTwice:
      return "ring_twice";
    case Pattern::kPipelineFrom:
      return "pipeline_from";
    case Pattern::kPipelineTo:
      return "pipeline_to";
    case Pattern::kTreeUp:
      return "tree_up";
    case Pattern::kTreeDown:
      return "tree_down";
    case Pattern::kTreeUpDown:
      return "tree_up_down";
    case Pattern::kP2p:
      return "p2p";
    case Pattern::kDirect:
      return "direct";
  }
  return "?";
}

const char* ArchName(Arch a) {
  switch (a) {
    case Arch::kCpu:
      return "cpu";
    case Arch::kGfx90a:
      return "gfx90a";
    case Arch::kGfx942:
      return "gfx942";
    case Arch::kSm80:
      return "sm80";
    case Arch::kSm90:
      return "sm90";
  }
  return "?";
}

const char* LinkName(LinkKind l) {
  switch (l) {
    case LinkKind::kLoopback:
      return "loopback";
    case LinkKind::kShm:
      return "shm";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kXgmi:
      return "xgmi";
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kNet:
      return "net";
    case LinkKind::kSocket:
      return "socket";
  }
  return "?";
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
