// The Python module of the native kernels: one binding per entry point of native.h.
#include "native.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("hankel_biased_backward", &playground_native::hankel_biased_backward,
        "Fused backward of softmax(scale q k^T + Hankel bias) v, with the bias gradient");
  m.def("banded_backward", &playground_native::banded_backward,
        "Fused backward of banded attention over the spans of a key buffer");
}
