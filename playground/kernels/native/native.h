// What the native kernels share: the BLAS product they are made of, a vectorisable exp, and
// their entry points (bound to Python in module.cpp).
#pragma once

#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc);

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace playground_native {

// While alive, this thread flushes subnormal floats to zero (and reads them as zero). A
// softmax weight far below the row's largest (a bias of −60 next to 0, ALiBi's far keys)
// times a value is subnormal, and products of subnormals take the CPU a hundred times
// longer: with them, the products of P and V run several times slower, for contributions
// below 1e-38 of the row's total. The previous mode comes back on destruction, so torch's
// own operations on this thread are not changed.
class FlushSubnormals {
 public:
#if defined(__SSE__)
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushSubnormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

// Row-major C (m × n) = alpha · op(A) · op(B) + beta · C, through column-major BLAS:
// a row-major matrix is the column-major transpose, so C = A B is Cᵀ = Bᵀ Aᵀ.
inline void matmul(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                   float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                   float beta, float* c, int64_t ldc) {
  const char ta = transpose_b ? 'T' : 'N', tb = transpose_a ? 'T' : 'N';
  const int mm = static_cast<int>(n), nn = static_cast<int>(m), kk = static_cast<int>(k);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  sgemm_(&ta, &tb, &mm, &nn, &kk, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

// Row 0 of (batch, head) of a (B, H, N, d) float32 tensor with unit-stride rows.
inline const float* rows_of(const at::Tensor& t, int64_t batch, int64_t head) {
  return t.data_ptr<float>() + batch * t.stride(0) + head * t.stride(1);
}

// exp(x) for x <= 0, 0 below −87 (where float32 would go subnormal, as the Python paths
// do): Cody–Waite range reduction and a degree-6 polynomial (Cephes' expf), written so
// that the compiler vectorises the loop that calls it.
inline float exp_nonpositive(float x) {
  const bool hidden = !(x >= -87.0f);  // also −inf and NaN from a hidden key
  x = hidden ? 0.0f : x;
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = __builtin_bit_cast(float, (static_cast<int32_t>(n) + 127) << 23);
  return hidden ? 0.0f : p * scale;
}

std::vector<at::Tensor> hankel_biased_backward(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& diagonals,
                                               const at::Tensor& keep, const at::Tensor& out,
                                               const at::Tensor& log_sum_exp,
                                               const at::Tensor& grad_out, double scale,
                                               bool causal);

std::vector<at::Tensor> blocked_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& blocks,
                                        const std::vector<at::Tensor>& masks, double scale);

at::Tensor blocked_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& log_sum_exp,
                            const at::Tensor& grad_out, const at::Tensor& grad_k,
                            const at::Tensor& grad_v,
                            const at::Tensor& blocks, const std::vector<at::Tensor>& masks,
                            double scale);

// The blocked kernels with each row's bias from a mod program (playground/mods/program.h) instead of
// masks; a query that sees no key gets log-sum-exp −inf.
std::vector<at::Tensor> program_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& blocks,
                                        const at::Tensor& code, const at::Tensor& slot_types,
                                        const at::Tensor& inputs, const at::Tensor& constants,
                                        const std::vector<at::Tensor>& leaves,
                                        const std::vector<at::Tensor>& tables, int64_t output,
                                        double scale);

// Returns dq, then the gradient of each leaf (its full (B, H, ·, ·) shape) and of each
// table (flat) that leaf_wanted / table_wanted flag, an empty tensor for the others.
std::vector<at::Tensor> program_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& log_sum_exp, const at::Tensor& grad_out, const at::Tensor& grad_k,
    const at::Tensor& grad_v, const at::Tensor& blocks, const at::Tensor& code,
    const at::Tensor& slot_types, const at::Tensor& inputs, const at::Tensor& constants,
    const std::vector<at::Tensor>& leaves, const std::vector<at::Tensor>& tables,
    int64_t output, double scale, const at::Tensor& differentiable,
    const at::Tensor& leaf_wanted, const at::Tensor& table_wanted);

}  // namespace playground_native
