// The gate arithmetic of the LLTM cell, one thread per (row, state) element.
#include <ATen/cuda/CUDAContext.h>
#include <torch/extension.h>

#include <vector>

namespace {

template <typename T>
__device__ __forceinline__ T Sigmoid(T z) {
  return T(1) / (T(1) + exp(-z));
}

template <typename T>
__device__ __forceinline__ T Elu(T z) {
  return z > T(0) ? z : exp(z) - T(1);
}

// gates: [batch, 3 * state] (input, output, candidate pre-activations); one element of the
// new state per thread.
template <typename T>
__global__ void ForwardKernel(const T* __restrict__ gates, const T* __restrict__ old_cell, T* __restrict__ new_h,
                              T* __restrict__ new_cell, T* __restrict__ input_gate, T* __restrict__ output_gate,
                              T* __restrict__ candidate_cell, int64_t batch, int64_t state) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * state) return;
  const int64_t row = i / state, col = i % state;
  const T* g = gates + row * 3 * state;
  const T in = Sigmoid(g[col]);
  const T out = Sigmoid(g[state + col]);
  const T cand = Elu(g[2 * state + col]);
  const T cell = old_cell[i] + cand * in;
  new_cell[i] = cell;
  new_h[i] = tanh(cell) * out;
  input_gate[i] = in;
  output_gate[i] = out;
  candidate_cell[i] = cand;
}

template <typename T>
__global__ void BackwardKernel(const T* __restrict__ grad_h, const T* __restrict__ grad_cell,
                               const T* __restrict__ new_cell, const T* __restrict__ input_gate,
                               const T* __restrict__ output_gate, const T* __restrict__ candidate_cell,
                               const T* __restrict__ gates, T* __restrict__ d_old_cell, T* __restrict__ d_gates,
                               int64_t batch, int64_t state) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= batch * state) return;
  const int64_t row = i / state, col = i % state;
  const T t = tanh(new_cell[i]);
  const T d_cell = (T(1) - t * t) * output_gate[i] * grad_h[i] + grad_cell[i];
  d_old_cell[i] = d_cell;
  const T in = input_gate[i], out = output_gate[i];
  const T z_cand = gates[row * 3 * state + 2 * state + col];
  T* dg = d_gates + row * 3 * state;
  dg[col] = candidate_cell[i] * d_cell * in * (T(1) - in);
  dg[state + col] = t * grad_h[i] * out * (T(1) - out);
  dg[2 * state + col] = in * d_cell * (z_cand > T(0) ? T(1) : exp(z_cand));
}

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

std::vector<torch::Tensor> LltmCudaForward(torch::Tensor input, torch::Tensor weights, torch::Tensor bias,
                                           torch::Tensor old_h, torch::Tensor old_cell) {
  torch::Tensor x = torch::cat({old_h, input}, /*dim=*/1);
  torch::Tensor gates = torch::addmm(bias, x, weights.transpose(0, 1));
  const int64_t batch = old_cell.size(0), state = old_cell.size(1);
  torch::Tensor new_h = torch::empty_like(old_cell);
  torch::Tensor new_cell = torch::empty_like(old_cell);
  torch::Tensor input_gate = torch::empty_like(old_cell);
  torch::Tensor output_gate = torch::empty_like(old_cell);
  torch::Tensor candidate_cell = torch::empty_like(old_cell);
  if (batch * state > 0) {
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lltm_forward", [&] {
      ForwardKernel<scalar_t><<<Blocks(batch * state), 256, 0, stream>>>(
          gates.data_ptr<scalar_t>(), old_cell.data_ptr<scalar_t>(), new_h.data_ptr<scalar_t>(),
          new_cell.data_ptr<scalar_t>(), input_gate.data_ptr<scalar_t>(), output_gate.data_ptr<scalar_t>(),
          candidate_cell.data_ptr<scalar_t>(), batch, state);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {new_h, new_cell, input_gate, output_gate, candidate_cell, x, gates};
}

std::vector<torch::Tensor> LltmCudaBackward(torch::Tensor grad_h, torch::Tensor grad_cell, torch::Tensor new_cell,
                                            torch::Tensor input_gate, torch::Tensor output_gate,
                                            torch::Tensor candidate_cell, torch::Tensor x,
                                            torch::Tensor gate_weights, torch::Tensor weights) {
  const int64_t batch = new_cell.size(0), state = new_cell.size(1);
  torch::Tensor d_old_cell = torch::empty_like(new_cell);
  torch::Tensor d_gates = torch::empty_like(gate_weights);
  if (batch * state > 0) {
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES(new_cell.scalar_type(), "lltm_backward", [&] {
      BackwardKernel<scalar_t><<<Blocks(batch * state), 256, 0, stream>>>(
          grad_h.data_ptr<scalar_t>(), grad_cell.data_ptr<scalar_t>(), new_cell.data_ptr<scalar_t>(),
          input_gate.data_ptr<scalar_t>(), output_gate.data_ptr<scalar_t>(), candidate_cell.data_ptr<scalar_t>(),
          gate_weights.data_ptr<scalar_t>(), d_old_cell.data_ptr<scalar_t>(), d_gates.data_ptr<scalar_t>(), batch,
          state);
    });
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  torch::Tensor d_weights = d_gates.transpose(0, 1).mm(x);
  torch::Tensor d_bias = d_gates.sum(/*dim=*/0);
  torch::Tensor d_x = d_gates.mm(weights);
  torch::Tensor d_old_h = d_x.slice(/*dim=*/1, 0, state);
  torch::Tensor d_input = d_x.slice(/*dim=*/1, state);
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}
