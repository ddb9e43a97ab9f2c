// The backward of softmax(scale · q kᵀ + B) v with a Hankel bias B[h, i, j] = diagonals[h, i + j],
// fused and tiled so that nothing of size (Nq, Nk) is ever held: the native twin of
// playground.kernels._FlashWithBiasGradient.backward (the Python path, and its oracle).
//
// Per (batch, head) and per tile of TILE_Q queries, over all keys at once:
//   P  = exp(scale · q kᵀ + B − L)              (0 where a key is hidden)
//   dV += Pᵀ dO,  dP = dO vᵀ,  dS = P ⊙ (dP − rowsum(dO ⊙ O))
//   dQ = scale · dS k,  dK += scale · dSᵀ q,  dB[i + j] += dS[i, j]
// The tile's P and dP stay in the core's cache between the five products, which is what
// the Python path, working on whole (heads, block, Nk) tensors, cannot do.
// Threads split the (batch, head) pairs; each owns its dK, dV and bias-gradient row, so
// nothing is shared. float32 only; the products are the BLAS sgemm torch itself links.
#include "native.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace playground_native {

namespace {

constexpr int64_t TILE_Q = 64;

// The distance between consecutive rows (any, for a single row).
int64_t row_stride(const at::Tensor& t) { return t.size(2) == 1 ? t.size(3) : t.stride(2); }

}  // namespace

