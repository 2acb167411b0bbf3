// The CPU runtime's region in a rank's shared-memory segment (shm_region.h).
#include "ffi/cpu/shm_region.h"

namespace jax_rccl {
namespace cpu {

using host::HostConn;
using host::RankRegion;

comm::ShmRegionLayout HostRegionLayout(const host::TransportGeometry& g) {
  comm::ShmRegionLayout l;
  l.nRanks = g.nRanks;
  l.nChannels = g.nChannels;
  l.slotBytes = g.slotBytes;
  l.bytes = RankRegion::Bytes(g);
  l.init = [g](char* region) { RankRegion::Init(region, g); };
  l.check = [g](const char* region, const std::string& name) -> Status {
    for (int c = 0; c < g.nChannels; ++c) {
      for (int f = 0; f < g.nRanks; ++f) {
        const int64_t at = RankRegion::HeaderOffset(g, c, f);
        const HostConn* conn = reinterpret_cast<const HostConn*>(region + at);
        JR_REQUIRE(conn->slotBytes == g.slotBytes &&
                       conn->dataOffset == RankRegion::DataOffset(g, c, f) - at,
                   Code::kInvalidUsage, "jax_rccl: refused the shared-memory segment ", name,
                   ": the connection of channel ", c, " from rank ", f, " states slots of ",
                   conn->slotBytes, " bytes at offset ", conn->dataOffset,
                   ", this process expects ", g.slotBytes, " at ",
                   RankRegion::DataOffset(g, c, f) - at);
      }
    }
    return Status::Ok();
  };
  return l;
}

}  // namespace cpu
}  // namespace jax_rccl
