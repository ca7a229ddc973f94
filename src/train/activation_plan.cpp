// The activation arithmetic of the memory plan (activation_plan.h, Note [Activation arithmetic]
// in memory_plan.h).
#include "train/activation_plan.h"

#include <algorithm>
#include <cmath>

#include "core/allocator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"

namespace mw::train {

namespace {
// On the host devices a 16-bit op widens its operands to f32, runs the f32 kernel and rounds
// its result (Note [Low-precision storage]), so its f32 copies are alive for the call. The
// largest: the LM head's products, which widen blocks of at most 2048 x 2048 (mixed::gemm), and
// a block's backward, where the MLP's output projection widens dy [N, C], x [N, F] and w [F, C]
// and gets dx [N, F] and dw [F, C] in f32 (with wte's f32 gradient alive), or the attention
// widens dout and qkv and gets dqkv in f32 (the probabilities it recomputes from the row
// statistics are per-task scratch: Note [Row statistics instead of probabilities]).
template <typename Round>
void host_low_transients(Activations& a, const PlanInputs& in, const Round& r) {
  const Config& c = in.config;
  const double B = static_cast<double>(in.batch), T = static_cast<double>(in.seq), N = B * T;
  const double C = static_cast<double>(c.n_embd), F = static_cast<double>(c.mlp_width());
  const double V = static_cast<double>(c.vocab_size);
  const auto blk = [](double n) { return std::min(n, 2048.0); };
  // mixed::gemm of an [M, K] by [K, Nout] product: the f32 accumulator and two widened blocks.
  const auto gemm = [&](double M, double Nout, double K) {
    return r(blk(M) * blk(Nout) * 4) + r(blk(M) * blk(K) * 4) + r(blk(K) * blk(Nout) * 4);
  };
  const double head_dx = r(V * C * 2) + r(N * C * 2) + gemm(N, C, V);  // the cast table, dx
  const double head_dt = r(N * C * 2) + r(V * C * 2) + gemm(V, C, N);  // dx, dt
  a.head_backward = std::max(head_dx, head_dt);
  const double mlp = r(N * C * 4) + 2 * r(N * F * 4) + 2 * r(F * C * 4) + r(N * F * 2);
  const double attention = r(N * C * 4) + 2 * r(3 * N * C * 4) + r(3 * N * C * 2);
  a.attention_backward = std::max(mlp, attention);
  a.attention_backward_beside_grads = std::max(mlp - 2 * r(F * C * 4), attention);
}
}  // namespace

// Note [Activations under autocast]: with --precision bf16|fp16 (autograd/autocast.h) the
// residual stream, the layernorms' inputs and statistics, the log-sum-exps and the host attention's
// row statistics stay f32 (e); what
// the linears save (their cast inputs), qkv, the attention output, GELU's input and output and the
// logits are 16-bit (el). At the LM head's backward the
// gradient of the table is rounded to 16 bits and widened into the f32 master's gradient (both
// alive), and on CUDA the cross-entropy's backward widens the logits to f32 and rounds its
// gradient into a new 16-bit tensor (the logits, an f32 copy and the gradient alive at once:
// the step's peak there, measured on an H100, tests/train/memory_plan_cuda_test.cpp), while the
// LM head's products run on a padded vocabulary (Note [Padded vocabulary on CUDA]).
Activations activations(const PlanInputs& in) {
  const Config& c = in.config;
  const double e = static_cast<double>(in.dtype_bytes), C = static_cast<double>(c.n_embd);
  const bool low = in.precision != DType::F32;
  const double el = low ? 2.0 : e;
  const double B = static_cast<double>(in.batch), T = static_cast<double>(in.seq), N = B * T;
  const double V = static_cast<double>(c.vocab_size), F = static_cast<double>(c.mlp_width());
  auto r = [](double bytes) { return std::ceil(bytes / kHostAlignment) * kHostAlignment; };
  const bool cuda = in.device.is_cuda();
  Activations a;
  a.input = r(N * C * e);
  const double stats = 4 * r(N * e);  // two layernorms, mean and rstd each
  // Attention keeps each row's softmax max and 1/sum [B, NH, T, 2] on the host devices (f32 under
  // autocast; Note [Row statistics instead of probabilities]), its log-sum-exp [B, NH, T] (f32) on
  // CUDA (Note [Attention on CUDA by query blocks]); the probabilities are per-task scratch.
  const double BNHT = B * static_cast<double>(c.n_head) * T;
  const double attention = cuda ? r(BNHT * 4) : r(BNHT * 2 * (low ? 4 : e));
  a.block =
      2 * a.input + 3 * r(N * C * el) + r(3 * N * C * el) + 2 * r(N * F * el) + stats + attention;
  a.head = a.input + r(N * C * el) + 3 * r(N * e);
  a.logits = r(N * V * el);
  // dx [N, C] and wte's gradient [V, C] (16-bit, then widened to f32 under autocast).
  a.backward_extra = r(N * C * el) + r(V * C * el) + (low ? r(V * C * 4) : 0);
  if (cuda && low) {
    const double Vp = std::ceil(V / 8) * 8;
    const double loss_backward = r(N * V * 4) + r(N * V * el);
    const double head_backward = r(N * Vp * el) + r(N * C * el) + r(Vp * C * el) + r(V * C * 4);
    a.backward_extra = std::max(loss_backward, head_backward);
  }
  a.mlp_grad = r(N * F * el);
  a.weight_grad = r(F * C * e);
  if (!cuda && low) host_low_transients(a, in, r);
  if (cuda) {
    const double BNH = B * static_cast<double>(c.n_head);
    const auto rows =
        static_cast<double>(ops::cuda_attention_block_rows(in.batch, c.n_head, in.seq));
    const double acc = low ? 4 : e;  // Note [Low-precision attention on CUDA]: f32 sums
    // dqkv, q k v dO, dq dk dv, the two score buffers and (16-bit) their rounded copies.
    a.attention_backward = r(3 * N * C * el) + r(4 * N * C * el) + r(3 * N * C * acc) +
                           r(2 * BNH * rows * T * acc) + (low ? r(2 * BNH * rows * T * el) : 0);
    a.attention_backward_beside_grads = a.attention_backward;
  }
  return a;
}

Recomputation recomputation(const PlanInputs& in, const Activations& a, std::string* name) {
  const int64_t L = in.config.n_layer;
  if (!in.checkpoint_every_block && in.checkpoint_segments < 0) {
    *name = "none";
    return {};
  }
  std::vector<nn::Segment> segments;
  if (in.checkpoint_segments >= 0) {
    const int64_t k =
        in.checkpoint_segments == 0 ? nn::sqrt_segments(L) : std::min(in.checkpoint_segments, L);
    segments = nn::plan_segments(L, k);
    *name = str(segments.size(), " segments");
  } else {
    for (int64_t i = 0; i < L; ++i) segments.push_back({i, i + 1, true});
    *name = "every block";
  }
  Recomputation r;
  for (const auto& s : segments) {
    if (s.checkpointed) {
      r.stored += a.input;
      r.inputs += a.input;
      r.longest = std::max(r.longest, static_cast<double>(s.end - s.begin));
    } else {
      r.stored += static_cast<double>(s.end - s.begin) * a.block;
    }
  }
  return r;
}

double recomputing_bytes(const Activations& a, const Recomputation& r) {
  return r.longest * a.block - a.input + a.backward_extra + a.mlp_grad;
}

double head_backward_bytes(const Activations& a) {
  return std::max(a.backward_extra, a.head_backward);
}

// Measured: 1 block of width 512, B4 T16, vocabulary 257 on sim, 22 MiB against 17.5 planned from
// the LM head's moment alone, before the weight's gradient was counted.
double block_backward_bytes(const Activations& a) {
  return std::max(a.mlp_grad + a.weight_grad, a.attention_backward);
}

// Two moments compete: the LM head's backward (the logits and their gradient) and, on CUDA, the
// last block's attention backward (its workspace, with the incoming gradient [N, C]).
double activation_peak(const PlanInputs& in, const Activations& a, std::string* name) {
  const double at_head = a.head + a.logits + head_backward_bytes(a);
  const Recomputation r = recomputation(in, a, name);
  const double block_backward = block_backward_bytes(a);
  if (r.longest == 0)
    return static_cast<double>(in.config.n_layer) * a.block +
           std::max(at_head, a.input + block_backward);
  const double recomputing = recomputing_bytes(a, r) - a.mlp_grad + block_backward;
  // The segment that is not checkpointed is the last: its backward, and the freeing of its saved
  // tensors, come before any recomputation, which has only the checkpoints' inputs beside it.
  return std::max(r.stored + at_head, r.inputs + recomputing);
}

}  // namespace mw::train
