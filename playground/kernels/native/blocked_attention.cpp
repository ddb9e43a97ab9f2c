// Blocked attention, forward and backward: blocks of consecutive queries, each over its
// own span of consecutive keys with an additive mask. The native twins of the flash
// kernel's forward and of the Python backwards of playground.kernels' `blocked_attention`
// (the mask_mod path) and `banded_attention` (windows with prefix keys), which lay their
// keys out so that each block's keys are one span.
//
// Forward, per (batch, head) and block: S = scale · q kᵀ + M, P = softmax(S), O = P v, and
// L = the rows' log-sum-exp. A block's whole span fits in cache, so no running maximum.
// Backward, per (batch, head) and per block, over its span:
//   P  = exp(scale · q kᵀ + M − L)              (0 where a key is hidden)
//   dV += Pᵀ dO,  dP = dO vᵀ,  dS = P ⊙ (dP − rowsum(dO ⊙ O))
//   dQ = scale · dS k,  dK += scale · dSᵀ q
// dK and dV are added in place onto the caller's gradients, each span onto its own rows
// (spans may overlap): no per-block gradient is held, zeroed or scattered, which is where
// autograd through per-block attention, or the flash kernel's own backward per block,
// spends its time. A block's P and dS stay in cache between the five products. Threads
// split the (batch, head) pairs; a pair's rows of the outputs are its own, so nothing
// is shared. float32 only.
#include "native.h"
#include "program.h"  // playground/mods/program.h: the mod program interpreter

#include <ATen/Parallel.h>

#include <algorithm>

namespace playground_native {

namespace {

// The distance between consecutive rows, as BLAS takes it: at least d (any for one row).
int64_t leading(const at::Tensor& t) {
  return t.size(2) <= 1 ? std::max<int64_t>(t.size(3), 1) : t.stride(2);
}

void check_rows(const at::Tensor& t, const char* name, int64_t batches, int64_t heads,
                int64_t d) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 4 && t.size(0) == batches &&
                  t.size(1) == heads && t.size(3) == d && (t.stride(3) == 1 || d == 1) &&
                  (t.size(2) <= 1 || t.stride(2) >= d),
              name, " must be a float32 (B, H, N, d) tensor with unit-stride, disjoint rows");
}

struct Block {
  int64_t start, stop, key_start, key_stop;
};

// The blocks, checked against the queries, keys and masks; `widest` gets the largest
// block · span (the scratch one block needs).
const Block* checked_blocks(const at::Tensor& blocks, const std::vector<at::Tensor>& masks,
                            int64_t n_q, int64_t n_k, int64_t batches, int64_t heads,
                            int64_t* widest) {
  TORCH_CHECK(blocks.scalar_type() == at::kLong && blocks.is_contiguous() && blocks.dim() == 2 &&
                  blocks.size(1) == 4 && static_cast<size_t>(blocks.size(0)) == masks.size(),
              "blocks must be a contiguous int64 (blocks, 4) tensor, one mask per block");
  const Block* blocks_ = reinterpret_cast<const Block*>(blocks.data_ptr<int64_t>());
  *widest = 1;
  for (int64_t i = 0; i < blocks.size(0); ++i) {
    const Block& block = blocks_[i];
    const int64_t rows = block.stop - block.start, span = block.key_stop - block.key_start;
    TORCH_CHECK(0 <= block.start && block.start <= block.stop && block.stop <= n_q &&
                    0 <= block.key_start && block.key_start <= block.key_stop &&
                    block.key_stop <= n_k,
                "block ", i, " lies outside the queries or the keys");
    const at::Tensor& mask = masks[i];
    TORCH_CHECK(mask.numel() == 0 ||
                    (mask.scalar_type() == at::kFloat && mask.dim() == 4 &&
                     (mask.size(0) == 1 || mask.size(0) == batches) &&
                     (mask.size(1) == 1 || mask.size(1) == heads) && mask.size(2) == rows &&
                     mask.size(3) == span && (mask.stride(3) == 1 || span == 1)),
                "the mask of block ", i,
                " must be empty or float32 (1 or B, 1 or H, block, span) with unit-stride rows");
    *widest = std::max(*widest, rows * span);
  }
  return blocks_;
}

