// The device runtime's check of a HIP (CUDA) runtime call: a failure returns a Status naming the
// call and the runtime's message (the one error family, ffi/core/status.h).
#pragma once

#include "ffi/core/status.h"
#include "hip/portability.h"

#define JR_HIP_CHECK(expr)                                                                       \
  do {                                                                                           \
    const hipError_t jr_err_ = (expr);                                                           \
    JR_REQUIRE(jr_err_ == hipSuccess, Code::kInternal, #expr, ": ", hipGetErrorString(jr_err_)); \
  } while (0)
