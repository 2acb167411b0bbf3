// The CPU runtime's region in a rank's shared-memory segment (comm/shm.h): the rank's FIFO
// transport region (its doorbell and the connections to it, host/transport_host.h: RankRegion).
#pragma once

#include "ffi/comm/shm.h"
#include "ffi/host/transport_host.h"

namespace jax_rccl {
namespace cpu {

// The layout of a segment's region for geometry `g`: RankRegion's size, its connection headers
// written by the creator and checked in a peer's segment (each connection's slots where this
// process places them).
comm::ShmRegionLayout HostRegionLayout(const host::TransportGeometry& g);

}  // namespace cpu
}  // namespace jax_rccl