// Row 0 of a block's mask at (batch, head), and its row stride in `ld`; null for none.
const float* mask_rows(const at::Tensor& mask, int64_t batch, int64_t head, int64_t* ld) {
  if (mask.numel() == 0) return nullptr;
  *ld = mask.stride(2);
  return mask.data_ptr<float>() + (mask.size(0) == 1 ? 0 : batch * mask.stride(0)) +
         (mask.size(1) == 1 ? 0 : head * mask.stride(1));
}

// Where a block's additive bias comes from, row by row. Each source hands every thread its
// own reader: `row` gives the bias of one query over its block's span, or null for none.
struct MaskSource {  // one additive mask per block (empty: none), read in place
  const std::vector<at::Tensor>& masks;
  static constexpr float empty_log_sum_exp = 0.0f;  // as the CPU flash kernel gives
  struct Reader {
    const MaskSource& source;
    const float* rows = nullptr;
    int64_t ld = 0;
    void start(int64_t block, int64_t batch, int64_t head, int64_t, int64_t, int64_t) {
      rows = mask_rows(source.masks[block], batch, head, &ld);
    }
    const float* row(int64_t r, int64_t) { return rows == nullptr ? nullptr : rows + r * ld; }
    void backward_row(int64_t, int64_t, const float*) {}  // a mask gets no gradient
  };
  Reader reader(int64_t, int64_t) const { return Reader{*this}; }
};

struct ProgramSource {  // a mod program, evaluated per row while the tile is in cache
  const ModProgram& program;
  // A query that sees no key gets −inf, so that the caller can tell it from one that
  // does (its output is 0 either way), and the backward gives it no gradient.
  static constexpr float empty_log_sum_exp = -INFINITY;
  struct Reader {
    ProgramRun run;
    std::vector<float> bias;
    int64_t batch = 0, head = 0, key_start = 0, span = 0;
    void start(int64_t, int64_t batch_, int64_t head_, int64_t, int64_t key_start_,
               int64_t span_) {
      batch = batch_, head = head_, key_start = key_start_, span = span_;
    }
    const float* row(int64_t, int64_t query) {
      run.row(batch, head, query, key_start, span, bias.data());
      return bias.data();
    }
    // grad_bias: the gradient of this row's biased scores, dS (0 where a key is hidden).
    void backward_row(int64_t, int64_t query, const float* grad_bias) {
      run.row_backward(batch, head, query, key_start, span, grad_bias);
    }
  };
  ProgramGradients* gradients = nullptr;
  Reader reader(int64_t widest_span, int64_t thread) const {
    return Reader{ProgramRun(program, gradients, thread), std::vector<float>(widest_span)};
  }
};

}  // namespace

