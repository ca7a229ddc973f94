// The Trainer's data-parallel parts (trainer.h, data_parallel.h): what a multi-rank run refuses,
// the split of the global batch, and the closing report of communication and per-rank memory.
//
// Note [Global batch]: --batch is the GLOBAL batch. Every rank reads the same micro-batch of the
// data (Note [Data position]: the same index on every rank, so a checkpoint resumes at any number
// of ranks) and keeps rows [r B/N, (r+1) B/N) of it; the mean of the ranks' mean gradients is then
// the global batch's mean gradient, as one process computes it (up to the summation order).
// Each rank draws the dropout masks of its rows as one process draws them for those rows (Note
// [Dropout under data parallel], autograd/functions.h), so runs with dropout are equal across rank
// counts to rounding too.
#include <csignal>
#include <filesystem>

#include "autograd/functions.h"
#include "core/numbers.h"
#include "train/data_parallel.h"
#include "train/trainer.h"
#include "train/zero_state_file.h"

namespace mw::train {

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void refuse_not_implemented(bool given, const char* what) {
  MW_CHECK_T(InvalidArgument, !given, what,
             " is not implemented yet (issue #15); run without it, or with one process");
}

}  // namespace

bool Trainer::is_root() const { return !dp_ || dp_->rank() == 0; }

int64_t Trainer::local_batch() const { return dp_ ? o_.batch / dp_->size() : o_.batch; }

void Trainer::keep_rank_rows(std::vector<int32_t>& tokens) const {
  const int64_t rows = local_batch(), first = rows * dp_->rank();
  if (rows == o_.batch) return;
  tokens.erase(tokens.begin(), tokens.begin() + first * o_.seq);
  tokens.resize(static_cast<size_t>(rows * o_.seq));
}

void Trainer::check_data_parallel_options() const {
  const int n = o_.comm->size();
  MW_CHECK_T(InvalidArgument, o_.batch % n == 0, "--batch ", o_.batch,
             " is the global batch, split across the ", n, " ranks, so it must be a multiple of ",
             n, "; use --batch ", (o_.batch / n + 1) * n);
  // Note [Gemini under data parallel]: replicated chunks, gradients all_reduced per chunk.
  refuse_not_implemented(!o_.gemini.empty() && o_.zero_stage > 0,
                         "--gemini with --zero 1-3 (Gemini's chunks sharded across ranks; under "
                         "Gemini every rank holds every chunk, --zero 0)");
  refuse_not_implemented(!o_.gemini.empty() && o_.gemini_options.host_capacity_bytes > 0,
                         "--host-capacity (three tiers) with several ranks");
  refuse_not_implemented(o_.device.is_cuda(), "--device cuda with several ranks (NCCL backend)");
}

// ZeRO 3 builds the model into its buckets (Note [ZeRO stage 3]): the DataParallel comes first.
std::unique_ptr<DataParallel> Trainer::make_zero3(gpt2::ParameterFactory& factory) {
  check_data_parallel_options();
  std::vector<std::pair<std::string, Shape>> tensors;
  for (const auto& spec : gpt2::tensor_specs(config_)) tensors.emplace_back(spec.name, spec.shape);
  auto dp = std::make_unique<DataParallel>(o_.comm, tensors, o_.bucket_bytes, o_.device);
  DataParallel* raw = dp.get();
  factory.make = [raw](const gpt2::TensorSpec& spec) { return raw->make_parameter(spec.name); };
  factory.ready = [raw](const gpt2::TensorSpec& spec) { raw->parameter_ready(spec.name); };
  return dp;
}

void Trainer::setup_data_parallel() {
  check_data_parallel_options();
  const int n = o_.comm->size();
  if (!o_.gemini.empty()) {  // Gemini reduces its chunks' gradients (connect_gemini): no buckets
    dp_ = std::make_unique<DataParallel>(o_.comm, std::vector<Tensor>(), 0, o_.bucket_bytes);
  } else if (!dp_) {  // stages 0-2: over the built model; rank 0's weights to every rank
    dp_ = std::make_unique<DataParallel>(o_.comm, model_->parameters(), o_.zero_stage,
                                         o_.bucket_bytes);
    dp_->broadcast_parameters();  // the same initial weights everywhere, whatever each rank built
  }
  set_dropout_batch_shard({local_batch() * dp_->rank(), local_batch(), o_.batch});
  const std::string what =
      o_.gemini.empty()
          ? dp_->describe()
          : str("Data parallel: ", n, n == 1 ? " rank (" : " ranks (", o_.comm->backend(),
                "), ZeRO stage 0 under Gemini: every rank holds every chunk, each chunk's gradient "
                "all_reduced as soon as backward completes it, updates after backward");
  print_(what + str("; global batch ", o_.batch, " = ", n, " x ", local_batch(), " rows\n"));
  o_.comm->reset_stats();  // from here on: the training steps' collectives only
}

// Note [Gemini under data parallel] (offload/gemini/deferred.cpp): rank 0's chunks to every rank,
// then each chunk's gradient summed over the ranks when backward completes it, scaled to the mean.
void Trainer::connect_gemini() {
  gem_->with_parameters_readable([&] {
    std::vector<dist::Work> works;
    for (const auto& c : gem_->chunks()) works.push_back(o_.comm->broadcast(c->flat(), 0));
    for (auto& w : works) w.wait();
  });
  std::shared_ptr<dist::Communicator> comm = o_.comm;
  gemini::Gemini::GradientReduction r;
  r.start = [comm](const Tensor& grad) {
    auto work = std::make_shared<dist::Work>(comm->all_reduce(grad));
    return std::function<void()>([work] { work->wait(); });
  };
  r.scale = 1.f / static_cast<float>(comm->size());
  gem_->set_gradient_reduction(std::move(r));
  o_.comm->reset_stats();  // the broadcast is not a training step's communication
}

