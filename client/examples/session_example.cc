// kiln_example: compiles one graph (a row softmax) on a kilnd daemon and runs it here through
// kiln::client::Session, on the CPU or on a CUDA GPU: the same calls either way. Checks the
// result against a plain C++ softmax and prints one line per run.
//
//   kiln_example --server 127.0.0.1:50051 --target cpu
//   kiln_example --server 127.0.0.1:50051 --target cuda:sm_90 --rows 4096 --cols 1000
//
// Exit status: 0 when every result matches, 1 when one does not, 2 on an error.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "client/cpp/kiln.h"

namespace {

using kiln::client::ConstBuffer;
using kiln::client::MutableBuffer;

// The graph, written as a client writes one: input 0 is x (f32 [rows, cols]); node 0 is a
// softmax over the last axis, value 1, the graph's output.
kiln::v1::Graph SoftmaxGraph(int64_t rows, int64_t cols) {
  kiln::v1::Graph g;
  kiln::v1::Input* x = g.add_inputs();
  x->set_name("x");
  x->mutable_type()->set_dtype(kiln::v1::F32);
  x->mutable_type()->add_shape(rows);
  x->mutable_type()->add_shape(cols);
  kiln::v1::Node* softmax = g.add_nodes();
  softmax->set_op("softmax");
  softmax->set_name("probs");
  softmax->add_inputs(0);
  (*softmax->mutable_attrs())["axis"].set_i(-1);
  g.add_outputs(1);
  return g;
}

std::vector<float> Reference(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> out(x.size());
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = &x[i * cols];
    const double m = *std::max_element(row, row + cols);
    double sum = 0;
    for (int64_t j = 0; j < cols; ++j) sum += std::exp(row[j] - m);
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = static_cast<float>(std::exp(row[j] - m) / sum);
  }
  return out;
}

// "cpu" (this machine's ISA level), "cpu:x86-64-v3", or "cuda:sm_90".
bool ParseTarget(const std::string& text, kiln::v1::Target* target) {
  if (text == "cpu") {
    *target = kiln::client::HostCpuTarget();
    return true;
  }
  if (text.rfind("cpu:", 0) == 0) {
    target->mutable_cpu()->set_isa(text.substr(4));
    return true;
  }
  int sm = 0;
  if (text.rfind("cuda:sm_", 0) == 0 && absl::SimpleAtoi(text.substr(8), &sm) && sm > 0) {
    *target = kiln::client::CudaTarget(sm);
    return true;
  }
  return false;
}

double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string server;
  std::string target_text = "cpu";
  int64_t rows = 256, cols = 300;
  int runs = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--server")
      server = value;
    else if (flag == "--target")
      target_text = value;
    else if (flag == "--rows")
      ok = absl::SimpleAtoi(value, &rows) && rows > 0;
    else if (flag == "--cols")
      ok = absl::SimpleAtoi(value, &cols) && cols > 0;
    else if (flag == "--runs")
      ok = absl::SimpleAtoi(value, &runs) && runs > 0;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr, "kiln_example: bad flag %s %s\n", flag.c_str(), value.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr,
                 "usage: kiln_example [--server ADDR] [--target cpu|cpu:ISA|cuda:sm_NN] "
                 "[--rows R] [--cols C] [--runs N]\n");
    return 2;
  }
  kiln::v1::Target target;
  if (!ParseTarget(target_text, &target)) {
    std::fprintf(stderr, "kiln_example: bad target %s\n", target_text.c_str());
    return 2;
  }

  kiln::client::SessionOptions options;
  options.client.address = server;  // empty: $KILN_SERVER, else localhost:50051
  absl::StatusOr<std::unique_ptr<kiln::client::Session>> session =
      kiln::client::Session::Create(options);
  if (!session.ok()) {
    std::fprintf(stderr, "kiln_example: %s\n", session.status().ToString().c_str());
    return 2;
  }

  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<kiln::client::LoadedKernel> kernel =
      (*session)->CompileAndLoad(SoftmaxGraph(rows, cols), target);
  const auto t1 = std::chrono::steady_clock::now();
  if (!kernel.ok()) {
    std::fprintf(stderr, "kiln_example: %s\n", kernel.status().ToString().c_str());
    return 2;
  }
  // Where the answer came from: kilnd (a compile or its cache), or this machine's answers,
  // which any earlier process of the machine, C++ or Python, left without asking kilnd.
  const char* answer = !kernel->cache_hit()             ? "compiled"
                       : (*session)->machine_hits() > 0 ? "cache hit (this machine's answer)"
                                                        : "cache hit";
  std::printf("%s  %s  %s in %.1f ms  handle %.12s\n", target_text.c_str(),
              kernel->is_cuda() ? "cuda" : "cpu", answer, Ms(t1 - t0), kernel->handle().c_str());

  std::mt19937 rng(12345);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> x(rows * cols);
  int failures = 0;
  for (int run = 0; run < runs; ++run) {
    for (float& v : x) v = dist(rng);
    const std::vector<float> want = Reference(x, rows, cols);
    std::vector<float> y(x.size(), std::nanf(""));  // poisoned: every element must be written
    const auto r0 = std::chrono::steady_clock::now();
    const absl::Status status = kernel->Run({ConstBuffer{x.data(), x.size() * sizeof(float)}},
                                            {MutableBuffer{y.data(), y.size() * sizeof(float)}});
    const auto r1 = std::chrono::steady_clock::now();
    if (!status.ok()) {
      std::fprintf(stderr, "kiln_example: %s\n", status.ToString().c_str());
      return 2;
    }
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double err = std::isfinite(y[i]) ? std::fabs(double{y[i]} - want[i]) : INFINITY;
      worst = std::max(worst, err);
    }
    const bool pass = worst <= 1e-5;
    failures += pass ? 0 : 1;
    std::printf("run %d  %lldx%lld  %.3f ms  max |error| %.2e  %s\n", run + 1,
                static_cast<long long>(rows), static_cast<long long>(cols), Ms(r1 - r0), worst,
                pass ? "PASS" : "FAIL");
  }
  return failures == 0 ? 0 : 1;
}
