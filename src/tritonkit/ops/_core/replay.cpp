// Replays a recorded tritonkit operator call from C++: the allocations, views, zero fills and
// Triton kernel launches one call of an operator made, for a later call whose inputs have the
// same metadata (see replay.py). The forward runs as a C++ autograd Function, so its backward
// runs on the autograd engine's device thread without any Python.
//
// Built on first use by torch.utils.cpp_extension with only PyTorch's headers: the CUDA driver
// is reached through dlopen (cuLaunchKernel), the current stream through c10's device-generic
// guard interface, so nothing here needs the CUDA toolkit.

#include <dlfcn.h>

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// Kernel parameter kinds, as Triton's launcher passes them (triton/backends/nvidia/driver.py):
// pointers as 64-bit device addresses, integers at their width, floats packed to their width.
enum Kind : int8_t {
  PTR = 0,
  I8 = 1,
  I16 = 2,
  I32 = 3,
  I64 = 4,
  F16 = 5,  // the value arrives packed (uint16)
  F32 = 6,  // packed (uint32)
  F64 = 7,
  NULLPTR = 8,  // Triton's scratch pointers when the kernel needs none
};

struct Arg {
  int8_t kind;
  int32_t slot;  // PTR: the tensor slot; others: unused
  int64_t offset;  // PTR: bytes past the slot's data pointer
  uint64_t bits;  // the value's bits, for immediates
};

enum StepType : int8_t { ALLOC = 0, VIEW = 1, ZERO = 2, LAUNCH = 3, CONTIG = 4 };

struct Step {
  int8_t type;
  int32_t slot;  // ALLOC/VIEW/CONTIG: the slot written; ZERO: the slot zeroed
  // ALLOC / VIEW
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype = at::kFloat;
  int32_t base = -1;  // VIEW, CONTIG: the slot viewed or made contiguous
  int64_t offset = 0;  // VIEW: elements past the base's storage offset
  // LAUNCH
  uint64_t function = 0;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block = 128;
  uint32_t shared = 0;
  std::vector<Arg> args;
};

struct Program {
  int32_t n_slots = 0;
  std::vector<Step> steps;
};

using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);

LaunchFn driver_launch() {
  static LaunchFn fn = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) return static_cast<LaunchFn>(nullptr);
    return reinterpret_cast<LaunchFn>(dlsym(lib, "cuLaunchKernel"));
  }();
  return fn;
}

// Tests on machines without a GPU replace the driver call by a Python callable that receives
// (function, grid, block, shared, [(kind, value)]) for every launch.
py::object& test_launcher() {
  static auto* fn = new py::object();  // never destroyed: no Python object dies after Python
  return *fn;
}

// Checks set this: every allocation a replay makes is filled with NaN (or a sentinel for
// integers) first, so that an element the recorded kernels fail to write cannot pass.
bool& poison() {
  static bool on = false;
  return on;
}

void fill_poison(at::Tensor& t) {
  if (t.numel() == 0) return;
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) {
    t.fill_(std::numeric_limits<double>::quiet_NaN());
  } else if (t.scalar_type() == at::kBool) {
    t.fill_(true);
  } else {
    t.fill_(at::isSignedType(t.scalar_type()) ? -7777 : 77);
  }
}

struct Plan {
  Program fwd, bwd;
  int32_t n_inputs = 0;
  std::vector<int32_t> outputs;  // forward slots returned
  std::vector<bool> differentiable;  // per output
  std::vector<int32_t> saved;  // forward slots the backward starts from
  std::vector<int32_t> grad_slots;  // per input: the backward slot holding its gradient, or -1
  std::vector<bool> grad_used;  // per output: whether the backward program reads its gradient
  bool has_backward = false;
  int64_t runs = 0;
};

