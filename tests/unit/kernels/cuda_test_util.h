// Helpers for CUDA backend tests without a GPU: host tensors with random data, the CPU
// backend as the reference, and the generated CUDA unit compiled as host C++ against the
// software model in cuda_emulation.h and run block by block.
#pragma once

#include <dlfcn.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/codegen/cuda/cuda_codegen.h"
#include "kernels/codegen/runtime_headers.h"
#include "kernels/util/status_macros.h"
#include "tests/unit/kernels/test_util.h"

namespace kiln::testing {

inline Target CudaTarget(int sm) {
  Target t;
  t.kind = Target::Kind::kCuda;
  t.isa.clear();
  t.sm = sm;
  return t;
}

inline Target CpuTarget() {
  Target t;
  t.isa = "x86-64-v3";
  return t;
}

inline bool HaveNvrtc() { return SharedPipeline().CheckTarget(CudaTarget(90)).ok(); }

// A host tensor in 64-byte aligned memory (generated code may use 16-byte vector accesses).
struct HostTensor {
  ir::DType dtype = ir::DType::kF32;
  int64_t elements = 0;
  std::shared_ptr<char> data;
  int64_t bytes() const { return elements * ir::DTypeSize(dtype); }

  // Every byte is `poison` until written. The default makes floats NaN and integers -1; the
  // output checks use the finite sentinels kPoisonA and kPoisonB instead (see
  // ExpectMatchesCpu).
  static HostTensor Make(ir::DType t, int64_t n, unsigned char poison = 0xff) {
    HostTensor h;
    h.dtype = t;
    h.elements = n;
    size_t size = static_cast<size_t>((std::max<int64_t>(h.bytes(), 1) + 63) / 64 * 64);
    h.data = std::shared_ptr<char>(static_cast<char*>(std::aligned_alloc(64, size)), std::free);
    std::memset(h.data.get(), poison, size);
    return h;
  }
  // Whether element i has the same bytes here and in `o`.
  bool SameBits(const HostTensor& o, int64_t i) const {
    const int64_t w = ir::DTypeSize(dtype);
    return std::memcmp(data.get() + i * w, o.data.get() + i * w, static_cast<size_t>(w)) == 0;
  }
  void Set(int64_t i, double v) {
    char* p = data.get();
    switch (dtype) {
      case ir::DType::kF16:
        reinterpret_cast<_Float16*>(p)[i] = static_cast<_Float16>(v);
        break;
      case ir::DType::kBF16: {
        float f = static_cast<float>(v);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        reinterpret_cast<uint16_t*>(p)[i] =
            static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
        break;
      }
      case ir::DType::kF32:
        reinterpret_cast<float*>(p)[i] = static_cast<float>(v);
        break;
      case ir::DType::kF64:
        reinterpret_cast<double*>(p)[i] = v;
        break;
      case ir::DType::kI8:
        reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
        break;
      case ir::DType::kI16:
        reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(v);
        break;
      case ir::DType::kI32:
        reinterpret_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
        break;
      case ir::DType::kI64:
        reinterpret_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
        break;
      case ir::DType::kU8:
        reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
        break;
      case ir::DType::kBool:
        reinterpret_cast<uint8_t*>(p)[i] = v != 0;
        break;
    }
  }
  double At(int64_t i) const {
    const char* p = data.get();
    switch (dtype) {
      case ir::DType::kF16:
        return static_cast<double>(reinterpret_cast<const _Float16*>(p)[i]);
      case ir::DType::kBF16: {
        uint32_t u = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
      }
      case ir::DType::kF32:
        return reinterpret_cast<const float*>(p)[i];
      case ir::DType::kF64:
        return reinterpret_cast<const double*>(p)[i];
      case ir::DType::kI8:
        return reinterpret_cast<const int8_t*>(p)[i];
      case ir::DType::kI16:
        return reinterpret_cast<const int16_t*>(p)[i];
      case ir::DType::kI32:
        return reinterpret_cast<const int32_t*>(p)[i];
      case ir::DType::kI64:
        return static_cast<double>(reinterpret_cast<const int64_t*>(p)[i]);
      case ir::DType::kU8:
        return reinterpret_cast<const uint8_t*>(p)[i];
      case ir::DType::kBool:
        return reinterpret_cast<const uint8_t*>(p)[i];
    }
    return 0;
  }
};

// Two poison bytes whose patterns are finite numbers of every float type (0x5a5a5a5a is about
// 1.5e16 as f32; 0xa5a5 about -0.022 as f16) and odd values of every integer type. An output
// element the kernel never writes keeps the poison, which no reference shares in both runs.
inline constexpr unsigned char kPoisonA = 0x5a, kPoisonB = 0xa5;

// Random values suited to the dtype: normal floats (some ops make NaN, as they should),
// small integers (so products and powers stay in range), booleans.
inline HostTensor RandomTensor(ir::DType t, int64_t n, std::mt19937* rng, double scale = 2.0) {
  HostTensor h = HostTensor::Make(t, n);
  std::normal_distribution<double> nd(0, scale);
  std::uniform_int_distribution<int> small(-20, 20), positive(0, 40), bit(0, 1);
  char* p = h.data.get();
  for (int64_t i = 0; i < n; ++i) {
    switch (t) {
      case ir::DType::kF16:
        reinterpret_cast<_Float16*>(p)[i] = static_cast<_Float16>(nd(*rng));
        break;
      case ir::DType::kBF16: {
        float f = static_cast<float>(nd(*rng));
        uint32_t u;
        std::memcpy(&u, &f, 4);
        reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(u >> 16);
        break;
      }
      case ir::DType::kF32:
        reinterpret_cast<float*>(p)[i] = static_cast<float>(nd(*rng));
        break;
      case ir::DType::kF64:
        reinterpret_cast<double*>(p)[i] = nd(*rng);
        break;
      case ir::DType::kI8:
        reinterpret_cast<int8_t*>(p)[i] = static_cast<int8_t>(small(*rng));
        break;
      case ir::DType::kI16:
        reinterpret_cast<int16_t*>(p)[i] = static_cast<int16_t>(small(*rng));
        break;
      case ir::DType::kI32:
        reinterpret_cast<int32_t*>(p)[i] = small(*rng);
        break;
      case ir::DType::kI64:
        reinterpret_cast<int64_t*>(p)[i] = small(*rng);
        break;
      case ir::DType::kU8:
        reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(positive(*rng));
        break;
      case ir::DType::kBool:
        reinterpret_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(bit(*rng));
        break;
    }
  }
  return h;
}

inline std::string SlurpFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A generated CUDA unit built as host C++ and run on the CPU.
class EmulatedUnit {
 public:
  static absl::StatusOr<std::unique_ptr<EmulatedUnit>> Build(const std::string& source) {
    const char* src = std::getenv("KILN_SOURCE_DIR");
    if (!src) return absl::FailedPreconditionError("KILN_SOURCE_DIR not set");
    auto dir = toolchain::TempDir::Create("kiln-emu-");
    if (!dir.ok()) return dir.status();
    auto u = std::unique_ptr<EmulatedUnit>(new EmulatedUnit(std::move(*dir)));
    const std::string& d = u->dir_.path();
    for (const auto& [name, text] : codegen::RuntimeHeaders(/*cuda=*/true))
      KILN_RETURN_IF_ERROR(toolchain::WriteFile(d + "/" + name, text));
    KILN_RETURN_IF_ERROR(
        toolchain::WriteFile(d + "/cuda_emulation.h",
                             SlurpFile(std::string(src) + "/tests/unit/kernels/cuda_emulation.h")));
    KILN_RETURN_IF_ERROR(toolchain::WriteFile(d + "/kernel.cu", source));
    toolchain::SandboxLimits limits;
    limits.timeout_s = 120;
    auto r = toolchain::RunSandboxed(
        {"g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-w", "-DKILN_CUDA_EMULATION", "-include",
         "cuda_emulation.h", "-I.", "-x", "c++", "kernel.cu", "-o", "k.so"},
        d, limits);
    if (!r.ok()) return r.status();
    if (r->exit_code != 0) return absl::InternalError("emulation build failed:\n" + r->output);
    u->handle_ = dlopen((d + "/k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!u->handle_) return absl::InternalError(dlerror());
    u->launch_ = reinterpret_cast<int (*)(void*, unsigned, unsigned, void**, int)>(
        dlsym(u->handle_, "kiln_emu_launch"));
    return u;
  }
  ~EmulatedUnit() {
    if (handle_) dlclose(handle_);
  }
  void* handle() const { return handle_; }

  // `tensors`: the graph's inputs then its outputs, as for the CPU library.
  absl::Status Run(const LaunchPlan& plan, const std::vector<HostTensor>& tensors, int num_inputs,
                   unsigned char poison = 0xff) {
    HostTensor ws =
        HostTensor::Make(ir::DType::kU8, std::max<int64_t>(plan.workspace_bytes, 1), poison);
    std::vector<void*> ptrs;
    for (const PlanBuffer& b : plan.buffers) {
      switch (b.role) {
        case BufferRole::kInput:
          ptrs.push_back(tensors[b.index].data.get());
          break;
        case BufferRole::kOutput:
          ptrs.push_back(tensors[num_inputs + b.index].data.get());
          break;
        case BufferRole::kTemp:
          ptrs.push_back(ws.data.get() + b.offset);
          break;
      }
    }
    for (const PlanStep& s : plan.steps) {
      void* fn = dlsym(handle_, s.kernel.c_str());
      if (!fn) return absl::InternalError("no kernel " + s.kernel);
      std::vector<void*> args;
      for (int a : s.args) args.push_back(ptrs[a]);
      launch_(fn, s.grid[0], s.block[0], args.data(), static_cast<int>(args.size()));
    }
    return absl::OkStatus();
  }

 private:
  explicit EmulatedUnit(toolchain::TempDir d) : dir_(std::move(d)) {}
  toolchain::TempDir dir_;
  void* handle_ = nullptr;
  int (*launch_)(void*, unsigned, unsigned, void**, int) = nullptr;
};

// Whether two results agree: bit-exact for integers and booleans; for floats NaN matches
// NaN, infinities match by sign, and finite values within tolerance (the two backends may
// sum in different orders).
inline bool Close(ir::DType t, double a, double b) {
  if (!ir::IsFloat(t)) return a == b;
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  double rtol = t == ir::DType::kF64   ? 1e-10
                : t == ir::DType::kF32 ? 2e-5
                : t == ir::DType::kF16 ? 4e-3
                                       : 2e-2;
  return std::fabs(a - b) <= rtol * (1 + std::fabs(b));
}

using ir::AttrMap;
using ir::DType;
using ir::ValueId;

// Tests that build cubins need NVRTC, which the build has when CMake found the CUDA toolkit.
// Without it they skip, saying so; with KILN_REQUIRE_NVRTC=1 in the environment (a machine
// that must have the toolkit) they fail instead.
#define REQUIRE_NVRTC()                                                                          \
  if (!::kiln::testing::HaveNvrtc()) {                                                           \
    if (std::getenv("KILN_REQUIRE_NVRTC") != nullptr) FAIL() << "no NVRTC in this build";        \
    GTEST_SKIP() << "no NVRTC in this build (the CUDA toolkit was not found at configure time)"; \
  }

inline int64_t Elements(const ir::Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline ir::Graph Verified(ir::Graph g) {
  auto st = ir::VerifyAndInfer(g);
  EXPECT_TRUE(st.ok()) << st;
  return g;
}

// Builds a graph from `inputs` with `body` adding nodes and returning the outputs.
inline ir::Graph Make(std::vector<ir::TensorType> inputs,
                      const std::function<std::vector<ValueId>(ir::Builder&)>& body) {
  ir::Graph in;
  in.inputs = std::move(inputs);
  ir::Builder b(in);
  std::vector<ValueId> outs = body(b);
  return Verified(b.Finish(outs));
}

// sum over (j, k) of f(x[i, j] * y[i, k]): factored into row sums when f is the identity
// (passes/factor_reductions.cc), otherwise rows with no memory stream of their own, bound by
// arithmetic: a few warps per row (KernelGen::Row).
// f64 by default: the sums cancel (random signs), so f32 results of two summation orders
// differ in their leading digits.
inline ir::Graph OuterProductSum(int64_t rows, int64_t d, const char* f,
                                 ir::DType t = ir::DType::kF64) {
  return Make({Ty(t, {rows, d}), Ty(t, {rows, d})}, [&](ir::Builder& b) {
    auto xe = *b.Add("unsqueeze", {0}, {{"axes", ir::IntList{2}}});
    auto ye = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{1}}});
    ir::ValueId p = *b.Add("mul", {xe, ye});
    if (f) p = *b.Add(f, {p});
    return std::vector<ir::ValueId>{*b.Add("sum", {p}, {{"axes", ir::IntList{-2, -1}}})};
  });
}

using Mutator = std::function<void(int input, HostTensor* t)>;
// Fills the expected outputs from the inputs, in place of the CPU backend.
using Reference =
    std::function<void(const std::vector<HostTensor>& inputs, std::vector<HostTensor>* outputs)>;

// Runs `g` through the CPU backend (or `reference`, preferred where the test can compute the
// result on the host: a bug shared by both backends survives a comparison between them) and
// the emulated CUDA unit on the same random inputs, and compares the outputs. The unit runs
// twice, its outputs and workspace poisoned with kPoisonA and then kPoisonB: the two runs must
// agree bit for bit, so an element left unwritten fails whatever the reference holds there.
inline void ExpectMatchesCpu(const ir::Graph& g, const Mutator& mutate = nullptr,
                             const Reference& reference = nullptr) {
  auto gen = SharedPipeline().Generate(g, CudaTarget(90), CompileOptions{});
  ASSERT_TRUE(gen.ok()) << gen.status();
  if (std::getenv("KILN_TEST_DUMP") != nullptr)
    std::fprintf(stderr, "%s\n%s", gen->fusion_report.c_str(), gen->source.c_str());
  auto emu = EmulatedUnit::Build(gen->source);
  ASSERT_TRUE(emu.ok()) << emu.status() << "\n" << gen->source;
  std::mt19937 rng(1);
  std::vector<HostTensor> inputs, want, got;
  for (size_t i = 0; i < g.inputs.size(); ++i) {
    int64_t n = gen->plan.buffers[i].bytes / ir::DTypeSize(g.inputs[i].dtype);
    inputs.push_back(RandomTensor(g.inputs[i].dtype, n, &rng));
    if (mutate) mutate(static_cast<int>(i), &inputs.back());
  }
  std::vector<HostTensor> again;
  for (ValueId v : g.outputs) {
    const ir::TensorType& t = g.TypeOf(v);
    want.push_back(HostTensor::Make(t.dtype, Elements(t.shape)));
    got.push_back(HostTensor::Make(t.dtype, Elements(t.shape), kPoisonA));
    again.push_back(HostTensor::Make(t.dtype, Elements(t.shape), kPoisonB));
  }
  if (reference) {
    reference(inputs, &want);
  } else {
    auto cpu = SharedPipeline().Compile(g, CpuTarget(), CompileOptions{});
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    Loaded lib(*cpu);
    std::vector<void*> args;
    for (const HostTensor& t : inputs) args.push_back(t.data.get());
    for (const HostTensor& t : want) args.push_back(t.data.get());
    // One thread: the reference's summation order is then sequential, whatever the CPU
    // backend's thread split.
    ASSERT_EQ(lib.Run(args, 1), 0);
  }
  for (auto [outs, poison] : {std::pair{&got, kPoisonA}, std::pair{&again, kPoisonB}}) {
    std::vector<HostTensor> all = inputs;
    all.insert(all.end(), outs->begin(), outs->end());
    ASSERT_TRUE((*emu)->Run(gen->plan, all, g.num_inputs(), poison).ok());
  }
  int failures = 0;
  for (size_t o = 0; o < want.size(); ++o) {
    for (int64_t i = 0; i < want[o].elements && failures < 8; ++i) {
      double w = want[o].At(i), c = got[o].At(i);
      if (!Close(want[o].dtype, c, w) || !got[o].SameBits(again[o], i)) {
        ++failures;
        ADD_FAILURE() << "output " << o << " (" << ir::DTypeName(want[o].dtype) << ") element " << i
                      << ": cuda " << c << " (" << again[o].At(i)
                      << " with the other poison), expected " << w;
      }
    }
  }
  if (failures) ADD_FAILURE() << gen->fusion_report << gen->source;
}

inline const char* kUnaryOps[] = {
    "neg",   "abs",   "sign",       "exp",         "exp2",       "expm1",   "log",         "log2",
    "log1p", "sqrt",  "rsqrt",      "sin",         "cos",        "tan",     "tanh",        "asin",
    "acos",  "atan",  "sinh",       "cosh",        "sigmoid",    "erf",     "floor",       "ceil",
    "round", "trunc", "reciprocal", "logical_not", "isnan",      "isinf",   "bitwise_not", "gelu",
    "elu",   "silu",  "softplus",   "relu",        "leaky_relu", "hardtanh"};
inline const char* kBinaryOps[] = {
    "add",         "sub",         "mul",        "div",        "floordiv",    "remainder",
    "pow",         "maximum",     "minimum",    "atan2",      "eq",          "ne",
    "lt",          "le",          "gt",         "ge",         "logical_and", "logical_or",
    "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor"};
inline const char* kReduceOps[] = {"sum", "prod", "max",    "min",    "any",       "all", "mean",
                                   "var", "std",  "argmax", "argmin", "logsumexp", "norm"};

inline std::vector<std::string> ExpectedRejections(DType t, const std::string& family);

// Adds `op` when the type rules accept it; records it in `rejected` when they refuse it.
inline void AddOrRecord(ir::Builder& b, const std::string& op, std::vector<ValueId> inputs,
                        const AttrMap& attrs, std::vector<ValueId>* outs,
                        std::vector<std::string>* rejected) {
  absl::StatusOr<ValueId> v = b.Add(op, std::move(inputs), attrs);
  if (v.ok()) {
    outs->push_back(*v);
    return;
  }
  EXPECT_NE(v.status().message().find(op + ": " + op), std::string_view::npos)
      << v.status();  // names the op
  if (rejected->empty() || rejected->back() != op) rejected->push_back(op);
}

// Every op of the family that the type rules accept for `t`, applied to the inputs; one graph.
// The ops the rules refuse are checked against ExpectedRejections, so that no op drops out
// of the "every op" tests unnoticed.
inline ir::Graph AllElementwise(DType t, const ir::Shape& shape, bool binary) {
  ir::Graph in;
  in.inputs = {Ty(t, shape), Ty(t, shape)};
  ir::Builder b(in);
  std::vector<ValueId> outs;
  std::vector<std::string> rejected;
  if (binary) {
    for (const char* op : kBinaryOps) AddOrRecord(b, op, {0, 1}, {}, &outs, &rejected);
    if (auto c = b.Add("gt", {0, 1}); c.ok())
      AddOrRecord(b, "where", {*c, 0, 1}, {}, &outs, &rejected);
  } else {
    for (const char* op : kUnaryOps) AddOrRecord(b, op, {0}, {}, &outs, &rejected);
    AddOrRecord(b, "clamp", {0}, {{"min", -1.5}, {"max", 2.0}}, &outs, &rejected);
    for (DType to : {DType::kF32, DType::kI32, DType::kBool, DType::kF16})
      AddOrRecord(b, "cast", {0}, {{"dtype", to}}, &outs, &rejected);
  }
  EXPECT_EQ(rejected, ExpectedRejections(t, binary ? "binary" : "unary"))
      << "dtype " << ir::DTypeName(t);
  return Verified(b.Finish(outs));
}

// Reductions over the last axis, the first axis, and everything.
inline ir::Graph AllReductions(DType t, const ir::Shape& shape) {
  ir::Graph in;
  in.inputs = {Ty(t, shape)};
  ir::Builder b(in);
  std::vector<ValueId> outs;
  std::vector<std::string> rejected;
  for (const char* op : kReduceOps) {
    bool arg = std::string(op) == "argmax" || std::string(op) == "argmin";
    std::vector<AttrMap> variants;
    if (arg) {
      variants = {{{"axis", int64_t{-1}}}, {{"axis", int64_t{0}}}, {}};
    } else {
      variants = {{{"axes", ir::IntList{-1}}}, {{"axes", ir::IntList{0}}}, {}};
    }
    for (const AttrMap& attrs : variants) AddOrRecord(b, op, {0}, attrs, &outs, &rejected);
  }
  EXPECT_EQ(rejected, ExpectedRejections(t, "reduce")) << "dtype " << ir::DTypeName(t);
  return Verified(b.Finish(outs));
}

inline const ir::DType kAllTypes[] = {DType::kF32,  DType::kF64, DType::kF16,
                                      DType::kBF16, DType::kI32, DType::kI64,
                                      DType::kI8,   DType::kU8,  DType::kBool};

// The ops of each family the type rules refuse for a dtype (kernels/ir/OPS.md), in the
// order of kUnaryOps, kBinaryOps and kReduceOps.
inline std::vector<std::string> ExpectedRejections(DType t, const std::string& family) {
  const bool fl = ir::IsFloat(t);
  if (family == "unary") {
    if (fl) return {"bitwise_not"};                 // bit operations take integers and bool
    if (t == DType::kBool) return {"neg", "sign"};  // NumPy refuses them for bool
    return {};
  }
  if (family == "binary") {
    if (fl) return {"bitwise_and", "bitwise_or", "bitwise_xor"};
    if (t == DType::kBool)
      return {"sub", "floordiv", "remainder", "pow"};  // NumPy refuses them for bool
    return {};
  }
  return {};  // every reduction takes every type
}

// x*sin(x) + cos(x)^2 - sin(x): each element depends on its input through every op.
inline ir::Graph SinCos(int64_t n) {
  return Make({Ty(DType::kF32, {n})}, [](ir::Builder& b) {
    auto s = *b.Add("sin", {0});
    auto c = *b.Add("cos", {0});
    auto xs = *b.Add("mul", {0, s});
    return std::vector<ValueId>{*b.Add("sub", {*b.Add("add", {xs, *b.Add("mul", {c, c})}), s})};
  });
}
inline void SinCosReference(const std::vector<HostTensor>& in, std::vector<HostTensor>* out) {
  for (int64_t i = 0; i < in[0].elements; ++i) {
    const double x = in[0].At(i), s = std::sin(x), c = std::cos(x);
    (*out)[0].Set(i, x * s + c * c - s);
  }
}
// Softmax over the rows of a rows x cols tensor, in double.
inline std::vector<double> HostSoftmaxRows(const HostTensor& x, int64_t rows, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < cols; ++j) m = std::max(m, x.At(r * cols + j));
    for (int64_t j = 0; j < cols; ++j)
      sum += (out[r * cols + j] = std::exp(x.At(r * cols + j) - m));
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] /= sum;
  }
  return out;
}
inline ir::Graph Softmax(int64_t r, int64_t c, DType t = DType::kF32) {
  return Make({Ty(t, {r, c})},
              [](ir::Builder& b) { return std::vector<ValueId>{*b.Add("softmax", {0})}; });
}
inline ir::Graph LayerNormGelu(int64_t r, int64_t c, DType t = DType::kF32) {
  return Make({Ty(t, {r, c})}, [](ir::Builder& b) {
    return std::vector<ValueId>{*b.Add("gelu", {*b.Add("layer_norm", {0})})};
  });
}
inline ir::Graph KMeans(int64_t n, int64_t k, DType t) {
  return Make({Ty(t, {n, 2}), Ty(t, {k, 2})}, [](ir::Builder& b) {
    auto m3 = *b.Add("unsqueeze", {1}, {{"axes", ir::IntList{1}}});
    auto nrm = *b.Add("norm", {*b.Add("sub", {0, m3})}, {{"axes", ir::IntList{2}}});
    return std::vector<ValueId>{*b.Add("argmin", {nrm}, {{"axis", int64_t{0}}})};
  });
}

}  // namespace kiln::testing