// q, out, grad_out (B, H, Nq, d); k, v (B, H, Nk, d): float32, each row unit-stride (any
// strides across batch, heads and rows: SDPA's output is (B, N, H, d) in memory);
// log_sum_exp (B, H, Nq) contiguous; diagonals (H, Nq + Nk − 1) contiguous; keep (B, Nk) bool or an empty tensor.
// causal: keys are reversed (j' = Nk − 1 − j), so a tile of queries ending at `stop` sees
// only keys j' >= Nk − stop; the others (−inf in the bias anyway) are skipped.
// Returns dq, dk, dv (contiguous, shaped like q, k, v) and the bias gradient of each
// (batch, head), (B, H, Nq + Nk − 1): the caller sums it over the batch.
std::vector<at::Tensor> hankel_biased_backward(const at::Tensor& q, const at::Tensor& k,
                                               const at::Tensor& v, const at::Tensor& diagonals,
                                               const at::Tensor& keep, const at::Tensor& out,
                                               const at::Tensor& log_sum_exp,
                                               const at::Tensor& grad_out, double scale_,
                                               bool causal) {
  const int64_t batches = q.size(0), heads = q.size(1), n_q = q.size(2), d = q.size(3);
  const int64_t n_k = k.size(2), width = diagonals.size(1);
  for (const at::Tensor* t : {&q, &k, &v, &out, &grad_out}) {
    const int64_t n = (t == &k || t == &v) ? n_k : n_q;
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->dim() == 4 &&
                    t->sizes() == at::IntArrayRef({batches, heads, n, d}) &&
                    (t->stride(3) == 1 || d == 1 || t->numel() == 0),
                "q, out and grad_out must be float32 (B, H, Nq, d), k and v (B, H, Nk, d), "
                "each with unit-stride rows");
  }
  TORCH_CHECK(diagonals.scalar_type() == at::kFloat && diagonals.is_contiguous() &&
                  diagonals.dim() == 2 && diagonals.size(0) == heads && width == n_q + n_k - 1,
              "diagonals must be a contiguous float32 (H, Nq + Nk - 1) tensor");
  TORCH_CHECK(log_sum_exp.is_contiguous() && log_sum_exp.scalar_type() == at::kFloat &&
                  log_sum_exp.numel() == batches * heads * n_q,
              "log_sum_exp must be a contiguous float32 (B, H, Nq) tensor");
  const bool masked = keep.numel() > 0;
  TORCH_CHECK(!masked || (keep.is_contiguous() && keep.scalar_type() == at::kBool &&
                          keep.numel() == batches * n_k),
              "keep must be a contiguous (B, Nk) bool tensor");
  const float scale = static_cast<float>(scale_);
  const int64_t ldq = row_stride(q), ldk = row_stride(k), ldv = row_stride(v);
  const int64_t ldo = row_stride(out), lddo = row_stride(grad_out);
  auto grad_q = at::empty({batches, heads, n_q, d}, q.options());
  auto grad_k = at::zeros({batches, heads, n_k, d}, q.options());
  auto grad_v = at::zeros({batches, heads, n_k, d}, q.options());
  auto grad_diagonals = at::zeros({batches, heads, width}, q.options());
  const float* lse_ = log_sum_exp.data_ptr<float>();
  const float* diag_ = diagonals.data_ptr<float>();
  const bool* keep_ = masked ? keep.data_ptr<bool>() : nullptr;

  // Each thread's tile of P and dS: torch's allocator holds them, so peak memory counts them.
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), batches * heads));
  auto scratch = at::empty({threads, 2, TILE_Q, n_k}, q.options());
  at::parallel_for(0, batches * heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t thread = at::get_thread_num();  // < threads: one range piece per thread
    TORCH_CHECK(thread < threads, "more threads than scratch tiles");
    float* p = scratch.data_ptr<float>() + thread * 2 * TILE_Q * n_k;
    float* ds = p + TILE_Q * n_k;
    float row_dot[TILE_Q];
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t batch = pair / heads, head = pair % heads;
      const float* qh = rows_of(q, batch, head);
      const float* kh = rows_of(k, batch, head);
      const float* vh = rows_of(v, batch, head);
      const float* oh = rows_of(out, batch, head);
      const float* doh = rows_of(grad_out, batch, head);
      const float* lse = lse_ + pair * n_q;
      const float* diagonal = diag_ + head * width;
      const bool* keep_row = masked ? keep_ + batch * n_k : nullptr;
      float* dqh = grad_q.data_ptr<float>() + pair * n_q * d;
      float* dkh = grad_k.data_ptr<float>() + pair * n_k * d;
      float* dvh = grad_v.data_ptr<float>() + pair * n_k * d;
      float* dbh = grad_diagonals.data_ptr<float>() + pair * width;
      for (int64_t start = 0; start < n_q; start += TILE_Q) {
        const int64_t rows = std::min(TILE_Q, n_q - start);
        const int64_t first = causal ? std::max<int64_t>(0, n_k - (start + rows)) : 0;
        const int64_t cols = n_k - first;  // the keys this tile may see: first … Nk − 1
        const float* k_seen = kh + first * ldk;
        const float* v_seen = vh + first * ldv;
        float* dk_seen = dkh + first * d;
        float* dv_seen = dvh + first * d;
        const float* q_tile = qh + start * ldq;
        const float* o_tile = oh + start * ldo;
        const float* do_tile = doh + start * lddo;
        // S = scale · q kᵀ (rows × Nk), then P = exp(S + B − L) in place.
        matmul(false, true, rows, cols, d, scale, q_tile, ldq, k_seen, ldk, 0.0f, p, n_k);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = p + r * n_k;
          const float* bias = diagonal + start + r + first;  // B[i, j] = diagonals[i + j]
          const float shift = lse[start + r];
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) row[j] = exp_nonpositive(row[j] + bias[j] - shift);
          if (masked) {
            const uint8_t* kept = reinterpret_cast<const uint8_t*>(keep_row) + first;
#pragma omp simd
            for (int64_t j = 0; j < cols; ++j) row[j] = kept[j] ? row[j] : 0.0f;
          }
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += do_tile[r * lddo + c] * o_tile[r * ldo + c];
          row_dot[r] = dot;
        }
        matmul(true, false, cols, d, rows, 1.0f, p, n_k, do_tile, lddo, 1.0f, dv_seen, d);  // dV += Pᵀ dO
        matmul(false, true, rows, cols, d, 1.0f, do_tile, lddo, v_seen, ldv, 0.0f, ds, n_k);  // dP = dO vᵀ
        for (int64_t r = 0; r < rows; ++r) {
          float* grad_row = ds + r * n_k;
          const float* row = p + r * n_k;
          const float dot = row_dot[r];
          float* bias_grad = dbh + start + r + first;  // dB[i + j] += dS[i, j]
#pragma omp simd
          for (int64_t j = 0; j < cols; ++j) {
            const float value = row[j] * (grad_row[j] - dot);  // dS
            grad_row[j] = value;
            bias_grad[j] += value;
          }
        }
        matmul(false, false, rows, d, cols, scale, ds, n_k, k_seen, ldk, 0.0f, dqh + start * d, d);
        matmul(true, false, cols, d, rows, scale, ds, n_k, q_tile, ldq, 1.0f, dk_seen, d);  // dK += scale · dSᵀ q
      }
    }
  });
  return {grad_q, grad_k, grad_v, grad_diagonals};
}

}  // namespace playground_native