void launch(const Step& s, const std::vector<at::Tensor>& slots, c10::Device device) {
  // One 16-byte cell per parameter (the widest kind is 8 bytes).
  std::vector<uint64_t> cells(s.args.size() * 2, 0);
  std::vector<void*> params(s.args.size());
  for (size_t i = 0; i < s.args.size(); ++i) {
    const Arg& a = s.args[i];
    uint64_t* cell = &cells[2 * i];
    if (a.kind == PTR) {
      const at::Tensor& t = slots[a.slot];
      *cell = reinterpret_cast<uint64_t>(static_cast<char*>(t.data_ptr()) + a.offset);
    } else {
      *cell = a.bits;  // little-endian: the low bytes hold the narrower kinds' value
    }
    params[i] = cell;
  }
  if (s.grid[0] == 0 || s.grid[1] == 0 || s.grid[2] == 0) return;
  py::object& fake = test_launcher();
  if (fake && !fake.is_none()) {
    py::gil_scoped_acquire gil;
    py::list args;
    for (size_t i = 0; i < s.args.size(); ++i) {
      args.append(py::make_tuple(static_cast<int>(s.args[i].kind), cells[2 * i]));
    }
    fake(s.function, py::make_tuple(s.grid[0], s.grid[1], s.grid[2]), s.block, s.shared, args);
    return;
  }
  LaunchFn fn = driver_launch();
  TORCH_CHECK(fn != nullptr, "tritonkit replay: cannot load cuLaunchKernel from libcuda.so.1");
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  void* stream = impl->getStream(device).native_handle();
  int err = fn(reinterpret_cast<void*>(s.function), s.grid[0], s.grid[1], s.grid[2], s.block, 1, 1,
               s.shared, stream, params.data(), nullptr);
  TORCH_CHECK(err == 0, "tritonkit replay: cuLaunchKernel failed with CUDA error ", err);
}

// Runs a program over slots whose first entries the caller filled.
void run(const Program& p, std::vector<at::Tensor>& slots, c10::Device device) {
  slots.resize(p.n_slots);
  for (const Step& s : p.steps) {
    switch (s.type) {
      case ALLOC:
        slots[s.slot] = at::empty_strided(s.sizes, s.strides,
                                          at::TensorOptions().dtype(s.dtype).device(device));
        if (poison()) fill_poison(slots[s.slot]);
        break;
      case VIEW: {
        const at::Tensor& b = slots[s.base];
        slots[s.slot] = b.as_strided(s.sizes, s.strides, b.storage_offset() + s.offset);
        break;
      }
      case ZERO:
        slots[s.slot].zero_();
        break;
      case CONTIG:
        slots[s.slot] = slots[s.base].contiguous();
        break;
      case LAUNCH:
        launch(s, slots, device);
        break;
    }
  }
}

c10::Device device_of(const std::vector<at::Tensor>& inputs) {
  for (const auto& t : inputs) {
    if (t.defined()) return t.device();
  }
  return c10::Device(c10::kCPU);
}

std::vector<at::Tensor> gather(const std::vector<at::Tensor>& slots,
                               const std::vector<int32_t>& which) {
  std::vector<at::Tensor> out;
  out.reserve(which.size());
  for (int32_t i : which) out.push_back(slots[i]);
  return out;
}

// The autograd node's own reference to its plan: the plan cache may forget or evict the plan
// (plan.PLANS.reset, an eviction, another thread) while this node's backward is still to run.
struct PlanRef : torch::CustomClassHolder {
  explicit PlanRef(std::shared_ptr<Plan> p) : plan(std::move(p)) {}
  std::shared_ptr<Plan> plan;
};

struct PlanFunction : public torch::autograd::Function<PlanFunction> {
  static variable_list forward(AutogradContext* ctx, std::shared_ptr<Plan> owned,
                               at::TensorList inputs) {
    Plan* plan = owned.get();
    std::vector<at::Tensor> slots(inputs.begin(), inputs.end());
    c10::Device device = device_of(slots);
    run(plan->fwd, slots, device);
    auto outputs = gather(slots, plan->outputs);
    std::vector<at::Tensor> nondiff;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!plan->differentiable[i]) nondiff.push_back(outputs[i]);
    }
    if (!nondiff.empty()) ctx->mark_non_differentiable(nondiff);
    // Undefined gradients stay undefined (no zero fill for the non-differentiable outputs);
    // backward makes zeros only for one the recorded program reads.
    ctx->set_materialize_grads(false);
    std::vector<at::Tensor> saved = gather(slots, plan->saved);
    if (plan->has_backward) {
      for (size_t i = 0; i < outputs.size(); ++i) {
        if (plan->grad_used[i]) saved.push_back(outputs[i]);  // the shape of a missing grad
      }
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["plan"] = c10::IValue::make_capsule(c10::make_intrusive<PlanRef>(owned));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<PlanRef>(ctx->saved_data["plan"].toCapsule());
    Plan* plan = ref->plan.get();
    std::vector<at::Tensor> slots = ctx->get_saved_variables();
    c10::Device device = slots.empty() ? device_of(grads) : device_of(slots);
    size_t n_saved = plan->saved.size();
    std::vector<at::Tensor> like(slots.begin() + n_saved, slots.end());
    slots.resize(n_saved);
    // The recording saw each gradient in its output's layout (replay.py's grad_format, the
    // same rule): channels_last where the output is, else contiguous. Keep that layout.
    size_t k = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      at::Tensor g = grads[i];
      if (plan->grad_used[i]) {
        const at::Tensor& out = like[k++];
        at::MemoryFormat format =
            out.dim() == 4 && !out.is_contiguous() &&
                    out.is_contiguous(at::MemoryFormat::ChannelsLast)
                ? at::MemoryFormat::ChannelsLast
                : at::MemoryFormat::Contiguous;
        g = g.defined() ? g.contiguous(format) : at::zeros_like(out, format);
      }
      slots.push_back(g);
    }
    run(plan->bwd, slots, device);
    variable_list result(1 + plan->n_inputs);  // the plan argument's gradient first: none
    for (int32_t i = 0; i < plan->n_inputs; ++i) {
      int32_t s = plan->grad_slots[i];
      if (s >= 0) result[1 + i] = slots[s];
    }
    return result;
  }
};

