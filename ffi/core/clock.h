// The clock of every deadline and timeout in the runtimes.
#pragma once

#include <chrono>

namespace jax_rccl {

using Clock = std::chrono::steady_clock;

}  // namespace jax_rccl
