// A mod program: the part of a score_mod's bias (and of its mask) that reads both the query
// and the key index, as a list of element-wise instructions that the blocked kernels run
// on each row of a tile while it is in cache (playground/mods/lowering.py builds it
// from the mod's torch.fx graph). Everything that reads only one of the two indices was
// evaluated by torch beforehand and comes in as a "leaf" tensor.
//
// Slots hold float32 or int64 (bool as 0/1), each a scalar (one value per row: the query
// index, a per-query leaf, a constant) or a vector (one value per key of the chunk: the
// key index, a per-key leaf, an instruction's result). Instructions read slots and write
// one; the program's output slot is the bias, −inf where a key is hidden.
#pragma once

#include "native.h"

#include <algorithm>
#include <limits>

namespace playground_native {

enum SlotType : int64_t { FLOAT_VECTOR = 0, INT_VECTOR = 1, FLOAT_SCALAR = 2, INT_SCALAR = 3 };
enum Source : int64_t { CONSTANT = 0, QUERY = 1, KEY = 2, LEAF = 3, BATCH = 4, HEAD = 5 };
enum Opcode : int64_t {
  F_ADD, F_SUB, F_MUL, F_DIV, F_MIN, F_MAX, F_NEG, F_ABS, F_EXP, F_LOG, F_SQRT,
  I_ADD, I_SUB, I_MUL, I_FLOOR_DIV, I_MOD, I_MIN, I_MAX, I_NEG, I_ABS,
  F_LT, F_LE, F_EQ, F_NE, I_LT, I_LE, I_EQ, I_NE,
  I_AND, I_OR, I_XOR, I_NOT,
  TO_FLOAT, TO_INT,
  F_WHERE, I_WHERE,
  WRAP_INDEX,  // a = index, b = size: negative indices count from the end; out of range fails
  F_GATHER, I_GATHER,  // a = flat index, c = table number
  F_CLAMP,             // clamp(a, min = b, max = c), NaN from any operand
  OPCODE_COUNT
};

constexpr int64_t PROGRAM_CHUNK = 1024;  // keys per evaluation: a few slots stay in L1, fewer chunk overheads

// The program as Python hands it over (see mods/program.py for the layout of each tensor).
struct ModProgram {
  at::Tensor code;        // (instructions, 5) int64: opcode, destination, a, b, c
  at::Tensor slot_types;  // (slots,) int64: SlotType
  at::Tensor inputs;      // (inputs, 3) int64: slot, Source, constant or leaf number
  at::Tensor constants;   // (constants,) float64
  std::vector<at::Tensor> leaves;  // 4-D (B, H, Nq or 1, Nk or 1), float32 or int64, any strides
  std::vector<at::Tensor> tables;  // 1-D contiguous float32 or int64, read by the gathers
  int64_t output;                  // the slot holding the bias (a float slot)
  at::Tensor differentiable;       // (slots,) int64: 1 where a gradient flows (may be empty)

  bool has_gradients() const { return differentiable.numel() > 0; }

