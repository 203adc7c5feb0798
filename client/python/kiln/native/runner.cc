// The native call path of kiln.torch parts: a PyTorch extension (built by kilnd like any other,
// see kiln/native/__init__.py) that runs a compiled part on torch tensors in one C++ call.
//
// Contract (the Python side, kiln/torch/runtime.py, relies on each point):
// - `make_part(...)` (arguments below) returns a Part, configured once per kiln part after its
//   kernels are loaded. Calling the Part with the part's input tensors, in order, either
//   returns a tuple of result tensors or returns None: None means "these arguments are not the
//   ones the part was configured for" (a dtype, shape, device, layout or alignment differs) and
//   nothing ran; the caller then takes its general path (layout copies, torch fallback). It
//   raises RuntimeError only when a kernel failed to launch or run.
// - Checks per input: a torch.Tensor of the configured dtype and device, of the configured
//   shape (symbolic parts: the shape at the sizes read from the inputs), with the configured
//   strides when configured with some (else any layout: the kernels get a contiguous copy of
//   an input that is not contiguous, or on CUDA not 16-byte aligned, as the Python path does).
//   Arguments past the configured inputs are ignored.
// - Outputs and the workspace come from torch's allocators (at::empty on the part's device):
//   on CUDA the caching allocator, on the current stream, like any torch op's outputs.
// - CPU: the artifact's `kiln_run` (its address, from the Python loader that opened the verified
//   .so) runs with the GIL released and at::get_num_threads() threads.
// - CUDA: the kernels run through the C++ client's CudaModule (client/core/cuda_loader.h), the
//   one loader and launcher the C++ client uses too, on the stream `stream_fn(device)` returns
//   (torch's current raw stream).
//
// - graph_key / storage_uses / detach_all: the per-argument work of a CUDA graph replay in
//   reduce-overhead mode (kiln/torch/cudagraphs.py's CudaGraphRunner), in one C++ pass each.
//
// Why native: a part called from Python cost 26-30 µs of host time on an H100 host (argument
// checks, one torch.empty per output at ~6 µs each, ctypes launches), against a few µs here.
#define PY_SSIZE_T_CLEAN  // y# formats take Py_ssize_t lengths
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <Python.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/core/cuda_loader.h"
#include "client/core/cuda_plan.h"

