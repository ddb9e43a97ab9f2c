// The backward of banded attention over a key buffer: the native twin of
// playground.kernels._FlashBand.backward (the Python path, and its oracle).
//
// Layout (playground.kernels._Band): keys and values lie in one buffer (B, R, 2E), a row
// per key slot holding its key then its value, heads side by side (E = H · d). Query block
// i (`block` queries) sees the `span` consecutive buffer rows starting at row i · rows;
// consecutive blocks' spans overlap. `mask` (B, blocks, block, span) is additive: 0 where
// a query sees a column of its span, −inf elsewhere.
//
// Per (batch, head) and per block, over its span:
//   P  = exp(scale · q kᵀ + M − L)              (0 where a key is hidden)
//   dV += Pᵀ dO,  dP = dO vᵀ,  dS = P ⊙ (dP − rowsum(dO ⊙ O))
//   dQ = scale · dS k,  dK += scale · dSᵀ q
// dK and dV are added in place onto the buffer's gradient, each span onto its own rows:
// no per-span gradient is held, zeroed or folded back, which is where the flash kernel's
// own backward, called per span, spends its time. A block's P and dS stay in cache between
// the five products. Threads split the (batch, head) pairs; a pair's columns of the
// buffer gradient are its own, so nothing is shared. float32 only.
#include "native.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace playground_native {

namespace {

// Row 0 of (batch, block, head) of a (B, blocks, H, block, d) tensor with unit-stride rows.
const float* block_rows(const at::Tensor& t, int64_t batch, int64_t block, int64_t head) {
  return t.data_ptr<float>() + batch * t.stride(0) + block * t.stride(1) + head * t.stride(2);
}

// The distance between consecutive rows (any, for a single row).
int64_t block_row_stride(const at::Tensor& t) { return t.size(3) == 1 ? t.size(4) : t.stride(3); }

}  // namespace

