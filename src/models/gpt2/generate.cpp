// KV-cache inference and sampling for GPT-2; see generate.h.
#include "models/gpt2/generate.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/autograd.h"
#include "core/error.h"

namespace mw::gpt2 {

namespace {

void layer_norm(const float* x, const float* w, const float* b, int64_t n, double eps, float* out) {
  double mean = 0, var = 0;
  for (int64_t i = 0; i < n; ++i) mean += x[i];
  mean /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  var /= static_cast<double>(n);
  const double inv = 1.0 / std::sqrt(var + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>((x[i] - mean) * inv) * w[i] + b[i];
}

// out[n_out] = x[n_in] @ w[n_in, n_out] + b (HF Conv1D layout); accumulate adds to out instead.
void linear(const float* x, const float* w, const float* b, int64_t n_in, int64_t n_out, float* out,
            bool accumulate = false) {
  if (!accumulate)
    std::copy(b, b + n_out, out);
  else
    for (int64_t i = 0; i < n_out; ++i) out[i] += b[i];
  cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(n_in), static_cast<int>(n_out), 1.0f, w,
              static_cast<int>(n_out), x, 1, 1.0f, out, 1);
}

float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

}  // namespace

const float* KvCacheDecoder::weight(const std::string& name) {
  const Tensor& t = model_.parameter(name);
  MW_CHECK_T(InvalidArgument, t.device().is_host_addressable(), "generation reads weights on ",
             "the host; parameter ", name, " is on ", t.device().str());
  if (t.dtype() == DType::F32 && t.is_contiguous()) return t.data<float>();
  converted_.push_back(t.to(DType::F32).contiguous());
  return converted_.back().data<float>();
}

KvCacheDecoder::KvCacheDecoder(const GPT2& model) : model_(model), config_(model.config()) {
  const int64_t C = config_.n_embd;
  wte_ = weight("transformer.wte.weight");
  wpe_ = weight("transformer.wpe.weight");
  lnf_w_ = weight("transformer.ln_f.weight");
  lnf_b_ = weight("transformer.ln_f.bias");
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    Layer layer{weight(p + "ln_1.weight"),
                weight(p + "ln_1.bias"),
                weight(p + "attn.c_attn.weight"),
                weight(p + "attn.c_attn.bias"),
                weight(p + "attn.c_proj.weight"),
                weight(p + "attn.c_proj.bias"),
                weight(p + "ln_2.weight"),
                weight(p + "ln_2.bias"),
                weight(p + "mlp.c_fc.weight"),
                weight(p + "mlp.c_fc.bias"),
                weight(p + "mlp.c_proj.weight"),
                weight(p + "mlp.c_proj.bias"),
                std::vector<float>(config_.n_positions * C),
                std::vector<float>(config_.n_positions * C)};
    layers_.push_back(std::move(layer));
  }
  x_.resize(C);
  h_.resize(C);
  qkv_.resize(3 * C);
  att_.resize(C);
  // n_inner (4C when unset): it ran 4C wide, reading past the weights, until session 38.
  fc_.resize(config_.mlp_width());
  scores_.resize(config_.n_positions);
  logits_.resize(config_.vocab_size);
}

// Causal attention of the current position over positions 0..position_ (the cache already holds
// this position's keys and values): out[C] = concat over heads of softmax(q k^T / sqrt(hs)) v.
void KvCacheDecoder::attention(Layer& layer, const float* qkv, float* out) {
  const int64_t C = config_.n_embd, H = config_.n_head, hs = C / H, T = position_ + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t h = 0; h < H; ++h) {
    const float* q = qkv + h * hs;
    float* scores = scores_.data();
    float max_score = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < T; ++t) {
      const float* k = layer.keys.data() + t * C + h * hs;
      float s = 0;
      for (int64_t i = 0; i < hs; ++i) s += q[i] * k[i];
      scores[t] = s * scale;
      max_score = std::max(max_score, scores[t]);
    }
    float sum = 0;
    for (int64_t t = 0; t < T; ++t) sum += scores[t] = std::exp(scores[t] - max_score);
    float* y = out + h * hs;
    std::fill(y, y + hs, 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const float p = scores[t] / sum;
      const float* v = layer.values.data() + t * C + h * hs;
      for (int64_t i = 0; i < hs; ++i) y[i] += p * v[i];
    }
  }
}