namespace {

using kiln::core::CudaModule;
using kiln::core::CudaPlan;
using kiln::core::CudaSizeExpr;

// ------------------------------------------------------------------ CudaModule objects

struct PyModule {
  PyObject_HEAD CudaModule* module;
};

void ModuleDealloc(PyObject* self) {
  delete reinterpret_cast<PyModule*>(self)->module;
  Py_TYPE(self)->tp_free(self);
}

// A static type with every slot zero but the few these types have.
PyTypeObject MakeType(const char* name, Py_ssize_t size, destructor dealloc, const char* doc) {
  PyTypeObject t{};
  Py_SET_REFCNT(reinterpret_cast<PyObject*>(&t), 1);
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_dealloc = dealloc;
  t.tp_doc = doc;
  return t;
}

PyTypeObject ModuleType =
    MakeType("kiln_native.CudaModule", sizeof(PyModule), ModuleDealloc,
             "A CUDA artifact loaded by the C++ client's loader in the current context.");

// cuda_load(cubin: bytes, ptx: bytes, plan_json: str) -> CudaModule
PyObject* CudaLoad(PyObject*, PyObject* args) {
  const char* cubin = nullptr;
  Py_ssize_t cubin_len = 0;
  const char* ptx = nullptr;
  Py_ssize_t ptx_len = 0;
  const char* json = nullptr;
  if (!PyArg_ParseTuple(args, "y#y#s", &cubin, &cubin_len, &ptx, &ptx_len, &json)) return nullptr;
  std::string error;
  CudaPlan plan;
  std::unique_ptr<CudaModule> m;
  bool parsed = false;
  // Without the GIL: a graph's parts load from several threads, and the driver's module load
  // is most of the time. The buffers belong to `args`, which the caller keeps alive.
  Py_BEGIN_ALLOW_THREADS parsed = kiln::core::ParseCudaPlan(json, &plan, &error);
  if (parsed) {
    m = CudaModule::Load(std::string_view(cubin, cubin_len), std::string_view(ptx, ptx_len),
                         std::move(plan), &error);
  }
  Py_END_ALLOW_THREADS if (!parsed) {
    PyErr_SetString(PyExc_ValueError, ("plan: " + error).c_str());
    return nullptr;
  }
  if (!m) {
    PyErr_SetString(PyExc_RuntimeError, error.c_str());
    return nullptr;
  }
  auto* obj = PyObject_New(PyModule, &ModuleType);
  if (!obj) return nullptr;
  obj->module = m.release();
  return reinterpret_cast<PyObject*>(obj);
}

// ------------------------------------------------------------------ parts

struct Operand {
  at::ScalarType dtype = at::kFloat;
  std::vector<CudaSizeExpr> shape;  // symbolic parts
  std::vector<int64_t> fixed;       // static parts
  std::vector<int64_t> strides;     // inputs: the accepted strides (with `exact_strides`)
  bool exact_strides = false;       // false: any contiguous tensor
  // Outputs of symbolic parts stored in a layout of their own: the kernel writes the shape in
  // memory order, and the result is that tensor viewed back through this permutation.
  std::vector<int64_t> unpermute;
};

using CpuRun1 = int (*)(void* const*, void*, int);
using CpuRun2 = int (*)(void* const*, const int64_t*, void*, int);
using CpuWorkspace = int64_t (*)(const int64_t*);

struct PyPart {
  PyObject_HEAD at::Device device;  // the CPU, or the CUDA device the kernels were loaded on
  std::vector<Operand> inputs;
  std::vector<Operand> outputs;
  std::vector<int> results;                  // output index per result
  std::vector<std::pair<int, int>> symbols;  // (input, axis) per symbol
  int64_t workspace_bytes;                   // static parts
  void* cpu_run;
  CpuWorkspace cpu_workspace;  // CPU symbolic parts
  PyObject* module_obj;        // CUDA: the PyModule (owned reference)
  PyObject* stream_fn;         // CUDA: callable(device index) -> CUstream
  PyObject* device_arg;        // CUDA: the device index as a Python int
  int64_t input_copies;        // inputs copied into a contiguous, aligned layout (see PartCall)
};

void PartDealloc(PyObject* self) {
  auto* p = reinterpret_cast<PyPart*>(self);
  Py_XDECREF(p->module_obj);
  Py_XDECREF(p->stream_fn);
  Py_XDECREF(p->device_arg);
  p->inputs.~vector();
  p->outputs.~vector();
  p->results.~vector();
  p->symbols.~vector();
  Py_TYPE(self)->tp_free(self);
}

bool ReadDtype(PyObject* obj, at::ScalarType* out) {
  if (!THPDtype_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected a torch.dtype");
    return false;
  }
  *out = reinterpret_cast<THPDtype*>(obj)->scalar_type;
  return true;
}

bool ReadInts(PyObject* seq, std::vector<int64_t>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(fast);
  return true;
}

// (dtype, [shape expression texts], strides or None[, unpermute]): the shape's expressions are
// parsed against `names` (a static part has none: every dimension is a number).
bool ReadOperand(PyObject* item, const std::vector<std::string>& names, Operand* out) {
  PyObject* dtype = nullptr;
  PyObject* shape = nullptr;
  PyObject* strides = Py_None;
  PyObject* unpermute = Py_None;
  if (!PyArg_ParseTuple(item, "OO|OO", &dtype, &shape, &strides, &unpermute)) return false;
  if (!ReadDtype(dtype, &out->dtype)) return false;
  PyObject* fast = PySequence_Fast(shape, "shape: expected a sequence of expressions");
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    const char* text = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
    if (!text) {
      Py_DECREF(fast);
      return false;
    }
    CudaSizeExpr e;
    std::string error;
    if (!kiln::core::ParseCudaSizeExpr(text, names, &e, &error)) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_ValueError,
                      ("shape expression '" + std::string(text) + "': " + error).c_str());
      return false;
    }
    if (names.empty()) out->fixed.push_back(e.Eval(nullptr));
    out->shape.push_back(std::move(e));
  }
  Py_DECREF(fast);
  if (strides != Py_None) {
    out->exact_strides = true;
    if (!ReadInts(strides, &out->strides)) return false;
  }
  if (unpermute != Py_None && !ReadInts(unpermute, &out->unpermute)) return false;
  return true;
}