  void check(int64_t batches, int64_t heads, int64_t n_q, int64_t n_k) const {
    TORCH_CHECK(code.scalar_type() == at::kLong && code.dim() == 2 && code.size(1) == 5 &&
                    code.is_contiguous(),
                "the program's code must be a contiguous int64 (instructions, 5) tensor");
    TORCH_CHECK(slot_types.scalar_type() == at::kLong && slot_types.is_contiguous(),
                "slot_types must be contiguous int64");
    TORCH_CHECK(inputs.scalar_type() == at::kLong && inputs.dim() == 2 && inputs.size(1) == 3 &&
                    inputs.is_contiguous(),
                "inputs must be a contiguous int64 (inputs, 3) tensor");
    TORCH_CHECK(constants.scalar_type() == at::kDouble && constants.is_contiguous(),
                "constants must be contiguous float64");
    const int64_t slots = slot_types.size(0);
    const int64_t* types = slot_types.data_ptr<int64_t>();
    auto valid = [&](int64_t slot) { return 0 <= slot && slot < slots; };
    TORCH_CHECK(valid(output) && (types[output] == FLOAT_VECTOR || types[output] == FLOAT_SCALAR),
                "the program's output must be a float slot");
    const int64_t* in = inputs.data_ptr<int64_t>();
    for (int64_t i = 0; i < inputs.size(0); ++i) {
      const int64_t slot = in[3 * i], source = in[3 * i + 1], index = in[3 * i + 2];
      TORCH_CHECK(valid(slot), "input ", i, " names no slot");
      const bool vector = types[slot] == FLOAT_VECTOR || types[slot] == INT_VECTOR;
      if (source == CONSTANT) {
        TORCH_CHECK(!vector && 0 <= index && index < constants.size(0), "bad constant ", i);
      } else if (source == KEY) {
        TORCH_CHECK(vector, "the key index must go to a vector slot");
      } else if (source == LEAF) {
        TORCH_CHECK(0 <= index && index < static_cast<int64_t>(leaves.size()), "bad leaf ", i);
        const at::Tensor& leaf = leaves[index];
        const bool is_float = leaf.scalar_type() == at::kFloat;
        TORCH_CHECK(
            (is_float || leaf.scalar_type() == at::kLong) && leaf.dim() == 4 &&
                leaf.size(0) == batches && leaf.size(1) == heads &&
                (leaf.size(2) == 1 || leaf.size(2) == n_q) &&
                (leaf.size(3) == 1 || leaf.size(3) == n_k) &&
                !(leaf.size(2) > 1 && leaf.size(3) > 1) && (leaf.size(3) > 1) == vector &&
                is_float == (types[slot] == FLOAT_VECTOR || types[slot] == FLOAT_SCALAR),
            "leaf ", index, " must be float32 or int64 (B, H, Nq or 1, Nk or 1), not both, "
            "and of its slot's type");
      } else {
        TORCH_CHECK(((source == QUERY && !vector) ||
                     ((source == BATCH || source == HEAD) && types[slot] == INT_SCALAR)),
                    "input ", i, ": an index goes to a scalar slot (b and h: int)");
      }
    }
    for (const at::Tensor& table : tables) {
      TORCH_CHECK(table.dim() == 1 && table.is_contiguous() &&
                      (table.scalar_type() == at::kFloat || table.scalar_type() == at::kLong),
                  "a gathered table must be a contiguous 1-D float32 or int64 tensor");
    }
    TORCH_CHECK(differentiable.numel() == 0 ||
                    (differentiable.scalar_type() == at::kLong &&
                     differentiable.is_contiguous() && differentiable.numel() == slots),
                "differentiable must be empty or one int64 flag per slot");
    const int64_t* ops = code.data_ptr<int64_t>();
    for (int64_t i = 0; i < code.size(0); ++i) {
      const int64_t* op = ops + 5 * i;
      TORCH_CHECK(0 <= op[0] && op[0] < OPCODE_COUNT && valid(op[1]), "instruction ", i,
                  " is malformed");
      if (op[0] == F_GATHER || op[0] == I_GATHER) {
        TORCH_CHECK(valid(op[2]) && 0 <= op[4] && op[4] < static_cast<int64_t>(tables.size()),
                    "gather ", i, " names no table");
      } else {
        TORCH_CHECK(valid(op[2]) && valid(op[3]) && valid(op[4]), "instruction ", i,
                    " names no slot");
      }
    }
  }
};

// Where the gradients of a program's float leaves and tables go: one full (B, H, Nq or 1,
// Nk or 1) tensor per leaf (undefined for a leaf without one), written by the thread that
// owns the (batch, head) pair; per table, one row per thread, summed by the caller.
struct ProgramGradients {
  std::vector<at::Tensor> leaves;
  std::vector<at::Tensor> tables;  // (threads, numel) each, or undefined
};

// One thread's evaluation of a program: its slots, and the bias of one row over a span.
class ProgramRun {
 public:
  explicit ProgramRun(const ModProgram& program, ProgramGradients* gradients = nullptr,
                      int64_t thread = 0)
      : gradients_(gradients),
        thread_(thread),
        program_(program),
        slots_(program.slot_types.size(0)),
        types_(program.slot_types.data_ptr<int64_t>()),
        floats_(slots_ * PROGRAM_CHUNK),
        ints_(slots_ * PROGRAM_CHUNK),
        adjoints_(program.has_gradients() ? slots_ * PROGRAM_CHUNK : 0) {
    const int64_t* in = program.inputs.data_ptr<int64_t>();
    const double* constants = program.constants.data_ptr<double>();
    for (int64_t i = 0; i < program.inputs.size(0); ++i) {
      if (in[3 * i + 1] != CONSTANT) continue;
      const int64_t slot = in[3 * i];
      if (types_[slot] == FLOAT_SCALAR) {
        f(slot)[0] = static_cast<float>(constants[in[3 * i + 2]]);
      } else {
        n(slot)[0] = static_cast<int64_t>(constants[in[3 * i + 2]]);
      }
    }
  }