// q (B, H, Nq, d), k and v (B, H, Nk, d), blocks and masks as for blocked_backward below.
// Per (batch, head) and block: S = scale · q kᵀ + M over the span, each row's maximum m
// and sum s of exp(S − m), P = exp(S − m) / s and O = P v: the whole span of a block fits
// in cache, so no running maximum is needed. Returns out (B, H, Nq, d) and the per-row
// log-sum-exp L = m + log s (B, H, Nq), which blocked_backward takes; a row that sees no
// key (or is in no block) gets O = 0 and L = 0, as the CPU flash kernel gives.
namespace {

// The widest span of any block: the bias row a program reader needs.
int64_t widest_span(const at::Tensor& blocks) {
  const int64_t* b = blocks.data_ptr<int64_t>();
  int64_t widest = 1;
  for (int64_t i = 0; i < blocks.size(0); ++i) widest = std::max(widest, b[4 * i + 3] - b[4 * i + 2]);
  return widest;
}

template <class Source>
std::vector<at::Tensor> forward_blocks(const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& blocks,
                                       const std::vector<at::Tensor>& masks,
                                       const Source& source, double scale_) {
  TORCH_CHECK(q.dim() == 4, "q must be (B, H, Nq, d)");
  const int64_t batches = q.size(0), heads = q.size(1), n_q = q.size(2), d = q.size(3);
  const int64_t n_k = k.dim() == 4 ? k.size(2) : -1;
  check_rows(q, "q", batches, heads, d);
  for (const at::Tensor* t : {&k, &v}) {
    check_rows(*t, "k and v", batches, heads, d);
    TORCH_CHECK(t->size(2) == n_k, "k and v must have as many rows");
  }
  int64_t widest = 1;
  const Block* blocks_ = checked_blocks(blocks, masks, n_q, n_k, batches, heads, &widest);
  const int64_t num_blocks = blocks.size(0);
  // The output in (B, Nq, H, d) memory, seen as (B, H, Nq, d): merging the heads for the
  // output projection is then a view, not a copy.
  at::Tensor out = at::empty({batches, n_q, heads, d}, q.options()).permute({0, 2, 1, 3});
  at::Tensor log_sum_exp = at::full({batches, heads, n_q}, Source::empty_log_sum_exp, q.options());
  if (out.numel() == 0 || n_k == 0) return {out.zero_(), log_sum_exp};
  const float scale = static_cast<float>(scale_);
  const int64_t ldq = leading(q), ldk = leading(k), ldv = leading(v);
  const int64_t span_limit = widest_span(blocks);
  // Rows a block with keys writes; the others (in no block, or in one without keys) are
  // zeroed, rather than the whole output beforehand.
  std::vector<char> written(n_q, 0);
  for (int64_t i = 0; i < num_blocks; ++i) {
    const Block& block = blocks_[i];
    if (block.key_stop > block.key_start) {
      std::fill(written.begin() + block.start, written.begin() + block.stop, 1);
    }
  }
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), batches * heads));
  auto scratch = at::empty({threads, widest}, q.options());
  at::parallel_for(0, batches * heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t thread = at::get_thread_num();
    TORCH_CHECK(thread < threads, "more threads than scratch tiles");
    float* p = scratch.data_ptr<float>() + thread * widest;
    auto reader = source.reader(span_limit, thread);
    const FlushSubnormals flush;
    std::vector<float> inverse;  // 1 / each row's sum
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t batch = pair / heads, head = pair % heads;
      const float* qh = rows_of(q, batch, head);
      const float* kh = rows_of(k, batch, head);
      const float* vh = rows_of(v, batch, head);
      float* oh = out.data_ptr<float>() + batch * out.stride(0) + head * out.stride(1);
      const int64_t ldo = out.stride(2);
      for (int64_t row = 0; row < n_q; ++row) {
        if (!written[row]) std::fill(oh + row * ldo, oh + row * ldo + d, 0.0f);
      }
      float* lse = log_sum_exp.data_ptr<float>() + pair * n_q;
      for (int64_t i = 0; i < num_blocks; ++i) {
        const Block& block = blocks_[i];
        const int64_t rows = block.stop - block.start, span = block.key_stop - block.key_start;
        if (rows == 0 || span == 0) continue;
        reader.start(i, batch, head, block.start, block.key_start, span);
        const float* v_span = vh + block.key_start * ldv;
        inverse.assign(rows, 0.0f);
        matmul(false, true, rows, span, d, scale, qh + block.start * ldq, ldq,
               kh + block.key_start * ldk, ldk, 0.0f, p, span);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = p + r * span;
          float top = -INFINITY;
          int not_a_number = 0;
          const float* bias = reader.row(r, block.start + r);
          if (bias != nullptr) {
#pragma omp simd reduction(max : top) reduction(+ : not_a_number)
            for (int64_t j = 0; j < span; ++j) {
              row[j] += bias[j];
              top = row[j] > top ? row[j] : top;
              not_a_number += row[j] != row[j];
            }
          } else {
#pragma omp simd reduction(max : top) reduction(+ : not_a_number)
            for (int64_t j = 0; j < span; ++j) {
              top = row[j] > top ? row[j] : top;
              not_a_number += row[j] != row[j];
            }
          }
          if (not_a_number > 0 || top == INFINITY) {
            // A NaN score, or +inf (inf − inf): NaN, as the flash kernel gives, not a key
            // quietly dropped. The backward sees the NaN log-sum-exp and passes it on.
            std::fill(row, row + span, NAN);
            lse[block.start + r] = NAN;
            continue;
          }
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t j = 0; j < span; ++j) {
            row[j] = exp_nonpositive(row[j] - top);  // 0 where hidden, and everywhere if all are
            sum += row[j];
          }
          inverse[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
          lse[block.start + r] = sum > 0.0f ? top + std::log(sum) : Source::empty_log_sum_exp;
        }
        // O = (exp(S − m) v) / s: each output row scaled once, rather than every weight.
        float* o_tile = oh + block.start * ldo;
        matmul(false, false, rows, d, span, 1.0f, p, span, v_span, ldv, 0.0f, o_tile, ldo);
        for (int64_t r = 0; r < rows; ++r) {
          const float factor = inverse[r];
#pragma omp simd
          for (int64_t c = 0; c < d; ++c) o_tile[r * ldo + c] *= factor;
        }
      }
    }
  });
  return {out, log_sum_exp};
}

}  // namespace

