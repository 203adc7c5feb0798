// LLTM cell on CUDA: the matrix products through ATen, the gate arithmetic in the kernels of
// lltm_cuda_kernel.cu. Bindings and argument checks.
#include <torch/extension.h>

#include <vector>

std::vector<torch::Tensor> LltmCudaForward(torch::Tensor input, torch::Tensor weights, torch::Tensor bias,
                                           torch::Tensor old_h, torch::Tensor old_cell);
std::vector<torch::Tensor> LltmCudaBackward(torch::Tensor grad_h, torch::Tensor grad_cell, torch::Tensor new_cell,
                                            torch::Tensor input_gate, torch::Tensor output_gate,
                                            torch::Tensor candidate_cell, torch::Tensor x,
                                            torch::Tensor gate_weights, torch::Tensor weights);

namespace {

void Check(const torch::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_cuda(), what, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), what, " must be contiguous");
}

}  // namespace

std::vector<torch::Tensor> Forward(torch::Tensor input, torch::Tensor weights, torch::Tensor bias,
                                   torch::Tensor old_h, torch::Tensor old_cell) {
  Check(input, "input");
  Check(weights, "weights");
  Check(bias, "bias");
  Check(old_h, "old_h");
  Check(old_cell, "old_cell");
  return LltmCudaForward(input, weights, bias, old_h, old_cell);
}

std::vector<torch::Tensor> Backward(torch::Tensor grad_h, torch::Tensor grad_cell, torch::Tensor new_cell,
                                    torch::Tensor input_gate, torch::Tensor output_gate,
                                    torch::Tensor candidate_cell, torch::Tensor x, torch::Tensor gate_weights,
                                    torch::Tensor weights) {
  for (auto [t, what] : {std::pair{&grad_h, "grad_h"}, {&grad_cell, "grad_cell"}, {&new_cell, "new_cell"},
                         {&input_gate, "input_gate"}, {&output_gate, "output_gate"},
                         {&candidate_cell, "candidate_cell"}, {&x, "x"}, {&gate_weights, "gate_weights"},
                         {&weights, "weights"}}) {
    *t = t->contiguous();
    Check(*t, what);
  }
  return LltmCudaBackward(grad_h, grad_cell, new_cell, input_gate, output_gate, candidate_cell, x, gate_weights,
                          weights);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &Forward, "LLTM forward (CUDA)");
  m.def("backward", &Backward, "LLTM backward (CUDA)");
}