  // bias[0 .. span) for query `query` of (batch, head) over keys key_start … + span.
  void row(int64_t batch, int64_t head, int64_t query, int64_t key_start, int64_t span,
           float* bias) {
    load_scalars(batch, head, query);
    for (int64_t first = 0; first < span; first += PROGRAM_CHUNK) {
      const int64_t count = std::min(PROGRAM_CHUNK, span - first);
      load_vectors(batch, head, key_start + first, count);
      // The last instruction, when it computes the output, writes straight into `bias`.
      if (run(count, bias + first)) continue;
      const float* result = f(program_.output);
      if (types_[program_.output] == FLOAT_VECTOR) {
        std::copy(result, result + count, bias + first);
      } else {
        std::fill(bias + first, bias + first + count, result[0]);
      }
    }
  }

  // The gradients of the leaves and tables from grad_bias[0 .. span), the gradient of
  // row `query`'s bias over keys key_start … + span: the program run again per chunk,
  // then swept in reverse.
  void row_backward(int64_t batch, int64_t head, int64_t query, int64_t key_start,
                    int64_t span, const float* grad_bias) {
    if (!program_.has_gradients()) return;
    const int64_t* flows = program_.differentiable.data_ptr<int64_t>();
    if (!flows[program_.output]) return;
    load_scalars(batch, head, query);
    for (int64_t first = 0; first < span; first += PROGRAM_CHUNK) {
      const int64_t count = std::min(PROGRAM_CHUNK, span - first);
      load_vectors(batch, head, key_start + first, count);
      run(count, nullptr);
      for (int64_t slot = 0; slot < slots_; ++slot) {  // only where a gradient flows
        if (flows[slot]) std::fill(g(slot), g(slot) + (vector(slot) ? count : 1), 0.0f);
      }
      float* seed = g(program_.output);
      if (vector(program_.output)) {
        std::copy(grad_bias + first, grad_bias + first + count, seed);
      } else {
        for (int64_t j = 0; j < count; ++j) seed[0] += grad_bias[first + j];
      }
      reverse(count, flows);
      deposit(batch, head, query, key_start + first, count, flows);
    }
  }

 private:
  float* g(int64_t slot) { return adjoints_.data() + slot * PROGRAM_CHUNK; }

  // adjoint[slot] += value[j] (summed when the slot is a scalar).
  template <class Value>
  void accumulate(int64_t slot, int64_t count, Value value) {
    float* adjoint = g(slot);
    if (vector(slot)) {
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) adjoint[j] += value(j);
    } else {
      float sum = 0.0f;
      for (int64_t j = 0; j < count; ++j) sum += value(j);
      adjoint[0] += sum;
    }
  }

