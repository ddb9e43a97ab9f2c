// The Python module of the native kernels: one binding per entry point of native.h, each
// releasing the GIL while it runs (as torch's own operators do), so Python threads overlap.
#include "native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hankel_biased_backward", &playground_native::hankel_biased_backward,
        "Fused backward of softmax(scale q k^T + Hankel bias) v, with the bias gradient",
        py::call_guard<py::gil_scoped_release>());
  m.def("blocked_forward", &playground_native::blocked_forward,
        "Blocks of queries, each over its own span of keys with a mask: out and log-sum-exp",
        py::call_guard<py::gil_scoped_release>());
  m.def("blocked_backward", &playground_native::blocked_backward,
        "Fused backward of blocks of queries, each over its own span of keys with a mask",
        py::call_guard<py::gil_scoped_release>());
  m.def("program_forward", &playground_native::program_forward,
        "Blocks of queries over their spans, each row's bias from a mod program",
        py::call_guard<py::gil_scoped_release>());
  m.def("program_backward", &playground_native::program_backward,
        "Fused backward of program_forward",
        py::call_guard<py::gil_scoped_release>());
}