// q, out, grad_out (B, blocks, H, block, d) float32 with unit-stride rows (any other
// strides); buffer (B, R, 2 · H · d) contiguous; mask (B, blocks, block, span) contiguous
// float32; log_sum_exp (B, blocks, H, block) contiguous; rows: buffer rows between
// consecutive blocks' spans. Returns dq (contiguous, shaped like q) and the buffer's
// gradient (shaped like buffer).
std::vector<at::Tensor> banded_backward(const at::Tensor& q, const at::Tensor& buffer,
                                        const at::Tensor& mask, const at::Tensor& out,
                                        const at::Tensor& log_sum_exp,
                                        const at::Tensor& grad_out, int64_t rows,
                                        double scale_) {
  TORCH_CHECK(q.dim() == 5, "q must be (B, blocks, H, block, d)");
  const int64_t batches = q.size(0), blocks = q.size(1), heads = q.size(2);
  const int64_t block = q.size(3), d = q.size(4), width = heads * d;
  for (const at::Tensor* t : {&q, &out, &grad_out}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat && t->sizes() == q.sizes() &&
                    (t->stride(4) == 1 || d == 1 || t->numel() == 0),
                "q, out and grad_out must be float32 (B, blocks, H, block, d) tensors with "
                "unit-stride rows");
  }
  TORCH_CHECK(buffer.scalar_type() == at::kFloat && buffer.is_contiguous() && buffer.dim() == 3 &&
                  buffer.size(0) == batches && buffer.size(2) == 2 * width,
              "buffer must be a contiguous float32 (B, R, 2 · H · d) tensor");
  TORCH_CHECK(mask.scalar_type() == at::kFloat && mask.is_contiguous() && mask.dim() == 4 &&
                  mask.size(0) == batches && mask.size(1) == blocks && mask.size(2) == block,
              "mask must be a contiguous float32 (B, blocks, block, span) tensor");
  const int64_t span = mask.size(3);
  TORCH_CHECK(rows > 0 && (blocks - 1) * rows + span <= buffer.size(1),
              "the blocks' spans must lie within the buffer");
  TORCH_CHECK(log_sum_exp.is_contiguous() && log_sum_exp.scalar_type() == at::kFloat &&
                  log_sum_exp.numel() == batches * blocks * heads * block,
              "log_sum_exp must be a contiguous float32 (B, blocks, H, block) tensor");
  const float scale = static_cast<float>(scale_);
  const int64_t ldq = block_row_stride(q), ldo = block_row_stride(out);
  const int64_t lddo = block_row_stride(grad_out), ldkv = 2 * width;
  auto grad_q = at::empty(q.sizes(), q.options());
  auto grad_buffer = at::zeros(buffer.sizes(), buffer.options());
  const float* buffer_ = buffer.data_ptr<float>();
  const float* mask_ = mask.data_ptr<float>();
  const float* lse_ = log_sum_exp.data_ptr<float>();
  float* grad_q_ = grad_q.data_ptr<float>();
  float* grad_buffer_ = grad_buffer.data_ptr<float>();
  const int64_t buffer_batch = buffer.size(1) * ldkv;

  // Each thread's P and dS for one block: torch's allocator holds them, so peak memory
  // counts them.
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), batches * heads));
  auto scratch = at::empty({threads, 2, block, span}, q.options());
  at::parallel_for(0, batches * heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t thread = at::get_thread_num();
    TORCH_CHECK(thread < threads, "more threads than scratch tiles");
    float* p = scratch.data_ptr<float>() + thread * 2 * block * span;
    float* ds = p + block * span;
    std::vector<float> row_dot(block);
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t batch = pair / heads, head = pair % heads;
      for (int64_t i = 0; i < blocks; ++i) {
        const float* q_tile = block_rows(q, batch, i, head);
        const float* o_tile = block_rows(out, batch, i, head);
        const float* do_tile = block_rows(grad_out, batch, i, head);
        const int64_t first = batch * buffer_batch + i * rows * ldkv + head * d;
        const float* k_span = buffer_ + first;
        const float* v_span = k_span + width;
        float* dk_span = grad_buffer_ + first;
        float* dv_span = dk_span + width;
        const float* m = mask_ + (batch * blocks + i) * block * span;
        const float* lse = lse_ + ((batch * blocks + i) * heads + head) * block;
        // S = scale · q kᵀ (block × span), then P = exp(S + M − L) in place.
        matmul(false, true, block, span, d, scale, q_tile, ldq, k_span, ldkv, 0.0f, p, span);
        for (int64_t r = 0; r < block; ++r) {
          float* row = p + r * span;
          const float* bias = m + r * span;
          const float shift = lse[r];
#pragma omp simd
          for (int64_t j = 0; j < span; ++j) row[j] = exp_nonpositive(row[j] + bias[j] - shift);
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += do_tile[r * lddo + c] * o_tile[r * ldo + c];
          row_dot[r] = dot;
        }
        matmul(true, false, span, d, block, 1.0f, p, span, do_tile, lddo, 1.0f, dv_span, ldkv);
        matmul(false, true, block, span, d, 1.0f, do_tile, lddo, v_span, ldkv, 0.0f, ds, span);
        for (int64_t r = 0; r < block; ++r) {
          float* grad_row = ds + r * span;
          const float* row = p + r * span;
          const float dot = row_dot[r];
#pragma omp simd
          for (int64_t j = 0; j < span; ++j) grad_row[j] = row[j] * (grad_row[j] - dot);  // dS
        }
        float* dq_tile = grad_q_ + ((batch * blocks + i) * heads + head) * block * d;
        matmul(false, false, block, d, span, scale, ds, span, k_span, ldkv, 0.0f, dq_tile, d);
        matmul(true, false, span, d, block, scale, ds, span, q_tile, ldq, 1.0f, dk_span, ldkv);
      }
    }
  });
  return {grad_q, grad_buffer};
}

}  // namespace playground_native
