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
#include <cmath>
#include <csignal>
#include <filesystem>

#include "autograd/functions.h"
#include "core/numbers.h"
#include "models/gpt2/spec.h"
#include "optim/adam_state_file.h"
#include "train/data_parallel.h"
#include "train/trainer.h"
#include "train/zero_state_file.h"

namespace mw::train {

namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// A step's elements on the wire per rank, in units of Psi (N-1)/N: reduction 1 Psi, parameter
// gathers 1 Psi after the update (stages 0-2), or twice around the ops (stage 3: forward,
// backward). Plain ZeRO 3 under autocast sends the blocks' matrices in 2 B (Note [16-bit parameter
// gathers]); under Gemini only its sharded chunks gather around the ops, `gathered` f32 elements
// in place of their `sharded_numel` after the update (their 16-bit parts in 2 B too).
double volume_in_psi(const DataParallel& dp, int64_t psi, double gathered, int64_t sharded_numel) {
  const auto p = static_cast<double>(psi);
  if (dp.shards_parameters() && dp.low_gathers() != DType::F32)
    return 1.0 + static_cast<double>(dp.gather_bytes()) / 2.0 / p;
  if (dp.shards_parameters()) return 3.0;
  return 2.0 + (2.0 * gathered - static_cast<double>(sharded_numel)) / p;
}

// The per-rank memory line under Gemini (Notes [Sharded optimizer states], [Sharded parameters]).
std::string gemini_memory_text(gemini::Gemini& gem, int64_t psi) {
  const int64_t sharded_numel = gem.sharded_numel();
  if (gem.options().shard_ranks == 1)  // Note [Gemini under data parallel]
    return "Data parallel memory (this rank): Gemini's, as one process's (every chunk, its "
           "gradient buffer and its Adam states on every rank)\n";
  int64_t stepped = 0;
  for (const Tensor& p : gem.adam().params()) stepped += p.numel();
  const std::string params =
      gem.shards_parameters()
          ? str("parameters ", format_fixed(mib(gem.sharded_param_bytes()), 1),
                " MiB (this rank's pieces of the ", format_fixed(mib(sharded_numel * 4), 1),
                " MiB of sharded chunks) + ", format_fixed(mib((psi - sharded_numel) * 4), 1),
                " MiB of chunks on every rank")
          : str("every chunk's parameters on every rank (", format_fixed(mib(psi * 4), 1), " MiB)");
  return str("Data parallel memory (this rank): Gemini's chunks, ", params, "; Adam states ",
             format_fixed(mib(gem.adam().state_bytes_in_memory()), 1),
             " MiB in memory for this rank's pieces, ", format_thousands(stepped), " of ",
             format_thousands(psi), " parameters\n");
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
  // Note [Sharded optimizer states] (offload/gemini/shard.cpp): --zero 2 on Gemini's chunks,
  // Note [Sharded parameters]: --zero 3 (or --shard-param-frac) shards their parameters too.
  MW_CHECK_T(InvalidArgument, o_.gemini.empty() || o_.zero_stage != 1,
             "--zero 1 with --gemini: pass --zero 2. Gemini reduces each chunk's gradient as "
             "backward completes it, so sharding its Adam states shards the reduced gradient "
             "too, at no cost (stage 1 would keep it whole for nothing)");
  // Note [Buckets on CUDA] (data_parallel.cpp): plain data parallel and ZeRO 1-2 over NCCL.
  const int cuda = o_.comm->cuda_device();
  MW_CHECK_T(InvalidArgument, o_.device.is_cuda() == (cuda >= 0),
             o_.device.is_cuda()
                 ? str("--device ", o_.device.str(), " with ", n, " ranks over the ",
                       o_.comm->backend(), " backend, which takes host tensors: pass --dist nccl")
                 : str("the ", o_.comm->backend(), " backend takes CUDA tensors, but --device is ",
                       o_.device.str(), ": pass --device cuda, or --dist mpi"));
  MW_CHECK_T(InvalidArgument, cuda < 0 || o_.device.index == cuda, "--device ", o_.device.str(),
             ": this rank's NCCL communicator is on cuda:", cuda,
             " (its place on its host modulo the GPUs it sees); pass --device cuda and each rank "
             "takes its own");
}

// ZeRO 3 builds the model into its buckets (Note [ZeRO stage 3]): the DataParallel comes first.
std::unique_ptr<DataParallel> Trainer::make_zero3(gpt2::ParameterFactory& factory) {
  std::vector<std::pair<std::string, Shape>> tensors;
  for (const auto& spec : gpt2::tensor_specs(config_)) tensors.emplace_back(spec.name, spec.shape);
  LowGathers low;  // Note [16-bit parameter gathers] (zero3_low.cpp)
  if (o_.precision != DType::F32) {
    low.dtype = o_.gemini_low_copies ? o_.precision : DType::F32;
    low.tensors = gpt2::read_only_by_products(config_);
  }
  auto dp = std::make_unique<DataParallel>(o_.comm, tensors, o_.bucket_bytes, o_.device, low);
  DataParallel* raw = dp.get();
  factory.make = [raw](const gpt2::TensorSpec& spec) { return raw->make_parameter(spec.name); };
  factory.ready = [raw](const gpt2::TensorSpec& spec) { raw->parameter_ready(spec.name); };
  return dp;
}

void Trainer::setup_data_parallel() {
  const int n = o_.comm->size();
  if (!o_.gemini.empty()) {  // Gemini reduces its chunks' gradients (connect_gemini): no buckets
    dp_ = std::make_unique<DataParallel>(o_.comm, std::vector<Tensor>(), 0, o_.bucket_bytes);
  } else if (!dp_) {  // stages 0-2: over the built model; rank 0's weights to every rank
    dp_ = std::make_unique<DataParallel>(o_.comm, model_->parameters(), o_.zero_stage,
                                         o_.bucket_bytes);
    dp_->broadcast_parameters();  // the same initial weights everywhere, whatever each rank built
  }
  set_dropout_batch_shard({local_batch() * dp_->rank(), local_batch(), o_.batch});
  const std::string when =
      o_.steps_in_backward() ? "each chunk updated in backward once its reduction completes"
      : o_.updates_in_last_backward()
          ? "each chunk updated in the last micro-batch's backward once its reduction completes"
          : "updates after backward";
  const std::string what =
      o_.gemini.empty() ? dp_->describe()
      : o_.zero_stage >= 2
          ? str("Data parallel: ", n, n == 1 ? " rank (" : " ranks (", o_.comm->backend(),
                "), ZeRO stage ", o_.zero_stage, " under Gemini: every rank steps its 1/", n,
                " piece of each chunk (Adam states and reduced gradients), each chunk's gradient "
                "reduce_scattered as soon as backward completes it, ",
                when, "; ",
                gemini_owned_->shards_parameters()
                    ? "sharded chunks keep only their pieces, all_gathered around the ops that "
                      "use them, the others are all_gathered after the updates"
                    : "the updated pieces all_gathered after the updates")
          : str("Data parallel: ", n, n == 1 ? " rank (" : " ranks (", o_.comm->backend(),
                "), ZeRO stage 0 under Gemini: every rank holds every chunk, each chunk's gradient "
                "all_reduced as soon as backward completes it, ",
                when);
  print_(what + str("; global batch ", o_.batch, " = ", n, " x ", local_batch(), " rows\n"));
  o_.comm->reset_stats();  // from here on: the training steps' collectives only
}

// Note [Gemini under data parallel] (offload/gemini/deferred.cpp): rank 0's chunks to every rank,
// then each chunk's gradient summed over the ranks when backward completes it, scaled to the mean.
// Over NCCL, Gemini's chunks in RAM go through copies on the device (Note [Staged collectives],
// dist/communicator.h); on the host backends these are the collectives themselves.
void Trainer::connect_gemini() {
  std::shared_ptr<dist::Communicator> comm = o_.comm;
  gemini::Gemini::GradientReduction r;
  auto waiter = [](dist::StagedWork w) {
    auto work = std::make_shared<dist::StagedWork>(std::move(w));
    return std::function<void()>([work] { work->wait(); });
  };
  if (gem_->options().shard_ranks > 1) {  // Note [Sharded optimizer states]
    auto started = [](dist::StagedWork w) {
      auto work = std::make_shared<dist::StagedWork>(std::move(w));
      return gemini::Gemini::GradientReduction::Started{[work] { work->wait(); },
                                                        [work] { return work->done(); }};
    };
    r.reduce_scatter = [comm, started](const Tensor& in, const Tensor& out) {
      return started(dist::staged_reduce_scatter(*comm, in, out));
    };
    r.all_gather = [comm, started](const Tensor& in, const Tensor& out) {
      return started(dist::staged_all_gather(*comm, in, out));
    };
    r.sum_over_ranks = [comm](double x) {
      Tensor t = Tensor::full({1}, x, DType::F64);
      dist::staged_all_reduce(*comm, t).wait();
      return t.data<double>()[0];
    };
    r.from_rank0 = [comm](int64_t x) {  // Note [Sharded parameters]: saving
      return dist::value_from_rank0(*comm, x);
    };
  } else {
    r.start = [comm, waiter](const Tensor& grad) {
      return waiter(dist::staged_all_reduce(*comm, grad));
    };
  }
  r.scale = 1.f / static_cast<float>(comm->size());
  gem_->set_gradient_reduction(std::move(r));
  // Rank 0's chunks to every rank (sharded and disk-homed chunks took theirs as they were filled).
  std::vector<dist::StagedWork> works;
  for (const auto& c : gem_->chunks())
    if (!c->sharded() && !c->on_nvme())
      works.push_back(dist::staged_broadcast(*comm, c->flat(), 0));
  for (auto& w : works) w.wait();
  o_.comm->reset_stats();  // the broadcast is not a training step's communication
}

bool Trainer::shards_optimizer() const {
  return dp_ && (dp_->zero_stage() > 0 || (gem_ && gem_->options().shard_ranks > 1));
}

// Note [Sharded optimizer states]: the file's parameters are the chunks (one process's Gemini
// steps whole chunks), each rank's optimizer steps its nonempty pieces of them in chunk order.
ShardLayout Trainer::gemini_shard_layout() const {
  ShardLayout shards;
  const int n = gem_->options().shard_ranks;
  for (const auto& c : gem_->chunks()) shards.numels.push_back(c->numel());
  shards.pieces.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    for (size_t c = 0; c < shards.numels.size(); ++c) {
      const gemini::ChunkPiece p = gemini::chunk_piece(shards.numels[c], r, n);
      if (p.numel > 0) shards.pieces[static_cast<size_t>(r)].push_back({c, p.offset, p.numel});
    }
  return shards;
}

bool Trainer::shards_parameters() const {
  return (dp_ && dp_->shards_parameters()) || (gem_ && gem_->shards_parameters());
}

void Trainer::save_sharded_optimizer_state(const std::string& file) {
  if (gem_) {
    std::vector<Tensor> chunks;
    for (const auto& c : gem_->chunks()) chunks.push_back(c->flat());
    save_zero_state(*dp_, gemini_shard_layout(), gem_->adam(),
                    one_process_layout(chunks, o_.nvme, true), file);
    return;
  }
  save_zero_state(*dp_, *opt_,
                  one_process_layout(model_->parameters(), o_.nvme, hybrid_ != nullptr), file);
}

// Each rank resolves --resume DIR on its own view of the folder: node-local folders, or a copy out
// of date, gave ranks different steps, which trained on mixed data positions and states (at ZeRO
// 2 the next save blamed an NVMe failure). Each compares its step with rank 0's and the ranks
// agree on the outcome, so that all stop with the error (none waits in the next collective).
void Trainer::check_ranks_resume_one_step() const {
  if (!o_.comm || o_.comm->size() == 1) return;
  const int64_t root_step = dist::value_from_rank0(*o_.comm, resumed_state_.step);
  Tensor off = Tensor::full({1}, root_step != resumed_state_.step ? 1.0 : 0.0, DType::F64);
  dist::staged_all_reduce(*o_.comm, off).wait();
  const auto ranks_off = static_cast<int64_t>(off.item());
  MW_CHECK_T(InvalidArgument, ranks_off == 0, "--resume '", o_.resume, "': this rank took ",
             resumed_path_, " (step ", resumed_state_.step, "), rank 0 a checkpoint at step ",
             root_step, "; ", ranks_off, " of the ", o_.comm->size(),
             " ranks see another newest checkpoint than rank 0. Each rank reads --resume itself: "
             "put --checkpoint-dir on a file system every machine shares, or pass one step_NNNNNN "
             "folder that every machine holds");
}

int Trainer::stop_signal_of_any_rank(int local) {
  // Agreed where the ranks act on it together: a checkpoint, and an evaluation's verdict.
  const bool together = !o_.checkpoint_dir.empty() || !o_.save_best.empty() || o_.early_stop > 0;
  if (!dp_ || dp_->comm().size() == 1 || !together) return local;
  const dist::CommStats before = dp_->comm().stats();
  const double any = dp_->mean_over_ranks(local != 0 ? 1.0 : 0.0);
  dp_->exclude_comm_since(before);  // not the training step's communication
  return local != 0 ? local : any > 0 ? SIGTERM : 0;
}

void Trainer::await_root_saves() {
  if (!dp_ || dp_->comm().size() == 1) return;
  const dist::CommStats before = dp_->comm().stats();
  dp_->comm().barrier().wait();
  dp_->exclude_comm_since(before);  // not the training step's communication
}

std::string Trainer::save_optimizer_output() {
  if (o_.save_optimizer.empty() || !optimizer_saved_.empty()) return optimizer_saved_;
  if (!is_root() && !shards_optimizer()) return "";  // rank 0 alone has anything to do
  std::error_code ec;
  const bool had_file = std::filesystem::exists(o_.save_optimizer, ec);
  try {
    write_optimizer_output();
  } catch (const IoError& e) {  // the model saved just before is this step's: say they differ
    throw IoError(
        str(e.what(),
            had_file ? str("; the earlier '", o_.save_optimizer, "' is kept as it was")
                     : std::string(),
            o_.save.empty() || !had_file
                ? std::string()
                : str(", and no longer matches the model just saved to '", o_.save,
                      "' (this step's): --init-from that model without --load-optimizer, or "
                      "save again")),
        e.path, e.offset, e.length, e.err);
  }
  optimizer_saved_ = str("Saved optimizer state to ", o_.save_optimizer, "\n");
  return optimizer_saved_;
}

void Trainer::write_optimizer_output() {
  if (gem_) {  // Note [Saving in the model's layout]: each parameter's range of its chunk
    const optim::StateFileMap layout = optimizer_layout();  // HybridAdam steps chunk c as its c
    const std::vector<Tensor> params = model_->parameters();
    std::vector<optim::HybridAdam::SavedRange> as;
    for (size_t p = 0; p < params.size(); ++p)
      as.push_back({layout.param[p], layout.offset[p], params[p].numel()});
    if (shards_optimizer())  // the file of a plain run with its states in memory
      save_zero_state(*dp_, gemini_shard_layout(), gem_->adam(),
                      one_process_layout(params, o_.nvme, false), o_.save_optimizer, &as);
    else
      hybrid_->save_state(o_.save_optimizer, as);
  } else {
    save_optimizer_state(o_.save_optimizer);
  }
}

std::string Trainer::data_parallel_report() const {
  if (!dp_) return "";
  const DataParallelStats s = dp_->stats();
  const double steps = static_cast<double>(std::max<int64_t>(1, s.steps));
  const int64_t n = dp_->size();
  const int64_t psi = model_->num_parameters();
  const int64_t sharded_numel = gem_ ? gem_->sharded_numel() : 0;
  const double gathered = gem_ ? static_cast<double>(gem_->sharded_gather_bytes()) / 4.0 : 0.0;
  const bool low_gathers = dp_->shards_parameters() && dp_->low_gathers() != DType::F32;
  const double times = volume_in_psi(*dp_, psi, gathered, sharded_numel);
  const double formula =
      times * static_cast<double>(psi) * 4.0 * static_cast<double>(n - 1) / static_cast<double>(n);
  std::string out =
      str("Data parallel: ", n, " ranks, ZeRO stage ", gem_ ? o_.zero_stage : dp_->zero_stage(),
          " | sent per rank per step (ring):");
  for (int k = 0; k < dist::kNumCollectives; ++k)
    if (s.comm.calls[k] > 0 && s.comm.wire_bytes[k] > 0)
      out += str(" ", dist::collective_name(static_cast<dist::Collective>(k)), " ",
                 format_fixed(mib(s.comm.wire_bytes[k]) / steps, 2), " MiB");
  out += str(" = ", format_fixed(mib(s.comm.total_wire_bytes()) / steps, 2), " MiB; formula ",
             format_fixed(times, times == std::floor(times) ? 0 : 3),
             " Psi (N-1)/N x 4 B = ", format_fixed(mib(static_cast<int64_t>(formula)), 2), " MiB",
             gathered < static_cast<double>(sharded_numel)
                 ? " (sharded chunks' 16-bit parts gathered in 2 B)\n"
             : low_gathers ? " (the blocks' matrices gathered in 2 B)\n"
                           : "\n");
  out += str("Data parallel: collectives busy ", format_fixed(s.comm.busy_ms / steps, 1),
             " ms/step, waited after backward ", format_fixed(s.backward_end_wait_ms / steps, 1),
             " ms/step (exposed), parameter all_gather ",
             format_fixed((gem_ ? gem_->run_stats().shard_gather_ms : s.gather_ms) / steps, 1),
             " ms/step",
             s.split_reductions > 0
                 ? str("; ", format_fixed(static_cast<double>(s.split_reductions) / steps, 1),
                       " embedding gradient(s) per step reduced during backward, their rows after")
                 : std::string(),
             "\n");
  if (gem_ && (o_.steps_in_backward() || o_.updates_in_last_backward()))
    out += str("Data parallel: Gemini updated ",
               format_fixed(static_cast<double>(gem_->run_stats().updated_in_backward) / steps, 1),
               " of ", gem_->chunks().size(),
               " chunks per step in backward, as their reductions "
               "completed\n");
  if (gem_) return out + gemini_memory_text(*gem_, psi);
  int64_t nvme_bytes = 0;
  if (hybrid_ && hybrid_->nvme()) nvme_bytes = hybrid_->offloaded_numel() * 8;
  if (dp_->shards_parameters() && s.steps > 1) {  // Note [ZeRO stage 3]: step 1 is recorded
    const auto gather = static_cast<size_t>(dist::Collective::kAllGather);
    const double later = static_cast<double>(s.steps - 1);
    out += str(
        "Data parallel: stage 3 gathered parameter buckets ",
        format_fixed(static_cast<double>(s.parameter_gathers - s.recorded_gathers) / later, 1),
        " times per step after the first (recorded) step's ", s.recorded_gathers,
        "; all_gather after it ",
        format_fixed(mib(s.comm.wire_bytes[gather] - s.recorded_comm.wire_bytes[gather]) / later,
                     2),
        " MiB/step against ", format_fixed(times - 1, low_gathers ? 3 : 0), " Psi (N-1)/N x 4 B = ",
        format_fixed(mib(static_cast<int64_t>(formula * (times - 1) / times)), 2),
        " MiB; ops waited ", format_fixed(s.parameter_wait_ms / steps, 1),
        " ms/step for parameters (exposed)\n");
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