std::vector<at::Tensor> blocked_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& blocks,
                                        const std::vector<at::Tensor>& masks, double scale) {
  return forward_blocks(q, k, v, blocks, masks, MaskSource{masks}, scale);
}

// q, out, grad_out (B, H, Nq, d); k, v, grad_k, grad_v (B, H, Nk, d): float32 with
// unit-stride rows, any other strides (views into one buffer of keys and values, say);
// log_sum_exp (B, H, Nq) float32; blocks (blocks, 4) int64: query start and stop, key
// start and stop; masks: one per block, an empty tensor (no mask) or float32
// (1 or B, 1 or H, block queries, span keys) with unit-stride rows, additive (−inf
// hides). dK and dV are added onto grad_k and grad_v. Returns dq (B, H, Nq, d), 0 in
// rows no block holds.
namespace {

template <class Source>
at::Tensor backward_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& out, const at::Tensor& log_sum_exp,
                           const at::Tensor& grad_out, const at::Tensor& grad_k,
                           const at::Tensor& grad_v, const at::Tensor& blocks,
                           const std::vector<at::Tensor>& masks, const Source& source,
                           double scale_) {
  TORCH_CHECK(q.dim() == 4, "q must be (B, H, Nq, d)");
  const int64_t batches = q.size(0), heads = q.size(1), n_q = q.size(2), d = q.size(3);
  const int64_t n_k = k.dim() == 4 ? k.size(2) : -1;
  check_rows(q, "q", batches, heads, d);
  check_rows(out, "out", batches, heads, d);
  check_rows(grad_out, "grad_out", batches, heads, d);
  for (const at::Tensor* t : {&k, &v, &grad_k, &grad_v}) {
    check_rows(*t, "k, v and their gradients", batches, heads, d);
    TORCH_CHECK(t->size(2) == n_k, "k, v and their gradients must have as many rows");
  }
  TORCH_CHECK(out.size(2) == n_q && grad_out.size(2) == n_q, "out and grad_out must be q's shape");
  TORCH_CHECK(log_sum_exp.scalar_type() == at::kFloat && log_sum_exp.dim() == 3 &&
                  log_sum_exp.size(0) == batches && log_sum_exp.size(1) == heads &&
                  log_sum_exp.size(2) == n_q,
              "log_sum_exp must be a float32 (B, H, Nq) tensor");
  int64_t scratch_size = 1;
  const Block* blocks_ = checked_blocks(blocks, masks, n_q, n_k, batches, heads, &scratch_size);
  const int64_t num_blocks = blocks.size(0);
  const float scale = static_cast<float>(scale_);
  const int64_t ldq = leading(q), ldo = leading(out), lddo = leading(grad_out);
  const int64_t ldk = leading(k), ldv = leading(v);
  const int64_t lddk = leading(grad_k), lddv = leading(grad_v);
  auto grad_q = at::zeros({batches, heads, n_q, d}, q.options());
  if (grad_q.numel() == 0 || n_k == 0) return grad_q;
  const int64_t span_limit = widest_span(blocks);

  // Each thread's P and dS for one block: torch's allocator holds them, so peak memory
  // counts them.
  const int64_t threads =
      std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), batches * heads));
  auto scratch = at::empty({threads, 2, scratch_size}, q.options());
  at::parallel_for(0, batches * heads, 1, [&](int64_t begin, int64_t end) {
    const int64_t thread = at::get_thread_num();
    TORCH_CHECK(thread < threads, "more threads than scratch tiles");
    float* p = scratch.data_ptr<float>() + thread * 2 * scratch_size;
    float* ds = p + scratch_size;
    std::vector<float> row_dot;
    auto reader = source.reader(span_limit, thread);
    const FlushSubnormals flush;
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t batch = pair / heads, head = pair % heads;
      const float* qh = rows_of(q, batch, head);
      const float* oh = rows_of(out, batch, head);
      const float* doh = rows_of(grad_out, batch, head);
      const float* kh = rows_of(k, batch, head);
      const float* vh = rows_of(v, batch, head);
      float* dkh = grad_k.data_ptr<float>() + batch * grad_k.stride(0) + head * grad_k.stride(1);
      float* dvh = grad_v.data_ptr<float>() + batch * grad_v.stride(0) + head * grad_v.stride(1);
      float* dqh = grad_q.data_ptr<float>() + pair * n_q * d;
      const float* lse = log_sum_exp.data_ptr<float>() + batch * log_sum_exp.stride(0) +
                         head * log_sum_exp.stride(1);
      const int64_t lse_stride = log_sum_exp.stride(2);
      for (int64_t i = 0; i < num_blocks; ++i) {
        const Block& block = blocks_[i];
        const int64_t rows = block.stop - block.start, span = block.key_stop - block.key_start;
        if (rows == 0 || span == 0) continue;
        const float* q_tile = qh + block.start * ldq;
        const float* o_tile = oh + block.start * ldo;
        const float* do_tile = doh + block.start * lddo;
        const float* k_span = kh + block.key_start * ldk;
        const float* v_span = vh + block.key_start * ldv;
        reader.start(i, batch, head, block.start, block.key_start, span);
        // S = scale · q kᵀ (rows × span), then P = exp(S + M − L) in place.
        matmul(false, true, rows, span, d, scale, q_tile, ldq, k_span, ldk, 0.0f, p, span);
        row_dot.resize(rows);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = p + r * span;
          const float shift = lse[(block.start + r) * lse_stride];
          const float* bias = reader.row(r, block.start + r);
          if (shift != shift) {  // the forward's NaN row: NaN gradients, not zeros
            std::fill(row, row + span, NAN);
          } else if (shift == -INFINITY) {  // a query that saw no key: no gradient
            std::fill(row, row + span, 0.0f);
          } else if (bias != nullptr) {
#pragma omp simd
            for (int64_t j = 0; j < span; ++j) row[j] = exp_nonpositive(row[j] + bias[j] - shift);
          } else {
#pragma omp simd
            for (int64_t j = 0; j < span; ++j) row[j] = exp_nonpositive(row[j] - shift);
          }
          float dot = 0.0f;
          for (int64_t c = 0; c < d; ++c) dot += do_tile[r * lddo + c] * o_tile[r * ldo + c];
          row_dot[r] = dot;
        }
        float* dk_span = dkh + block.key_start * lddk;
        float* dv_span = dvh + block.key_start * lddv;
        matmul(true, false, span, d, rows, 1.0f, p, span, do_tile, lddo, 1.0f, dv_span, lddv);
        matmul(false, true, rows, span, d, 1.0f, do_tile, lddo, v_span, ldv, 0.0f, ds, span);
        for (int64_t r = 0; r < rows; ++r) {
          float* grad_row = ds + r * span;
          const float* row = p + r * span;
          const float dot = row_dot[r];
#pragma omp simd
          for (int64_t j = 0; j < span; ++j) grad_row[j] = row[j] * (grad_row[j] - dot);  // dS
          reader.backward_row(r, block.start + r, grad_row);
        }
        matmul(false, false, rows, d, span, scale, ds, span, k_span, ldk, 0.0f,
               dqh + block.start * d, d);
        matmul(true, false, span, d, rows, scale, ds, span, q_tile, ldq, 1.0f, dk_span, lddk);
      }
    }
  });
  return grad_q;
}

