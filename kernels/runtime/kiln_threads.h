// How many threads a CPU kernel runs on when its caller names no number: the one rule of
// every host that runs kiln's .so kernels (the C++ client here; the Python client's
// kiln/loader.py spells the same rule, and the torch backend passes torch.get_num_threads()).
//
//   1. $KILN_NUM_THREADS, when it is a positive integer;
//   2. else $OMP_NUM_THREADS (its first entry: OpenMP allows one per nesting level), likewise;
//   3. else the number of CPUs in this thread's affinity mask (taskset, cgroup cpusets);
//   4. else the number of online CPUs.
//
// Not part of the generated code's runtime (the compiler does not embed this header): a
// kernel is always handed its thread count by the host.
//
// Thread-safety: reads the environment; safe to call from any thread that does not race
// setenv.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace kiln::runtime {

// The value of `text` when all of it is a positive decimal integer (leading blanks allowed,
// a ',' ends it), else 0.
inline int PositiveIntPrefix(const char* text) {
  if (text == nullptr) return 0;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(text, &end, 10);
  if (end == text || errno != 0 || n <= 0 || n > (1 << 20)) return 0;
  while (*end == ' ' || *end == '\t') ++end;
  return (*end == '\0' || *end == ',') ? static_cast<int>(n) : 0;
}

inline int DefaultNumThreads() {
  for (const char* var : {"KILN_NUM_THREADS", "OMP_NUM_THREADS"}) {
    if (const int n = PositiveIntPrefix(std::getenv(var)); n > 0) return n;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    if (const int n = CPU_COUNT(&set); n > 0) return n;
  }
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

}  // namespace kiln::runtime