// Whether `perm` is a permutation of 0..n-1.
bool IsPermutation(const std::vector<int64_t>& perm, size_t n) {
  std::vector<bool> seen(n, false);
  for (int64_t d : perm) {
    if (d < 0 || static_cast<size_t>(d) >= n || seen[d]) return false;
    seen[d] = true;
  }
  return perm.size() == n;
}

bool ReadOperands(PyObject* list, const std::vector<std::string>& names,
                  std::vector<Operand>* out) {
  PyObject* fast = PySequence_Fast(list, "expected a sequence of operands");
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    Operand op;
    if (!ReadOperand(PySequence_Fast_GET_ITEM(fast, i), names, &op)) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(std::move(op));
  }
  Py_DECREF(fast);
  return true;
}

PyTypeObject PartType =
    MakeType("kiln_native.Part", sizeof(PyPart), PartDealloc,
             "A kiln part's kernels with everything a call needs prepared (see runner.cc).");

// make_part(device_index, runner, stream_fn, symbols, symbol_names, inputs, outputs, results,
//           workspace_bytes)
// device_index: -1 for the CPU. runner: a CudaModule (CUDA), or (kiln_run address,
// kiln_workspace_bytes address or 0) for a CPU artifact (ABI 2 when the part has symbols).
// symbols: [(input, axis)]; inputs: [(dtype, [expr], strides or None)]; outputs: [(dtype,
// [expr]), (dtype, [expr], strides) or (dtype, [expr], None, unpermute)] (strides: static parts,
// a dense layout that the output is allocated in; unpermute: symbolic parts, the view of the
// plan's output that is the result); results: the output index of each result.
PyObject* MakePart(PyObject*, PyObject* args) {
  int device_index = -1;
  PyObject *runner, *stream_fn, *symbols, *names_obj, *inputs, *outputs, *results;
  long long workspace_bytes = 0;
  if (!PyArg_ParseTuple(args, "iOOOOOOOL", &device_index, &runner, &stream_fn, &symbols, &names_obj,
                        &inputs, &outputs, &results, &workspace_bytes))
    return nullptr;
  auto* p = PyObject_New(PyPart, &PartType);
  if (!p) return nullptr;
  new (&p->device) at::Device(
      device_index >= 0 ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index))
                        : at::Device(at::kCPU));
  new (&p->inputs) std::vector<Operand>();
  new (&p->outputs) std::vector<Operand>();
  new (&p->results) std::vector<int>();
  new (&p->symbols) std::vector<std::pair<int, int>>();
  p->workspace_bytes = workspace_bytes;
  p->cpu_run = nullptr;
  p->cpu_workspace = nullptr;
  p->module_obj = nullptr;
  p->stream_fn = nullptr;
  p->device_arg = nullptr;
  p->input_copies = 0;
  PyObject* self = reinterpret_cast<PyObject*>(p);
  std::vector<std::string> names;
  PyObject* fast = PySequence_Fast(names_obj, "symbol_names: expected a sequence of str");
  if (!fast) {
    Py_DECREF(self);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    const char* n = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
    if (!n) {
      Py_DECREF(fast);
      Py_DECREF(self);
      return nullptr;
    }
    names.emplace_back(n);
  }
  Py_DECREF(fast);
  std::vector<int64_t> flat, res;
  if (!ReadInts(symbols, &flat) || flat.size() != 2 * names.size() ||
      !ReadOperands(inputs, names, &p->inputs) || !ReadOperands(outputs, names, &p->outputs) ||
      !ReadInts(results, &res)) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "symbols: expected (input, axis) pairs, one per name");
    Py_DECREF(self);
    return nullptr;
  }
  for (size_t k = 0; k < names.size(); ++k) {
    const int in = static_cast<int>(flat[2 * k]), axis = static_cast<int>(flat[2 * k + 1]);
    if (in < 0 || static_cast<size_t>(in) >= p->inputs.size() || axis < 0 ||
        static_cast<size_t>(axis) >= p->inputs[in].shape.size()) {
      PyErr_SetString(PyExc_ValueError, "a symbol names no input dimension");
      Py_DECREF(self);
      return nullptr;
    }
    p->symbols.emplace_back(in, axis);
  }
  for (const Operand& o : p->outputs) {
    if (o.exact_strides && (!names.empty() || o.strides.size() != o.fixed.size())) {
      PyErr_SetString(PyExc_ValueError, "output strides: static parts only, one per dimension");
      Py_DECREF(self);
      return nullptr;
    }
    if (!o.unpermute.empty() && (names.empty() || !IsPermutation(o.unpermute, o.shape.size()))) {
      PyErr_SetString(PyExc_ValueError,
                      "output unpermute: symbolic parts only, a permutation of its dimensions");
      Py_DECREF(self);
      return nullptr;
    }
  }
  for (int64_t r : res) {
    if (r < 0 || static_cast<size_t>(r) >= p->outputs.size()) {
      PyErr_SetString(PyExc_ValueError, "a result names no output");
      Py_DECREF(self);
      return nullptr;
    }
    p->results.push_back(static_cast<int>(r));
  }
  if (p->device.is_cuda()) {
    if (!PyObject_TypeCheck(runner, &ModuleType) || !PyCallable_Check(stream_fn)) {
      PyErr_SetString(PyExc_TypeError, "a CUDA part takes a CudaModule and a stream function");
      Py_DECREF(self);
      return nullptr;
    }
    const CudaPlan& plan = reinterpret_cast<PyModule*>(runner)->module->plan();
    if (plan.num_inputs() != static_cast<int>(p->inputs.size()) ||
        plan.num_outputs() != static_cast<int>(p->outputs.size()) ||
        plan.symbols.size() != names.size()) {
      PyErr_SetString(PyExc_ValueError, "the module's plan does not match the part's operands");
      Py_DECREF(self);
      return nullptr;
    }
    Py_INCREF(runner);
    p->module_obj = runner;
    Py_INCREF(stream_fn);
    p->stream_fn = stream_fn;
    p->device_arg = PyLong_FromLong(device_index);
  } else {
    unsigned long long run = 0, ws = 0;
    if (!PyArg_ParseTuple(runner, "KK", &run, &ws)) {
      Py_DECREF(self);
      return nullptr;
    }
    if (!run || (!names.empty() && !ws)) {
      PyErr_SetString(
          PyExc_ValueError,
          "a CPU part takes kiln_run's address (and kiln_workspace_bytes' for symbols)");
      Py_DECREF(self);
      return nullptr;
    }
    p->cpu_run = reinterpret_cast<void*>(run);
    p->cpu_workspace = reinterpret_cast<CpuWorkspace>(ws);
  }
  return self;
}