// No mask per block: a program gives each row its bias.
std::vector<at::Tensor> no_masks(const at::Tensor& blocks, const at::Tensor& like) {
  return std::vector<at::Tensor>(blocks.size(0), at::empty({0}, like.options()));
}

ModProgram program_of(const at::Tensor& code, const at::Tensor& slot_types,
                      const at::Tensor& inputs, const at::Tensor& constants,
                      const std::vector<at::Tensor>& leaves,
                      const std::vector<at::Tensor>& tables, int64_t output,
                      const at::Tensor& q, const at::Tensor& k,
                      const at::Tensor& differentiable = at::Tensor()) {
  ModProgram program{code,   slot_types, inputs, constants, leaves, tables,
                     output, differentiable.defined() ? differentiable
                                                      : at::empty({0}, code.options())};
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, "q and k must be (B, H, N, d)");
  program.check(q.size(0), q.size(1), q.size(2), k.size(2));
  return program;
}

}  // namespace

at::Tensor blocked_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& out, const at::Tensor& log_sum_exp,
                            const at::Tensor& grad_out, const at::Tensor& grad_k,
                            const at::Tensor& grad_v,
                            const at::Tensor& blocks, const std::vector<at::Tensor>& masks,
                            double scale) {
  return backward_blocks(q, k, v, out, log_sum_exp, grad_out, grad_k, grad_v, blocks, masks,
                         MaskSource{masks}, scale);
}