const std::vector<float>& KvCacheDecoder::feed(int32_t token) {
  const int64_t C = config_.n_embd, V = config_.vocab_size, F = config_.mlp_width();
  MW_CHECK_T(InvalidArgument, token >= 0 && token < V, "token id ", token,
             " is outside the model's vocabulary [0, ", V, ")");
  MW_CHECK_T(InvalidArgument, position_ < config_.n_positions, "the context is full: the model ",
             "has n_positions ", config_.n_positions, "; use a shorter prompt or fewer new tokens");
  NoGradGuard no_grad;
  const double eps = config_.layer_norm_epsilon;
  for (int64_t i = 0; i < C; ++i) x_[i] = wte_[token * C + i] + wpe_[position_ * C + i];
  for (Layer& layer : layers_) {
    layer_norm(x_.data(), layer.ln1_w, layer.ln1_b, C, eps, h_.data());
    linear(h_.data(), layer.attn_w, layer.attn_b, C, 3 * C, qkv_.data());
    std::copy(qkv_.begin() + C, qkv_.begin() + 2 * C, layer.keys.begin() + position_ * C);
    std::copy(qkv_.begin() + 2 * C, qkv_.begin() + 3 * C, layer.values.begin() + position_ * C);
    attention(layer, qkv_.data(), att_.data());
    linear(att_.data(), layer.proj_w, layer.proj_b, C, C, x_.data(), /*accumulate=*/true);
    layer_norm(x_.data(), layer.ln2_w, layer.ln2_b, C, eps, h_.data());
    linear(h_.data(), layer.fc_w, layer.fc_b, C, F, fc_.data());
    for (float& f : fc_) f = gelu_tanh(f);
    linear(fc_.data(), layer.fc_proj_w, layer.fc_proj_b, F, C, x_.data(), /*accumulate=*/true);
  }
  layer_norm(x_.data(), lnf_w_, lnf_b_, C, eps, h_.data());
  // logits[V] = wte[V, C] @ h (the head tied to the token embedding).
  cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(V), static_cast<int>(C), 1.0f, wte_,
              static_cast<int>(C), h_.data(), 1, 0.0f, logits_.data(), 1);
  ++position_;
  return logits_;
}

Sampler::Sampler(SamplingOptions options) : options_(options), state_(options.seed) {
  MW_CHECK_T(InvalidArgument, options.temperature >= 0 && std::isfinite(options.temperature),
             "temperature ", options.temperature, " must be >= 0 (0 is greedy)");
  MW_CHECK_T(InvalidArgument, options.top_k >= 0, "top_k ", options.top_k, " must be >= 0");
  MW_CHECK_T(InvalidArgument, options.top_p >= 0 && options.top_p <= 1, "top_p ", options.top_p,
             " must be in [0, 1] (0 keeps the most likely token alone)");
  MW_CHECK_T(InvalidArgument,
             options.repetition_penalty > 0 && std::isfinite(options.repetition_penalty),
             "repetition penalty ", options.repetition_penalty, " must be > 0 (1 is none)");
}

// SplitMix64: a fixed, portable sequence for a seed (std:: distributions are not portable).
double Sampler::uniform() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