  void reverse(int64_t keys, const int64_t* flows) {
    const int64_t* ops = program_.code.data_ptr<int64_t>();
    for (int64_t i = program_.code.size(0) - 1; i >= 0; --i) {
      const int64_t* op = ops + 5 * i;
      const int64_t dst = op[1], a = op[2], b = op[3], c = op[4];
      if (!flows[dst]) continue;
      const int64_t count = vector(dst) ? keys : 1;
      const float* gd = g(dst);
      const float* out = f(dst);
      const bool av = vector(a), bv = vector(b), cv = vector(c);
      const float* x = f(a);
      const float* y = f(b);
      auto at = [](const float* t, bool is_vector, int64_t j) { return t[is_vector ? j : 0]; };
      const bool fa = flows[a] != 0, fb = op[0] != F_GATHER && flows[b] != 0;
      switch (op[0]) {
        case F_ADD:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j]; });
          if (fb) accumulate(b, count, [&](int64_t j) { return gd[j]; });
          break;
        case F_SUB:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j]; });
          if (fb) accumulate(b, count, [&](int64_t j) { return -gd[j]; });
          break;
        case F_MUL:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j] * at(y, bv, j); });
          if (fb) accumulate(b, count, [&](int64_t j) { return gd[j] * at(x, av, j); });
          break;
        case F_DIV:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j] / at(y, bv, j); });
          if (fb) accumulate(b, count, [&](int64_t j) { return -gd[j] * (out[j] / at(y, bv, j)); });
          break;
        case F_MIN:
        case F_MAX: {  // torch's: half to each on a tie, all to both on a NaN
          const bool lesser = op[0] == F_MIN;
          auto share = [&](int64_t j, bool first) {
            const float u = at(x, av, j), w = at(y, bv, j);
            if (u == w) return gd[j] / 2.0f;
            const bool other_chosen = first == lesser ? u > w : u < w;
            return other_chosen ? 0.0f : gd[j];
          };
          if (fa) accumulate(a, count, [&](int64_t j) { return share(j, true); });
          if (fb) accumulate(b, count, [&](int64_t j) { return share(j, false); });
          break;
        }
        case F_CLAMP: {  // torch's: x where min <= x <= max, a bound where it is the result
          const float* z = f(c);
          if (fa) accumulate(a, count, [&](int64_t j) {
            const float u = at(x, av, j);
            return u >= at(y, bv, j) && u <= at(z, cv, j) ? gd[j] : 0.0f;
          });
          if (fb) accumulate(b, count, [&](int64_t j) {
            const float low = at(y, bv, j);
            return at(x, av, j) < low && low < at(z, cv, j) ? gd[j] : 0.0f;
          });
          if (flows[c]) accumulate(c, count, [&](int64_t j) {
            const float high = at(z, cv, j);
            return at(x, av, j) > high || high < at(y, bv, j) ? gd[j] : 0.0f;
          });
          break;
        }
        case F_NEG:
          if (fa) accumulate(a, count, [&](int64_t j) { return -gd[j]; });
          break;
        case F_ABS:  // torch's: gradient · sign(x), sign 0 at 0 and NaN (inf · 0 is NaN)
          if (fa) accumulate(a, count, [&](int64_t j) {
            const float u = at(x, av, j);
            return gd[j] * (u > 0.0f ? 1.0f : (u < 0.0f ? -1.0f : 0.0f));
          });
          break;
        case F_EXP:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j] * out[j]; });
          break;
        case F_LOG:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j] / at(x, av, j); });
          break;
        case F_SQRT:
          if (fa) accumulate(a, count, [&](int64_t j) { return gd[j] / (2.0f * out[j]); });
          break;
        case F_WHERE: {
          const int64_t* condition = n(a);
          if (flows[b]) accumulate(b, count, [&](int64_t j) {
            return condition[av ? j : 0] != 0 ? gd[j] : 0.0f;
          });
          if (flows[c]) accumulate(c, count, [&](int64_t j) {
            return condition[av ? j : 0] != 0 ? 0.0f : gd[j];
          });
          (void)cv;
          break;
        }
        case F_GATHER: {  // scattered into this thread's row of the table's gradient
          const at::Tensor& table_grad = gradients_->tables[c];
          if (!table_grad.defined()) break;
          float* grad = table_grad.data_ptr<float>() + thread_ * table_grad.size(1);
          const int64_t* index = n(a);
          // Runs of one index (a table by blocks of positions) are summed before they are
          // added: one read-modify-write per run, not per key.
          int64_t current = index[0];
          float run_sum = 0.0f;
          for (int64_t j = 0; j < count; ++j) {
            const int64_t at_j = index[av ? j : 0];
            if (at_j != current) {
              grad[current] += run_sum;
              current = at_j;
              run_sum = 0.0f;
            }
            run_sum += gd[j];
          }
          grad[current] += run_sum;
          break;
        }
        default:
          break;  // integer results carry no gradient
      }
    }
  }

  // Each differentiable leaf's adjoint into its gradient at (batch, head, query or 0,
  // keys or 0).
  void deposit(int64_t batch, int64_t head, int64_t query, int64_t first_key, int64_t count,
               const int64_t* flows) {
    const int64_t* in = program_.inputs.data_ptr<int64_t>();
    for (int64_t i = 0; i < program_.inputs.size(0); ++i) {
      const int64_t slot = in[3 * i];
      if (in[3 * i + 1] != LEAF || !flows[slot]) continue;
      const at::Tensor& grad = gradients_->leaves[in[3 * i + 2]];
      if (!grad.defined()) continue;
      float* data = grad.data_ptr<float>() + batch * grad.stride(0) + head * grad.stride(1) +
                    (grad.size(2) > 1 ? query * grad.stride(2) : 0);
      const float* adjoint = g(slot);
      if (vector(slot)) {
        float* row = data + first_key * grad.stride(3);
        for (int64_t j = 0; j < count; ++j) row[j * grad.stride(3)] += adjoint[j];
      } else {
        data[0] += adjoint[0];
      }
    }
  }

  float* f(int64_t slot) { return floats_.data() + slot * PROGRAM_CHUNK; }
  int64_t* n(int64_t slot) { return ints_.data() + slot * PROGRAM_CHUNK; }
  bool vector(int64_t slot) const {
    return types_[slot] == FLOAT_VECTOR || types_[slot] == INT_VECTOR;
  }

  template <class T>
  static T leaf_at(const at::Tensor& leaf, int64_t batch, int64_t head, int64_t query,
                   int64_t key) {
    const T* data = leaf.data_ptr<T>();
    return data[batch * leaf.stride(0) + head * leaf.stride(1) +
                (leaf.size(2) > 1 ? query * leaf.stride(2) : 0) +
                (leaf.size(3) > 1 ? key * leaf.stride(3) : 0)];
  }

  void load_scalars(int64_t batch, int64_t head, int64_t query) {
    const int64_t* in = program_.inputs.data_ptr<int64_t>();
    for (int64_t i = 0; i < program_.inputs.size(0); ++i) {
      const int64_t slot = in[3 * i], source = in[3 * i + 1];
      if (vector(slot) || source == CONSTANT) continue;
      if (source == QUERY && types_[slot] == INT_SCALAR) n(slot)[0] = query;
      if (source == QUERY && types_[slot] == FLOAT_SCALAR) f(slot)[0] = static_cast<float>(query);
      if (source == BATCH) n(slot)[0] = batch;
      if (source == HEAD) n(slot)[0] = head;
      if (source == LEAF) {
        const at::Tensor& leaf = program_.leaves[in[3 * i + 2]];
        if (types_[slot] == FLOAT_SCALAR) {
          f(slot)[0] = leaf_at<float>(leaf, batch, head, query, 0);
        } else {
          n(slot)[0] = leaf_at<int64_t>(leaf, batch, head, query, 0);
        }
      }
    }
  }

  void load_vectors(int64_t batch, int64_t head, int64_t first_key, int64_t count) {
    const int64_t* in = program_.inputs.data_ptr<int64_t>();
    for (int64_t i = 0; i < program_.inputs.size(0); ++i) {
      const int64_t slot = in[3 * i], source = in[3 * i + 1];
      if (!vector(slot)) continue;
      if (source == KEY && types_[slot] == INT_VECTOR) {
        int64_t* out = n(slot);
        for (int64_t j = 0; j < count; ++j) out[j] = first_key + j;
        continue;
      }
      if (source == KEY) {  // as floats: exact below 2^24, which Python checked
        float* out = f(slot);
        for (int64_t j = 0; j < count; ++j) out[j] = static_cast<float>(first_key + j);
        continue;
      }
      const at::Tensor& leaf = program_.leaves[in[3 * i + 2]];  // a per-key leaf
      const int64_t offset = batch * leaf.stride(0) + head * leaf.stride(1), step = leaf.stride(3);
      if (types_[slot] == FLOAT_VECTOR) {
        const float* data = leaf.data_ptr<float>() + offset + first_key * step;
        float* out = f(slot);
        for (int64_t j = 0; j < count; ++j) out[j] = data[j * step];
      } else {
        const int64_t* data = leaf.data_ptr<int64_t>() + offset + first_key * step;
        int64_t* out = n(slot);
        for (int64_t j = 0; j < count; ++j) out[j] = data[j * step];
      }
    }
  }

  // out[j] = op(a[j], b[j]), a scalar operand read as its one value.
  template <class A, class B, class R, class Op>
  void binary(const A* a, bool a_vector, const B* b, bool b_vector, R* out, int64_t count,
              Op op) {
    if (a_vector && b_vector) {
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = op(a[j], b[j]);
    } else if (a_vector) {
      const B s = b[0];
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = op(a[j], s);
    } else if (b_vector) {
      const A s = a[0];
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = op(s, b[j]);
    } else {
      const R value = op(a[0], b[0]);
      std::fill(out, out + count, value);
    }
  }

  template <class A, class R, class Op>
  void unary(const A* a, bool a_vector, R* out, int64_t count, Op op) {
    if (a_vector) {
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = op(a[j]);
    } else {
      std::fill(out, out + count, op(a[0]));
    }
  }

  // out[j] = condition[j] ? x[j] : y[j], each operand a vector or a scalar; the usual
  // case, a vector condition and value with a scalar fill (−inf), in one simd loop.
  template <class T>
  static void where(const int64_t* condition, bool cv, const T* x, bool xv, const T* y,
                    bool yv, T* out, int64_t count) {
    if (cv && xv && !yv) {
      const T fill = y[0];
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = condition[j] != 0 ? x[j] : fill;
      return;
    }
    if (cv && !xv && !yv) {  // a mask alone: where(allowed, 0, −inf)
      const T take = x[0], fill = y[0];
#pragma omp simd
      for (int64_t j = 0; j < count; ++j) out[j] = condition[j] != 0 ? take : fill;
      return;
    }
    for (int64_t j = 0; j < count; ++j) {
      out[j] = condition[cv ? j : 0] != 0 ? x[xv ? j : 0] : y[yv ? j : 0];
    }
  }

  // Runs every instruction on `count` keys; true when the last one wrote the output into
  // `target` instead of its slot.
  bool run(int64_t count, float* target) {
    const int64_t* ops = program_.code.data_ptr<int64_t>();
    const int64_t last = program_.code.size(0) - 1;
    const bool direct = last >= 0 && ops[5 * last + 1] == program_.output &&
                        types_[program_.output] == FLOAT_VECTOR;
    const int64_t keys = count;
    for (int64_t i = 0; i <= last; ++i) {
      const int64_t* op = ops + 5 * i;
      const int64_t dst = op[1], a = op[2], b = op[3], c = op[4];
      // An instruction whose operands are all per-row scalars computes one value.
      count = vector(dst) ? keys : 1;
      const bool av = vector(a), bv = op[0] == F_GATHER || op[0] == I_GATHER ? false : vector(b);
      float* fo = direct && i == last && target != nullptr ? target : f(dst);
      int64_t* io = n(dst);
      switch (op[0]) {
        case F_ADD: binary(f(a), av, f(b), bv, fo, count, [](float x, float y) { return x + y; }); break;
        case F_SUB: binary(f(a), av, f(b), bv, fo, count, [](float x, float y) { return x - y; }); break;
        case F_MUL: binary(f(a), av, f(b), bv, fo, count, [](float x, float y) { return x * y; }); break;
        case F_DIV: binary(f(a), av, f(b), bv, fo, count, [](float x, float y) { return x / y; }); break;
        case F_MIN:  // NaN wins, as in torch.minimum
          binary(f(a), av, f(b), bv, fo, count,
                 [](float x, float y) { return (x < y || x != x) ? x : y; });
          break;
        case F_MAX:
          binary(f(a), av, f(b), bv, fo, count,
                 [](float x, float y) { return (x > y || x != x) ? x : y; });
          break;
        case F_NEG: unary(f(a), av, fo, count, [](float x) { return -x; }); break;
        case F_ABS: unary(f(a), av, fo, count, [](float x) { return std::fabs(x); }); break;
        case F_EXP: unary(f(a), av, fo, count, [](float x) { return std::exp(x); }); break;
        case F_LOG: unary(f(a), av, fo, count, [](float x) { return std::log(x); }); break;
        case F_SQRT: unary(f(a), av, fo, count, [](float x) { return std::sqrt(x); }); break;
        case I_ADD: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x + y; }); break;
        case I_SUB: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x - y; }); break;
        case I_MUL: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x * y; }); break;
        case I_FLOOR_DIV:
        case I_MOD: {
          const int64_t* divisor = n(b);
          for (int64_t j = 0; j < (bv ? count : 1); ++j) {
            TORCH_CHECK(divisor[j] != 0, "ZeroDivisionError: integer division by zero in a mod");
          }
          if (op[0] == I_FLOOR_DIV) {
            binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) {
              const int64_t q = x / y;
              return (x % y != 0 && ((x < 0) != (y < 0))) ? q - 1 : q;
            });
          } else {
            binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) {
              const int64_t r = x % y;
              return (r != 0 && ((r < 0) != (y < 0))) ? r + y : r;
            });
          }
          break;
        }
        case I_MIN: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x < y ? x : y; }); break;
        case I_MAX: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x > y ? x : y; }); break;
        case I_NEG: unary(n(a), av, io, count, [](int64_t x) { return -x; }); break;
        case I_ABS: unary(n(a), av, io, count, [](int64_t x) { return x < 0 ? -x : x; }); break;
        case F_LT: binary(f(a), av, f(b), bv, io, count, [](float x, float y) -> int64_t { return x < y; }); break;
        case F_LE: binary(f(a), av, f(b), bv, io, count, [](float x, float y) -> int64_t { return x <= y; }); break;
        case F_EQ: binary(f(a), av, f(b), bv, io, count, [](float x, float y) -> int64_t { return x == y; }); break;
        case F_NE: binary(f(a), av, f(b), bv, io, count, [](float x, float y) -> int64_t { return x != y; }); break;
        case I_LT: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) -> int64_t { return x < y; }); break;
        case I_LE: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) -> int64_t { return x <= y; }); break;
        case I_EQ: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) -> int64_t { return x == y; }); break;
        case I_NE: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) -> int64_t { return x != y; }); break;
        case I_AND: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x & y; }); break;
        case I_OR: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x | y; }); break;
        case I_XOR: binary(n(a), av, n(b), bv, io, count, [](int64_t x, int64_t y) { return x ^ y; }); break;
        case I_NOT: unary(n(a), av, io, count, [](int64_t x) -> int64_t { return x ^ 1; }); break;
        case TO_FLOAT: unary(n(a), av, fo, count, [](int64_t x) { return static_cast<float>(x); }); break;
        case TO_INT: unary(f(a), av, io, count, [](float x) { return static_cast<int64_t>(x); }); break;
        case F_WHERE: where(n(a), av, f(b), vector(b), f(c), vector(c), fo, count); break;
        case F_CLAMP: {  // NaN-propagating maximum, then minimum, as torch.clamp
          const float *low = f(b), *high = f(c);
          const bool lv = vector(b), hv = vector(c);
          const float* x = f(a);
          for (int64_t j = 0; j < count; ++j) {
            const float u = x[av ? j : 0], l = low[lv ? j : 0], h = high[hv ? j : 0];
            const float m = (u > l || u != u) ? u : l;
            fo[j] = (m < h || m != m) ? m : h;
          }
          break;
        }
        case I_WHERE: where(n(a), av, n(b), vector(b), n(c), vector(c), io, count); break;
        case WRAP_INDEX: {
          const int64_t size = n(b)[0];
          const int64_t* index = n(a);
          for (int64_t j = 0; j < (av ? count : 1); ++j) {
            const int64_t at = index[j] < 0 ? index[j] + size : index[j];
            TORCH_CHECK_INDEX(0 <= at && at < size, "index ", index[j],
                              " is out of bounds for a dimension of size ", size);
            io[j] = at;
          }
          if (!av) std::fill(io + 1, io + count, io[0]);
          break;
        }
        case F_GATHER:
        case I_GATHER: {
          const at::Tensor& table = program_.tables[c];
          const int64_t* index = n(a);
          if (op[0] == F_GATHER && av) {
            const float* data = table.data_ptr<float>();
#pragma omp simd
            for (int64_t j = 0; j < count; ++j) fo[j] = data[index[j]];
          } else if (op[0] == F_GATHER) {
            std::fill(fo, fo + count, table.data_ptr<float>()[index[0]]);
          } else {
            const int64_t* data = table.data_ptr<int64_t>();
            for (int64_t j = 0; j < count; ++j) io[j] = data[index[av ? j : 0]];
          }
          break;
        }
        default: TORCH_CHECK(false, "unknown opcode ", op[0]);
      }
    }
    return direct && target != nullptr;
  }

  ProgramGradients* gradients_;
  int64_t thread_;
  const ModProgram& program_;
  int64_t slots_;
  const int64_t* types_;
  std::vector<float> floats_;
  std::vector<int64_t> ints_;
  std::vector<float> adjoints_;
};

}  // namespace playground_native
