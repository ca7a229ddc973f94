// Which elements the trainer's weight decay leaves alone, per tensor its optimizer steps (Note
// [Weight decay by ranges], optim/decay_ranges.h). Gemini makes its chunks' ranges itself from
// decayed_parameters() (GeminiOptions::tensor_decays), and takes its other per-tensor flag, which
// tensors may be copied to the device in 16 bits, from set_low_copies.
#include "models/gpt2/spec.h"
#include "train/data_parallel.h"
#include "train/trainer.h"

namespace mw::train {

std::vector<char> Trainer::decayed_parameters() const {
  std::vector<char> out;
  for (const gpt2::TensorSpec& spec : gpt2::tensor_specs(config_))
    out.push_back(optim::decays(static_cast<int64_t>(spec.shape.size()), o_.decay_on) ? 1 : 0);
  return out;
}

// Without Gemini the optimizer steps the model's parameters, or under ZeRO this rank's pieces of
// them: each piece is part of one parameter, so it is decayed whole or not at all.
std::vector<optim::NoDecayRanges> Trainer::optimizer_no_decay() const {
  const std::vector<char> decays = decayed_parameters();
  std::vector<optim::NoDecayRanges> out;
  auto add = [&](size_t param, int64_t numel) {
    out.push_back(decays.at(param) ? optim::NoDecayRanges()
                                   : optim::NoDecayRanges{{int64_t{0}, numel}});
  };
  if (dp_ && dp_->zero_stage() > 0) {
    for (const ShardPiece& piece : dp_->pieces(dp_->rank())) add(piece.param, piece.numel);
  } else {
    const std::vector<Tensor> params = model_->parameters();
    for (size_t p = 0; p < params.size(); ++p) add(p, params[p].numel());
  }
  return out;
}

// Note [16-bit copies] (offload/gemini/low_copies.cpp): under --precision bf16|fp16.
void set_low_copies(const TrainOptions& o, const gpt2::Config& config, gemini::GeminiOptions& g) {
  if (!o.gemini_low_copies || o.precision == DType::F32) return;
  g.low_copies = o.precision;
  g.low_copy_tensors = gpt2::read_only_by_products(config);
}

}  // namespace mw::train