std::vector<at::Tensor> program_forward(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& v, const at::Tensor& blocks,
                                        const at::Tensor& code, const at::Tensor& slot_types,
                                        const at::Tensor& inputs, const at::Tensor& constants,
                                        const std::vector<at::Tensor>& leaves,
                                        const std::vector<at::Tensor>& tables, int64_t output,
                                        double scale) {
  const ModProgram program =
      program_of(code, slot_types, inputs, constants, leaves, tables, output, q, k);
  return forward_blocks(q, k, v, blocks, no_masks(blocks, q), ProgramSource{program}, scale);
}

std::vector<at::Tensor> program_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& log_sum_exp, const at::Tensor& grad_out, const at::Tensor& grad_k,
    const at::Tensor& grad_v, const at::Tensor& blocks, const at::Tensor& code,
    const at::Tensor& slot_types, const at::Tensor& inputs, const at::Tensor& constants,
    const std::vector<at::Tensor>& leaves, const std::vector<at::Tensor>& tables,
    int64_t output, double scale, const at::Tensor& differentiable,
    const at::Tensor& leaf_wanted, const at::Tensor& table_wanted) {
  const ModProgram program = program_of(code, slot_types, inputs, constants, leaves, tables,
                                        output, q, k, differentiable);
  TORCH_CHECK(leaf_wanted.scalar_type() == at::kLong && leaf_wanted.is_contiguous() &&
                  leaf_wanted.numel() == static_cast<int64_t>(leaves.size()) &&
                  table_wanted.scalar_type() == at::kLong && table_wanted.is_contiguous() &&
                  table_wanted.numel() == static_cast<int64_t>(tables.size()),
              "leaf_wanted and table_wanted: one int64 flag per leaf and per table");
  const int64_t threads = std::max<int64_t>(
      1, std::min<int64_t>(at::get_num_threads(), q.size(0) * q.size(1)));
  ProgramGradients gradients;
  for (size_t i = 0; i < leaves.size(); ++i) {
    gradients.leaves.push_back(leaf_wanted.data_ptr<int64_t>()[i]
                                   ? at::zeros(leaves[i].sizes(), q.options())
                                   : at::Tensor());
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    gradients.tables.push_back(table_wanted.data_ptr<int64_t>()[i]
                                   ? at::zeros({threads, tables[i].numel()}, q.options())
                                   : at::Tensor());
  }
  ProgramSource source{program};
  source.gradients = &gradients;
  std::vector<at::Tensor> results{backward_blocks(q, k, v, out, log_sum_exp, grad_out, grad_k,
                                                  grad_v, blocks, no_masks(blocks, q), source,
                                                  scale)};
  for (const at::Tensor& grad : gradients.leaves) {
    results.push_back(grad.defined() ? grad : at::empty({0}, q.options()));
  }
  for (const at::Tensor& grad : gradients.tables) {
    results.push_back(grad.defined() ? grad.sum(0) : at::empty({0}, q.options()));
  }
  return results;
}

}  // namespace playground_native