// Part.accept_strides(i, strides): input i is taken with these strides from now on (the caller
// found them equivalent to the compiled layout).
PyObject* PartAcceptStrides(PyObject* self, PyObject* args) {
  auto* p = reinterpret_cast<PyPart*>(self);
  int i = 0;
  PyObject* strides = nullptr;
  if (!PyArg_ParseTuple(args, "iO", &i, &strides)) return nullptr;
  if (i < 0 || static_cast<size_t>(i) >= p->inputs.size()) {
    PyErr_SetString(PyExc_IndexError, "no such input");
    return nullptr;
  }
  std::vector<int64_t> v;
  if (!ReadInts(strides, &v)) return nullptr;
  p->inputs[i].strides = std::move(v);
  p->inputs[i].exact_strides = true;
  Py_RETURN_NONE;
}

PyObject* PartInputCopies(PyObject* self, PyObject*) {
  return PyLong_FromLongLong(reinterpret_cast<PyPart*>(self)->input_copies);
}

PyMethodDef PartMethods[] = {
    {"accept_strides", PartAcceptStrides, METH_VARARGS, "Accepts input i with these strides."},
    {"input_copies", PartInputCopies, METH_NOARGS, "Inputs this part copied so far."},
    {nullptr, nullptr, 0, nullptr},
};