bool Trainer::shards_optimizer() const { return dp_ && dp_->zero_stage() > 0; }

bool Trainer::shards_parameters() const { return dp_ && dp_->shards_parameters(); }

void Trainer::save_sharded_optimizer_state(const std::string& file) {
  save_zero_state(*dp_, *opt_,
                  one_process_layout(model_->parameters(), o_.nvme, hybrid_ != nullptr), file);
}

int Trainer::stop_signal_of_any_rank(int local) {
  if (!shards_optimizer() || o_.checkpoint_dir.empty()) return local;
  const dist::CommStats before = dp_->comm().stats();
  const double any = dp_->mean_over_ranks(local != 0 ? 1.0 : 0.0);
  dp_->exclude_comm_since(before);  // not the training step's communication
  return local != 0 ? local : any > 0 ? SIGTERM : 0;
}

std::string Trainer::save_optimizer_output() {
  if (o_.save_optimizer.empty() || !optimizer_saved_.empty()) return optimizer_saved_;
  if (!is_root() && !shards_optimizer()) return "";  // rank 0 alone has anything to do
  save_optimizer_state(o_.save_optimizer);
  optimizer_saved_ = str("Saved optimizer state to ", o_.save_optimizer, "\n");
  return optimizer_saved_;
}

std::string Trainer::data_parallel_report() const {
  if (!dp_) return "";
  const DataParallelStats s = dp_->stats();
  const double steps = static_cast<double>(std::max<int64_t>(1, s.steps));
  const int64_t n = dp_->size();
  const int64_t psi = model_->num_parameters();
  const int times = dp_->shards_parameters() ? 3 : 2;  // the parameters are gathered twice
  const double formula =
      times * static_cast<double>(psi) * 4.0 * static_cast<double>(n - 1) / static_cast<double>(n);
  std::string out = str("Data parallel: ", n, " ranks, ZeRO stage ", dp_->zero_stage(),
                        " | sent per rank per step (ring):");
  for (int k = 0; k < dist::kNumCollectives; ++k)
    if (s.comm.calls[k] > 0 && s.comm.wire_bytes[k] > 0)
      out += str(" ", dist::collective_name(static_cast<dist::Collective>(k)), " ",
                 format_fixed(mib(s.comm.wire_bytes[k]) / steps, 2), " MiB");
  out +=
      str(" = ", format_fixed(mib(s.comm.total_wire_bytes()) / steps, 2), " MiB; formula ", times,
          " Psi (N-1)/N x 4 B = ", format_fixed(mib(static_cast<int64_t>(formula)), 2), " MiB\n");
  out += str("Data parallel: collectives busy ", format_fixed(s.comm.busy_ms / steps, 1),
             " ms/step, waited after backward ", format_fixed(s.backward_end_wait_ms / steps, 1),
             " ms/step (exposed), parameter all_gather ", format_fixed(s.gather_ms / steps, 1),
             " ms/step",
             s.split_reductions > 0
                 ? str("; ", format_fixed(static_cast<double>(s.split_reductions) / steps, 1),
                       " embedding gradient(s) per step reduced during backward, their rows after")
                 : std::string(),
             "\n");
  if (gem_)  // Note [Gemini under data parallel]
    return out +
           "Data parallel memory (this rank): Gemini's, as one process's (every chunk, its "
           "gradient buffer and its Adam states on every rank)\n";
  int64_t nvme_bytes = 0;
  if (hybrid_ && hybrid_->nvme()) nvme_bytes = hybrid_->offloaded_numel() * 8;
  if (dp_->shards_parameters() && s.steps > 1) {  // Note [ZeRO stage 3]: step 1 is recorded
    const auto gather = static_cast<size_t>(dist::Collective::kAllGather);
    const double later = static_cast<double>(s.steps - 1);
    out +=
        str("Data parallel: stage 3 gathered parameter buckets ",
            format_fixed(static_cast<double>(s.parameter_gathers - s.recorded_gathers) / later, 1),
            " times per step after the first (recorded) step's ", s.recorded_gathers,
            "; all_gather after it ",
            format_fixed(
                mib(s.comm.wire_bytes[gather] - s.recorded_comm.wire_bytes[gather]) / later, 2),
            " MiB/step against 2 Psi (N-1)/N x 4 B = ",
            format_fixed(mib(static_cast<int64_t>(formula * 2 / 3)), 2), " MiB; ops waited ",
            format_fixed(s.parameter_wait_ms / steps, 1), " ms/step for parameters (exposed)\n");
  }
  const std::string params =
      dp_->shards_parameters()
          ? str(format_fixed(mib(s.parameter_shard_bytes), 2), " MiB (this rank's pieces; full ",
                "parameters at most ", format_fixed(mib(s.gathered_peak_bytes), 2),
                " MiB at once in the steps, of ", format_fixed(mib(psi * 4), 2), ")")
          : str(format_fixed(mib(psi * 4), 1), " MiB");
  out += str("Data parallel memory (this rank): parameters ", params, ", gradient buffers ",
             format_fixed(mib(s.gradient_buffer_bytes), 1), " MiB, optimizer states ",
             format_fixed(mib(opt_->state_bytes_in_memory()), 1), " MiB in memory + ",
             format_fixed(mib(nvme_bytes), 1), " MiB on NVMe for ",
             format_thousands(dp_->shard_numel()), " of ", format_thousands(psi), " parameters\n");
  return out;
}

}  // namespace mw::train