int32_t Sampler::next(const std::vector<float>& logits_in, const std::vector<int32_t>& context) {
  const int32_t V = static_cast<int32_t>(logits_in.size());
  // A NaN has no place in the order the sort needs (its comparisons would make it undefined), and
  // +Inf no probability: the weights have diverged or the forward overflowed. -Inf is an id never
  // drawn.
  for (int32_t i = 0; i < V; ++i)
    if (std::isnan(logits_in[i]) || logits_in[i] == std::numeric_limits<float>::infinity())
      throw Error(str("sampling: the model's logit for id ", i, " is ", logits_in[i],
                      ", not finite: its weights have diverged or its forward overflowed (fp16: "
                      "try bf16); nothing can be drawn from it"));
  const std::vector<float>* use = &logits_in;
  if (options_.repetition_penalty != 1) {  // Note [Repetition penalty]
    penalized_ = logits_in;
    const auto p = static_cast<float>(options_.repetition_penalty);
    for (int32_t id : context) {  // from the input logit: an id seen twice is penalized once
      if (id < 0 || id >= V) continue;
      const float l = logits_in[id];
      penalized_[id] = l < 0 ? l * p : l / p;
    }
    use = &penalized_;
  }
  const std::vector<float>& logits = *use;
  if (options_.temperature == 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  candidates_.resize(V);
  for (int32_t i = 0; i < V; ++i) candidates_[i] = {logits[i], i};
  // Most likely first; equal logits by id, so the order (and the draw) is deterministic.
  auto more_likely = [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  int64_t kept = V;
  if (options_.top_k > 0 && options_.top_k < V) {
    kept = options_.top_k;
    std::partial_sort(candidates_.begin(), candidates_.begin() + kept, candidates_.end(),
                      more_likely);
    // Every logit equal to the k-th stays, as transformers' TopKLogitsWarper removes only those
    // below it (they were cut at k by id until session 38).
    const float kth = candidates_[kept - 1].first;
    const auto tied_end = std::partition(candidates_.begin() + kept, candidates_.end(),
                                         [&](const auto& c) { return c.first == kth; });
    std::sort(candidates_.begin() + kept, tied_end, more_likely);
    kept = tied_end - candidates_.begin();
  } else {
    std::sort(candidates_.begin(), candidates_.end(), more_likely);
  }
  std::vector<double> probs(kept);
  double sum = 0;
  for (int64_t i = 0; i < kept; ++i)
    sum += probs[i] =
        std::exp((candidates_[i].first - candidates_[0].first) / options_.temperature);
  if (options_.top_p < 1) {
    double cumulative = 0;
    int64_t n = 0;
    while (n < kept && cumulative < options_.top_p * sum) cumulative += probs[n++];
    kept = std::max<int64_t>(n, 1);
    sum = cumulative > 0 ? cumulative : probs[0];
  }
  double r = uniform() * sum;
  for (int64_t i = 0; i < kept; ++i) {
    r -= probs[i];
    if (r < 0) return candidates_[i].second;
  }
  return candidates_[kept - 1].second;
}

std::vector<int32_t> generate(const GPT2& model, const std::vector<int32_t>& prompt,
                              int64_t max_new_tokens, const SamplingOptions& options,
                              const std::function<bool(int32_t)>& on_token, Slide* slide) {
  MW_CHECK_T(InvalidArgument, !prompt.empty(), "generation needs a prompt of at least one token ",
             "(GPT-2 starts unconditional samples from <|endoftext|>)");
  const int64_t n_positions = model.config().n_positions;
  const auto prompt_size = static_cast<int64_t>(prompt.size());
  MW_CHECK_T(InvalidArgument, slide || prompt_size <= n_positions, "the prompt is ", prompt_size,
             " tokens and the model's context holds ", n_positions,
             " (n_positions): shorten the prompt to at most ", n_positions, " tokens");
  KvCacheDecoder decoder(model);
  Sampler sampler(options);
  // The tokens in the KV cache (Note [Sliding context]), and the logits after the last of them.
  std::vector<int32_t> window(prompt.end() - std::min(prompt_size, n_positions), prompt.end());
  if (slide) slide->prompt_dropped = prompt_size - static_cast<int64_t>(window.size());
  const std::vector<float>* logits = nullptr;
  for (int32_t id : window) logits = &decoder.feed(id);
  std::vector<int32_t> generated, context = prompt;
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int32_t id = sampler.next(*logits, context);
    generated.push_back(id);
    context.push_back(id);
    if (on_token && !on_token(id)) break;
    if (i + 1 == max_new_tokens) break;
    window.push_back(id);
    if (decoder.position() < n_positions) {
      logits = &decoder.feed(id);
      continue;
    }
    if (!slide) break;  // the next token would have no position
    window.erase(window.begin(), window.end() - std::max<int64_t>(1, n_positions / 2));
    decoder.reset();
    for (int32_t kept : window) logits = &decoder.feed(kept);
    ++slide->slides;
  }
  return generated;
}

}  // namespace mw::gpt2