std::vector<int64_t> Dims(const Operand& op, const std::vector<int64_t>& sizes) {
  if (op.shape.empty() || sizes.empty()) return op.fixed;
  std::vector<int64_t> dims;
  dims.reserve(op.shape.size());
  for (const CudaSizeExpr& e : op.shape) dims.push_back(e.Eval(sizes.data()));
  return dims;
}

PyObject* PartCall(PyObject* self, PyObject* args, PyObject* kwargs) {
  auto* p = reinterpret_cast<PyPart*>(self);
  if (kwargs && PyDict_Size(kwargs) > 0) Py_RETURN_NONE;
  // Trailing arguments past the part's inputs (sizes the graph passes for the torch path)
  // are not the kernels' business: the sizes come from the tensors.
  const size_t n = p->inputs.size();
  if (static_cast<size_t>(PyTuple_GET_SIZE(args)) < n) Py_RETURN_NONE;
  try {
    std::vector<const at::Tensor*> tensors(n);
    for (size_t i = 0; i < n; ++i) {
      PyObject* obj = PyTuple_GET_ITEM(args, i);
      if (!THPVariable_Check(obj)) Py_RETURN_NONE;
      tensors[i] = &THPVariable_Unpack(obj);
    }
    std::vector<int64_t> sizes;
    sizes.reserve(p->symbols.size());
    for (const auto& [in, axis] : p->symbols) {
      const at::Tensor& t = *tensors[in];
      if (t.dim() <= axis) Py_RETURN_NONE;
      sizes.push_back(t.size(axis));
    }
    std::vector<void*> buffers;
    buffers.reserve(n + p->outputs.size());
    std::vector<at::Tensor> copies;  // contiguous copies of inputs in other layouts
    copies.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor* t = tensors[i];
      const Operand& want = p->inputs[i];
      if (t->scalar_type() != want.dtype || t->device() != p->device) Py_RETURN_NONE;
      if (p->symbols.empty()) {
        if (t->sizes() != at::IntArrayRef(want.fixed)) Py_RETURN_NONE;
      } else if (t->sizes() != at::IntArrayRef(Dims(want, sizes))) {
        Py_RETURN_NONE;
      }
      if (want.exact_strides && p->symbols.empty()) {
        // A declared layout (a slice of a wider tensor, say): other strides need the Python
        // path, which knows which layouts are equivalent and how to copy into the declared one.
        if (t->strides() != at::IntArrayRef(want.strides)) Py_RETURN_NONE;
      } else if (!t->is_contiguous() ||
                 (p->device.is_cuda() && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16)) {
        // A broadcast gradient (stride 0), a transposed view, a misaligned slice: the kernels
        // read a contiguous, 16-byte aligned copy (CUDA kernels use 16-byte vector loads).
        copies.push_back(t->clone(at::MemoryFormat::Contiguous));
        t = &copies.back();
        ++p->input_copies;  // the GIL is held: a plain count will do
      }
      void* ptr = t->data_ptr();
      if (p->device.is_cuda() && reinterpret_cast<uintptr_t>(ptr) % 16) Py_RETURN_NONE;
      buffers.push_back(ptr);
    }
    std::vector<at::Tensor> outs;
    outs.reserve(p->outputs.size());
    for (const Operand& o : p->outputs) {
      const auto options = at::TensorOptions().dtype(o.dtype).device(p->device);
      // An output with strides (static parts): a dense layout the kernel stores in memory order.
      outs.push_back(o.exact_strides ? at::empty_strided(o.fixed, o.strides, options)
                                     : at::empty(Dims(o, sizes), options));
      buffers.push_back(outs.back().data_ptr());
      if (!o.unpermute.empty()) outs.back() = outs.back().permute(o.unpermute);
    }
    int64_t ws_bytes = p->workspace_bytes;
    std::string error;
    CudaModule* module =
        p->device.is_cuda() ? reinterpret_cast<PyModule*>(p->module_obj)->module : nullptr;
    if (!sizes.empty()) {
      ws_bytes = module ? module->WorkspaceBytes(sizes.data(), sizes.size(), &error)
                        : p->cpu_workspace(sizes.data());
      if (ws_bytes < 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        error.empty() ? "the kernels cannot run at these sizes" : error.c_str());
        return nullptr;
      }
    }
    at::Tensor ws;
    void* ws_ptr = nullptr;
    if (ws_bytes > 0) {
      ws = at::empty({ws_bytes}, at::TensorOptions().dtype(at::kByte).device(p->device));
      ws_ptr = ws.data_ptr();
    }
    if (module) {
      PyObject* stream_obj = PyObject_CallOneArg(p->stream_fn, p->device_arg);
      if (!stream_obj) return nullptr;
      void* stream = PyLong_AsVoidPtr(stream_obj);
      Py_DECREF(stream_obj);
      if (PyErr_Occurred()) return nullptr;
      if (!module->RunSized(buffers.data(), ws_ptr, stream, sizes.data(), sizes.size(), &error)) {
        PyErr_SetString(PyExc_RuntimeError, error.c_str());
        return nullptr;
      }
    } else {
      const int threads = at::get_num_threads();
      int rc = 0;
      Py_BEGIN_ALLOW_THREADS rc =
          sizes.empty() ? reinterpret_cast<CpuRun1>(p->cpu_run)(buffers.data(), ws_ptr, threads)
                        : reinterpret_cast<CpuRun2>(p->cpu_run)(buffers.data(), sizes.data(),
                                                                ws_ptr, threads);
      Py_END_ALLOW_THREADS if (rc != 0) {
        PyErr_SetString(PyExc_RuntimeError, ("kiln_run returned " + std::to_string(rc)).c_str());
        return nullptr;
      }
    }
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(p->results.size()));
    if (!tuple) return nullptr;
    for (size_t r = 0; r < p->results.size(); ++r) {
      PyObject* t = THPVariable_Wrap(outs[p->results[r]]);
      if (!t) {
        Py_DECREF(tuple);
        return nullptr;
      }
      PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(r), t);
    }
    return tuple;
  } catch (
      const std::exception& e) {  // c10::Error from the allocator (out of memory), and the like
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// ------------------------------------------------------------------ CUDA graph replays
//
// What CudaGraphRunner (kiln/torch/cudagraphs.py) does per call for every argument of a compiled
// graph (a BERT step passes ~200: the parameters and the inputs), done in one C++ pass: the
// Python loop over shapes, strides and devices cost ~0.5 ms per call.

// graph_key(args) -> (key: bytes, data pointers: tuple) or None when an argument is not a
// CUDA tensor. Equal keys mean equal dtypes, devices, shapes and strides, argument by argument.
PyObject* GraphKey(PyObject*, PyObject* seq) {
  PyObject* fast = PySequence_Fast(seq, "graph_key: expected a sequence");
  if (!fast) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  std::vector<int64_t> key;
  key.reserve(static_cast<size_t>(n) * 10);
  PyObject* ptrs = PyTuple_New(n);
  if (!ptrs) {
    Py_DECREF(fast);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj = PySequence_Fast_GET_ITEM(fast, i);
    if (!THPVariable_Check(obj) || !THPVariable_Unpack(obj).is_cuda()) {
      Py_DECREF(ptrs);
      Py_DECREF(fast);
      Py_RETURN_NONE;
    }
    const at::Tensor& t = THPVariable_Unpack(obj);
    key.push_back(static_cast<int64_t>(t.scalar_type()) << 32 |
                  static_cast<int64_t>(t.get_device()) << 8 | t.dim());
    for (int64_t d : t.sizes()) key.push_back(d);
    for (int64_t st : t.strides()) key.push_back(st);
    PyObject* p = PyLong_FromVoidPtr(t.data_ptr());
    if (!p) {
      Py_DECREF(ptrs);
      Py_DECREF(fast);
      return nullptr;
    }
    PyTuple_SET_ITEM(ptrs, i, p);
  }
  Py_DECREF(fast);
  PyObject* bytes =
      PyBytes_FromStringAndSize(reinterpret_cast<const char*>(key.data()),
                                static_cast<Py_ssize_t>(key.size() * sizeof(int64_t)));
  if (!bytes) {
    Py_DECREF(ptrs);
    return nullptr;
  }
  PyObject* out = PyTuple_Pack(2, bytes, ptrs);
  Py_DECREF(bytes);
  Py_DECREF(ptrs);
  return out;
}

// A new list with item(x) for each x of `seq` (item returns a new reference, or null with a
// Python error set); null and an error when any item fails.
template <typename Item>
PyObject* MapToList(PyObject* seq, const char* what, Item item) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (!fast) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject* out = PyList_New(n);
  try {
    for (Py_ssize_t i = 0; out && i < n; ++i) {
      PyObject* v = item(PySequence_Fast_GET_ITEM(fast, i));
      if (!v) {
        Py_CLEAR(out);
        break;
      }
      PyList_SET_ITEM(out, i, v);
    }
  } catch (const std::exception& e) {  // c10::Error and the like
    Py_CLEAR(out);
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(fast);
  return out;
}

// storage_uses(tensors) -> list of ints: how many references each tensor's storage has (the
// tensors themselves and every view of them).
PyObject* StorageUses(PyObject*, PyObject* seq) {
  return MapToList(seq, "storage_uses: expected a sequence of tensors",
                   [](PyObject* obj) -> PyObject* {
                     if (!THPVariable_Check(obj)) {
                       PyErr_SetString(PyExc_TypeError, "storage_uses: expected tensors");
                       return nullptr;
                     }
                     const at::Tensor& t = THPVariable_Unpack(obj);
                     return PyLong_FromSize_t(t.has_storage() ? t.storage().use_count() : 0);
                   });
}

// detach_all(values) -> list: each tensor as a new tensor object over the same memory, without
// autograd history; other values as they are.
PyObject* DetachAll(PyObject*, PyObject* seq) {
  return MapToList(seq, "detach_all: expected a sequence", [](PyObject* obj) -> PyObject* {
    if (THPVariable_Check(obj)) return THPVariable_Wrap(THPVariable_Unpack(obj).detach());
    Py_INCREF(obj);
    return obj;
  });
}

PyMethodDef ModuleMethods[] = {
    {"cuda_load", CudaLoad, METH_VARARGS, "cuda_load(cubin, ptx, plan_json) -> CudaModule"},
    {"make_part", MakePart, METH_VARARGS, "make_part(...) -> Part (see runner.cc)"},
    {"graph_key", GraphKey, METH_O, "graph_key(args) -> (bytes, pointers) or None"},
    {"storage_uses", StorageUses, METH_O, "storage_uses(tensors) -> list of use counts"},
    {"detach_all", DetachAll, METH_O, "detach_all(values) -> list"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef ModuleDef = [] {
  PyModuleDef d{};
  d.m_base = PyModuleDef_HEAD_INIT;
  d.m_doc = "kiln.torch's native part runner";
  d.m_size = -1;
  d.m_methods = ModuleMethods;
  return d;
}();

}  // namespace

#define KILN_PASTE2(a, b) a##b
#define KILN_PASTE(a, b) KILN_PASTE2(a, b)
#define KILN_STR2(a) #a
#define KILN_STR(a) KILN_STR2(a)

PyMODINIT_FUNC KILN_PASTE(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PartType.tp_call = PartCall;
  PartType.tp_methods = PartMethods;
  if (PyType_Ready(&ModuleType) < 0 || PyType_Ready(&PartType) < 0) return nullptr;
  ModuleDef.m_name = KILN_STR(TORCH_EXTENSION_NAME);
  return PyModule_Create(&ModuleDef);
}
