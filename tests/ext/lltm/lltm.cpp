// LLTM cell (a gated recurrent cell from PyTorch's extension tutorial), forward and backward
// written against ATen: the CPU extension kiln builds in its tests and benchmarks.
#include <torch/extension.h>

#include <vector>

namespace {

torch::Tensor SigmoidGrad(const torch::Tensor& z) {
  torch::Tensor s = torch::sigmoid(z);
  return s * (1 - s);
}

torch::Tensor TanhGrad(const torch::Tensor& z) { return 1 - torch::tanh(z).pow(2); }

// ELU with alpha 1: z for z > 0, exp(z) - 1 otherwise; its derivative is 1 or exp(z).
torch::Tensor EluGrad(const torch::Tensor& z) {
  return torch::where(z > 0, torch::ones_like(z), torch::exp(z));
}

}  // namespace

std::vector<torch::Tensor> Forward(torch::Tensor input, torch::Tensor weights, torch::Tensor bias,
                                   torch::Tensor old_h, torch::Tensor old_cell) {
  torch::Tensor x = torch::cat({old_h, input}, /*dim=*/1);
  torch::Tensor gate_weights = torch::addmm(bias, x, weights.transpose(0, 1));
  std::vector<torch::Tensor> gates = gate_weights.chunk(3, /*dim=*/1);
  torch::Tensor input_gate = torch::sigmoid(gates[0]);
  torch::Tensor output_gate = torch::sigmoid(gates[1]);
  torch::Tensor candidate_cell = torch::elu(gates[2], /*alpha=*/1.0);
  torch::Tensor new_cell = old_cell + candidate_cell * input_gate;
  torch::Tensor new_h = torch::tanh(new_cell) * output_gate;
  return {new_h, new_cell, input_gate, output_gate, candidate_cell, x, gate_weights};
}

std::vector<torch::Tensor> Backward(torch::Tensor grad_h, torch::Tensor grad_cell, torch::Tensor new_cell,
                                    torch::Tensor input_gate, torch::Tensor output_gate,
                                    torch::Tensor candidate_cell, torch::Tensor x,
                                    torch::Tensor gate_weights, torch::Tensor weights) {
  torch::Tensor d_output_gate = torch::tanh(new_cell) * grad_h;
  torch::Tensor d_new_cell = TanhGrad(new_cell) * (output_gate * grad_h) + grad_cell;
  torch::Tensor d_candidate_cell = input_gate * d_new_cell;
  torch::Tensor d_input_gate = candidate_cell * d_new_cell;

  std::vector<torch::Tensor> gates = gate_weights.chunk(3, /*dim=*/1);
  d_input_gate = d_input_gate * SigmoidGrad(gates[0]);
  d_output_gate = d_output_gate * SigmoidGrad(gates[1]);
  d_candidate_cell = d_candidate_cell * EluGrad(gates[2]);
  torch::Tensor d_gates = torch::cat({d_input_gate, d_output_gate, d_candidate_cell}, /*dim=*/1);

  torch::Tensor d_weights = d_gates.transpose(0, 1).mm(x);
  torch::Tensor d_bias = d_gates.sum(/*dim=*/0, /*keepdim=*/false);
  torch::Tensor d_x = d_gates.mm(weights);
  const int64_t state = grad_h.size(1);
  torch::Tensor d_old_h = d_x.slice(/*dim=*/1, 0, state);
  torch::Tensor d_input = d_x.slice(/*dim=*/1, state);
  return {d_old_h, d_input, d_weights, d_bias, d_new_cell};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &Forward, "LLTM forward");
  m.def("backward", &Backward, "LLTM backward");
}