Program parse_program(int32_t n_slots, const py::list& steps) {
  Program p;
  p.n_slots = n_slots;
  for (const auto& item : steps) {
    py::tuple t = item.cast<py::tuple>();
    Step s;
    s.type = static_cast<int8_t>(t[0].cast<int>());
    s.slot = t[1].cast<int32_t>();
    switch (s.type) {
      case ALLOC:
        s.sizes = t[2].cast<std::vector<int64_t>>();
        s.strides = t[3].cast<std::vector<int64_t>>();
        s.dtype = t[4].cast<at::Tensor>().scalar_type();
        break;
      case VIEW:
        s.base = t[2].cast<int32_t>();
        s.sizes = t[3].cast<std::vector<int64_t>>();
        s.strides = t[4].cast<std::vector<int64_t>>();
        s.offset = t[5].cast<int64_t>();
        break;
      case ZERO:
        break;
      case CONTIG:
        s.base = t[2].cast<int32_t>();
        break;
      case LAUNCH: {
        s.function = t[2].cast<uint64_t>();
        auto grid = t[3].cast<std::vector<uint32_t>>();
        for (size_t i = 0; i < 3 && i < grid.size(); ++i) s.grid[i] = grid[i];
        s.block = t[4].cast<uint32_t>();
        s.shared = t[5].cast<uint32_t>();
        for (const auto& a : t[6].cast<py::list>()) {
          py::tuple at = a.cast<py::tuple>();
          Arg arg;
          arg.kind = static_cast<int8_t>(at[0].cast<int>());
          arg.slot = at[1].cast<int32_t>();
          arg.offset = at[2].cast<int64_t>();
          arg.bits = at[3].cast<uint64_t>();
          s.args.push_back(arg);
        }
        break;
      }
      default:
        TORCH_CHECK(false, "tritonkit replay: unknown step type ", static_cast<int>(s.type));
    }
    p.steps.push_back(std::move(s));
  }
  return p;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Plan, std::shared_ptr<Plan>>(m, "Plan")
      .def_readonly("runs", &Plan::runs)
      .def_readonly("has_backward", &Plan::has_backward);

  m.def(
      "make_plan",
      [](int32_t n_inputs, int32_t fwd_slots, py::list fwd_steps, std::vector<int32_t> outputs,
         std::vector<bool> differentiable, std::vector<int32_t> saved, bool has_backward,
         int32_t bwd_slots, py::list bwd_steps, std::vector<int32_t> grad_slots,
         std::vector<bool> grad_used) {
        auto plan = std::make_shared<Plan>();
        plan->n_inputs = n_inputs;
        plan->fwd = parse_program(fwd_slots, fwd_steps);
        plan->outputs = std::move(outputs);
        plan->differentiable = std::move(differentiable);
        plan->saved = std::move(saved);
        plan->has_backward = has_backward;
        if (has_backward) {
          plan->bwd = parse_program(bwd_slots, bwd_steps);
          plan->grad_slots = std::move(grad_slots);
          plan->grad_used = std::move(grad_used);
        }
        return plan;
      });

  // Runs the plan on inputs; with grad, as an autograd Function whose backward replays the
  // recorded backward.
  m.def("run", [](const std::shared_ptr<Plan>& plan, std::vector<at::Tensor> inputs, bool grad) {
    plan->runs += 1;
    if (grad) {
      return PlanFunction::apply(plan, at::TensorList(inputs));
    }
    std::vector<at::Tensor> slots(std::move(inputs));
    c10::Device device = device_of(slots);
    run(plan->fwd, slots, device);
    return gather(slots, plan->outputs);
  });

  m.def("set_test_launcher", [](py::object fn) { test_launcher() = std::move(fn); });
  m.def("set_poison", [](bool on) { poison() = on; });
}
