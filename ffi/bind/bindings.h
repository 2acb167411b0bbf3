// Pieces of the nanobind module, one function per area; module.cc calls them all.
#pragma once

#include <nanobind/nanobind.h>

#include "ffi/core/status.h"
#include "ffi/planner/types.h"

namespace jax_rccl {

// Raises the Python exception for a failed status (the one place Status becomes an exception):
// invalid argument/usage -> ValueError, unsupported -> NotImplementedError, timeout ->
// TimeoutError, system -> OSError, internal -> RuntimeError.
void ThrowIfError(const Status& status);

template <typename T>
T ValueOrThrow(StatusOr<T> v) {
  ThrowIfError(v.status());
  return v.take();
}

void BindParams(nanobind::module_& m);
void BindPlanner(nanobind::module_& m);
// Low-level entry points for tests, under the submodule `internal`.
void BindRedop(nanobind::module_& m, nanobind::module_& internal);
void BindSelectInternals(nanobind::module_& internal);
void BindCollInternals(nanobind::module_& internal);
void BindP2pInternals(nanobind::module_& internal);
// The CPU runtime: FFI targets and types to register (CpuFfi(), ffi/handlers/collective.h),
// runtime statistics (ffi/bind/bind_runtime.cc).
void BindRuntime(nanobind::module_& m);
// Sets the process's world table from its dict form (`jax_rccl._jax_rccl.set_world`).
void SetWorld(const nanobind::dict& world);
// The socket transport's set-up: set_session_secret, socket_listen, socket_listener_counts (in
// the test module, `testing`, for its own copy of the runtime).
void BindSocketSetup(nanobind::module_& m, bool testing);

}  // namespace jax_rccl

namespace jax_rccl {
struct TopologyView;
// A topology from a dict keyed by TopologyView's field names (nRanks, nNodes, arch, intraLink,
// interLink, bwIntra, bwInter, nChannels, p2pnChannels, p2pnChannelsPerPeer, buffSizes,
// p2pChunkSize, ll128Enabled, treeDefined, pivotA2ANumBiRings, workFifoDepth, directPeers);
// missing keys keep their defaults, unknown keys are an error.
TopologyView TopologyFromDict(const nanobind::dict& d);
// A topology as that dict, every field (what Python's planner.Topology.from_native reads).
nanobind::dict TopologyDict(const TopologyView& t);
// A Python tuner fn(coll, nbytes, num_pipe_ops) -> None | (algorithm|None, protocol|None,
// nchannels) as the planner's tuner hook; a Python exception or a malformed answer becomes an
// error status of the planner.
TunerFn WrapTuner(nanobind::object fn);
// A planning request from Python values: a topology dict, a list of task dicts ({"coll",
// "count", "dtype", "op", "root", "peer"}), NCCL-syntax algorithm/protocol masks, a tuner.
struct PlanRequest;
class RedOpTable;
PlanRequest MakeRequest(const nanobind::dict& topology, const nanobind::list& tasks, int rank,
                        const std::string& algo, const std::string& proto, nanobind::object tuner,
                        const RedOpTable* userOps, bool persistent, uint64_t opCount,
                        int64_t p2pLLThreshold);
// The GPU runtime's bindings (submodule `gpu`), in GPU builds only (ffi/bind/bind_gpu.cc).
void BindGpu(nanobind::module_& m);
}  // namespace jax_rccl
