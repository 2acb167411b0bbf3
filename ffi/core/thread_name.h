// Names of the runtime's threads, as `top -H`, `ps -L` and /proc/PID/task/*/comm show them.
#pragma once

#if defined(__linux__)
#include <pthread.h>
#endif

namespace jax_rccl {

// The calling thread's name: at most 15 characters (Linux keeps 16 bytes with the terminator;
// a longer name is refused and the thread keeps its old one).
inline void NameThisThread(const char* name) {
#if defined(__linux__)
  pthread_setname_np(pthread_self(), name);
#else
  (void)name;
#endif
}

}  // namespace jax_rccl
