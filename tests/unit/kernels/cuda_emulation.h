// A software model of the CUDA built-ins that generated kernels use, so tests can compile the
// generated CUDA unit as host C++ (force-included before it, with KILN_CUDA_EMULATION
// defined) and run it on the CPU against the CPU backend, with no GPU.
//
// A block runs as one fiber per thread on the calling OS thread: every fiber runs until it
// reaches a barrier (__syncthreads, or either half of a warp shuffle), then the next; when
// all have arrived the barrier opens. Threads that return while others wait at a barrier
// are reported as divergence (fatal), as that would hang or be undefined on a GPU.
//
// Blocks run one after another, so `__shared__` maps onto `static` storage, all of it in one
// linker section. To keep that from hiding bugs a GPU would show, every launch runs its blocks
// in a shuffled order (a kernel must not depend on block order), runs the threads of a block in
// a shuffled order between barriers (a missing __syncthreads shows as a wrong result), and
// fills shared memory with a fresh junk byte before each block (a read of shared memory the
// block has not written shows as a wrong result, not as the previous block's data). The
// shuffles come from a generator seeded by KILN_EMU_SEED (default 1) and the launch count, so
// a failure repeats.
// Thread-safety: one launch at a time per process.
#pragma once

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

using std::isinf;

namespace kiln_emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline Dim3 thread_idx, block_idx, block_dim, grid_dim;

struct Fiber {
  ucontext_t ctx;
  bool done = false;
  bool waiting = false;
};

struct Block {
  ucontext_t scheduler;
  std::vector<Fiber> fibers;
  unsigned current = 0;
  std::vector<unsigned long long> slots;  // shuffle exchange, one per thread
  void (*entry)(void**) = nullptr;
  void** args = nullptr;
};
inline Block* block = nullptr;

inline void Barrier() {
  Fiber& f = block->fibers[block->current];
  f.waiting = true;
  swapcontext(&f.ctx, &block->scheduler);
}

inline void FiberMain() {
  block->entry(block->args);
  block->fibers[block->current].done = true;
  swapcontext(&block->fibers[block->current].ctx, &block->scheduler);
}

}  // namespace kiln_emu

#define threadIdx kiln_emu::thread_idx
#define blockIdx kiln_emu::block_idx
#define blockDim kiln_emu::block_dim
#define gridDim kiln_emu::grid_dim
#define KILN_EMULATION 1  // kiln_cuda.h: vector accesses check their alignment
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static __attribute__((section("kiln_emu_shared")))

// The bounds of the section holding every __shared__ variable (defined by the linker; weak, so
// a unit without shared memory still loads).
extern "C" char __start_kiln_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_kiln_emu_shared[] __attribute__((weak, visibility("hidden")));

inline void __syncthreads() { kiln_emu::Barrier(); }

template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of a wide type");
  unsigned me = threadIdx.x;
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  kiln_emu::block->slots[me] = bits;
  kiln_emu::Barrier();
  unsigned long long other = kiln_emu::block->slots[me ^ static_cast<unsigned>(mask)];
  kiln_emu::Barrier();
  T r;
  memcpy(&r, &other, sizeof(T));
  return r;
}

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

typedef _Float16 __half;
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }
struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1);
  return {static_cast<uint16_t>(u >> 16)};
}

namespace kiln_emu {

// Calls a kernel taking N pointers with args[0..N).
template <size_t... I>
void CallWith(void* fn, void** a, std::index_sequence<I...>) {
  reinterpret_cast<void (*)(decltype((void)I, static_cast<void*>(nullptr))...)>(fn)(a[I]...);
}
template <size_t... N>
constexpr auto MakeCallers(std::index_sequence<N...>) {
  return std::array<void (*)(void*, void**), sizeof...(N)>{
      [](void* fn, void** a) { CallWith(fn, a, std::make_index_sequence<N>()); }...};
}
inline constexpr auto kCallers = MakeCallers(std::make_index_sequence<65>());
inline void* kernel = nullptr;
inline int num_args = 0;

}  // namespace kiln_emu

// Runs kernel `fn` (taking `nargs` pointers, at most 64) over a 1-D grid. Returns 0, or
// aborts on barrier divergence.
extern "C" int kiln_emu_launch(void* fn, unsigned grid, unsigned block, void** args, int nargs) {
  using kiln_emu::Block;
  if (nargs < 0 || nargs > 64) abort();
  kiln_emu::kernel = fn;
  kiln_emu::num_args = nargs;
  auto entry = [](void** a) { kiln_emu::kCallers[kiln_emu::num_args](kiln_emu::kernel, a); };
  const size_t kStack = 256 * 1024;
  char* stacks = static_cast<char*>(mmap(nullptr, kStack * block, PROT_READ | PROT_WRITE,
                                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  if (stacks == MAP_FAILED) abort();
  kiln_emu::grid_dim = {grid, 1, 1};
  kiln_emu::block_dim = {block, 1, 1};
  static unsigned long long launches = 0;
  const char* seed_text = getenv("KILN_EMU_SEED");
  std::mt19937_64 rng((seed_text ? strtoull(seed_text, nullptr, 10) : 1ull) * 1000003ull +
                      launches++);
  std::vector<unsigned> block_order(grid), thread_order(block);
  std::iota(block_order.begin(), block_order.end(), 0u);
  std::iota(thread_order.begin(), thread_order.end(), 0u);
  std::shuffle(block_order.begin(), block_order.end(), rng);
  for (unsigned b : block_order) {
    if (__start_kiln_emu_shared != nullptr && __stop_kiln_emu_shared != nullptr)
      memset(__start_kiln_emu_shared, static_cast<int>(rng() & 0xff),
             __stop_kiln_emu_shared - __start_kiln_emu_shared);
    Block blk;
    blk.fibers.resize(block);
    blk.slots.assign(block, 0);
    blk.entry = entry;
    blk.args = args;
    kiln_emu::block = &blk;
    kiln_emu::block_idx = {b, 1, 1};
    for (unsigned t = 0; t < block; ++t) {
      ucontext_t& c = blk.fibers[t].ctx;
      getcontext(&c);
      c.uc_stack.ss_sp = stacks + kStack * t;
      c.uc_stack.ss_size = kStack;
      c.uc_link = nullptr;
      makecontext(&c, kiln_emu::FiberMain, 0);
    }
    for (;;) {
      unsigned done = 0, waiting = 0;
      std::shuffle(thread_order.begin(), thread_order.end(), rng);
      for (unsigned t : thread_order) {
        kiln_emu::Fiber& f = blk.fibers[t];
        if (f.done) {
          ++done;
          continue;
        }
        f.waiting = false;
        blk.current = t;
        kiln_emu::thread_idx = {t, 1, 1};
        swapcontext(&blk.scheduler, &f.ctx);
        if (f.done) ++done;
        if (f.waiting) ++waiting;
      }
      if (done == block) break;
      if (done != 0 && waiting != 0) {
        fprintf(stderr, "emulation: block %u: %u thread(s) returned while %u wait at a barrier\n",
                b, done, waiting);
        abort();
      }
    }
  }
  munmap(stacks, kStack * block);
  return 0;
}
