// Gemini's chunks, hooks and policies (gemini.h; docs/gemini.md).
#include "offload/gemini/gemini.h"

#include <algorithm>
#include <cstdio>

#include "autograd/autograd.h"
#include "core/allocator.h"
#include "nn/layers.h"
#include "offload/gemini/use_order.h"

namespace mw::gemini {

// Note [Auto margin]: auto lets chunks use capacity x (1 - margin) minus the coming period's
// non-model reserve. ColossalAI keeps 10% on CUDA, where the caching allocator's fragmentation and
// cuBLAS workspaces make non-model memory vary between iterations. The sim allocator is exact
// (4096-byte granules, sizes reused exactly, Note [Host caching]) and an iteration allocates the
// same sizes in the same order every time, so the reserve measured on the warmup iteration repeats
// to the byte; 2% covers the one thing that can differ (a data batch of another length is not
// supported by the plan anyway). So: 2% on sim, 10% on cuda.
Gemini::Gemini(GeminiOptions options, const std::vector<std::pair<std::string, Shape>>& tensors)
    : Optimizer({}), options_(std::move(options)) {
  MW_CHECK_T(InvalidArgument, !options_.device.is_cpu(),
             "Gemini needs a device to place chunks on (--device sim:CAPACITY or cuda), got cpu");
  margin_ = options_.auto_margin >= 0 ? options_.auto_margin
                                      : default_auto_margin(options_.device.is_cuda());
  MW_CHECK_T(InvalidArgument, margin_ < 1.0, "auto margin ", margin_, " must be below 1");
  check_gpu_margin(options_);
  layout(tensors);
  install_pressure_handler();  // Note [Memory pressure]
}

namespace {
std::vector<std::pair<std::string, Shape>> shapes_of(const nn::Module& model) {
  std::vector<std::pair<std::string, Shape>> out;
  for (auto& [name, t] : model.named_parameters()) out.emplace_back(name, t.shape());
  return out;
}
}  // namespace

Gemini::Gemini(nn::Module& model, GeminiOptions options)
    : Gemini(std::move(options), shapes_of(model)) {
  attach(model);
}

Gemini::~Gemini() {
  remove_pressure_handler();
  alive_.reset();                           // hooks see the optimizer gone and do nothing
  for (auto& w : pending_) w.write.join();  // never leave I/O into freed memory
  for (auto& [c, read] : inflight_) read.join();
  for (auto& s : stepping_) s.write.join();      // parked pieces on their way to disk
  for (auto& [c, wait] : shard_inflight_) try {  // Note [Shard prefetch]
      wait();
    } catch (...) {
    }
  for (auto& spill : spills_) spill.write.join();
  for (auto& c : chunks_)
    if (c->gathered()) c->release_copy();
}

// Chunks, members and homes from the tensors' sizes alone, before any parameter exists, so that a
// model can be built straight into its chunks (Note [Streaming construction] in gemini.h).
void Gemini::layout(const std::vector<std::pair<std::string, Shape>>& tensors) {
  for (auto& [name, shape] : tensors) {
    index_of_.emplace(name, names_.size());
    names_.push_back(name);
    shapes_.push_back(shape);
  }
  // Searched and packed in first-use order when known (Note [First-use order]).
  const std::vector<size_t> order = packing_order(names_, options_.use_order);
  std::vector<int64_t> sizes;  // in packing order
  for (size_t i : order) sizes.push_back(shape_numel(shapes_[i]));
  search_ = search_chunk_size(sizes, options_.search);
  const int64_t capacity = options_.chunk_numel > 0 ? options_.chunk_numel : search_.chunk_numel;
  const std::vector<bool> alone =
      options_.chunk_numel > 0 ? std::vector<bool>(sizes.size(), false) : search_.outlier;
  if (options_.chunk_numel > 0) search_.wasted_numel = packing_waste(sizes, capacity);
  const std::vector<int> chunk_of = pack_chunks(sizes, capacity, alone);
  const int nchunks = sizes.empty() ? 0 : *std::max_element(chunk_of.begin(), chunk_of.end()) + 1;
  // Members and offsets, in packing order within each chunk; those that may be copied in 16 bits
  // after the others (Note [16-bit copies]).
  const std::vector<char> low = low_copy_flags();
  std::vector<std::vector<ChunkMember>> members(static_cast<size_t>(nchunks));
  std::vector<int64_t> used(static_cast<size_t>(nchunks), 0), f32_part;
  chunk_of_.assign(sizes.size(), 0);
  for (char pass : {0, 1}) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      if (low[order[j]] != pass) continue;
      const auto c = static_cast<size_t>(chunk_of[j]);
      members[c].push_back({order[j], used[c], sizes[j]});
      used[c] += sizes[j];
      chunk_of_[order[j]] = c;
    }
    if (pass == 0) f32_part = used;
  }
  for (int c = 0; c < nchunks; ++c) {
    const auto k = static_cast<size_t>(c);
    chunks_.push_back(std::make_unique<Chunk>(c, members[k], used[k]));
    chunks_.back()->set_f32_part(f32_part[k]);
  }
  filled_.assign(chunks_.size(), 0);
  states_ = TensorStates(names_);
  in_use_.assign(names_.size(), 0);
  grad_in_buffer_.assign(names_.size(), 0);  // Note [Deferred updates]
  arrived_in_backward_.assign(names_.size(), 0);

  // Homes (Note [Chunk homes]) and where each chunk's gradients and Adam states live.
  std::vector<int64_t> bytes;
  for (auto& c : chunks_) bytes.push_back(c->nbytes());
  params_off_.assign(chunks_.size(), true);
  std::vector<bool> optim_off(chunks_.size(), true);
  if (options_.policy == Policy::kStatic) {
    params_off_ = choose_offloaded(bytes, options_.offload_param_frac);
    optim_off = choose_offloaded(bytes, options_.offload_optim_frac);
  }
  shard_params_.assign(chunks_.size(), false);  // Note [Sharded parameters] (shard.cpp)
  if (sharded()) shard_params_ = choose_offloaded(bytes, options_.shard_param_frac);
  optim_on_host_.resize(chunks_.size());
  adam_options_ = options_.adam;
  adam_options_.update_in_backward = false;  // Gemini steps chunks itself (step_param)
  adam_options_.state_devices.clear();
  for (size_t c = 0; c < chunks_.size(); ++c) {
    optim_on_host_[c] = params_off_[c] || optim_off[c];
    adam_options_.state_devices.push_back(optim_on_host_[c] ? Device::cpu() : options_.device);
  }
  to_disk_.assign(chunks_.size(), false);
  if (options_.host_capacity_bytes > 0) plan_tiers(adam_options_);
  choose_low_chunks();  // Note [16-bit copies]
  if (options_.verbose) std::printf("%s\n", search_.log_line().c_str());
}

Tensor Gemini::make_parameter(const std::string& name) {
  auto it = index_of_.find(name);
  MW_CHECK_T(InvalidArgument, it != index_of_.end(), "Gemini: no tensor '", name,
             "' in the layout");
  const size_t i = it->second;
  Chunk& c = *chunks_[chunk_of_[i]];
  if (c.storage()->is_released()) c.storage()->materialize();
  for (const ChunkMember& m : c.members())
    if (m.tensor == i)
      return Tensor::from_storage(c.storage(), m.offset, shapes_[i], contiguous_strides(shapes_[i]),
                                  DType::F32);
  throw Error(str("Gemini: tensor '", name, "' is in no chunk"));
}

// A chunk whose members all have their values is placed: homed on disk (written, its RAM freed),
// on the device, or kept in RAM.
void Gemini::parameter_ready(const std::string& name) {
  const size_t i = index_of_.at(name);
  const size_t c = chunk_of_[i];
  if (++filled_[c] < static_cast<int64_t>(chunks_[c]->members().size())) return;
  Chunk& chunk = *chunks_[c];
  if (shard_params_[c]) {
    shard_chunk(chunk);      // Note [Sharded parameters]
  } else if (to_disk_[c]) {  // rank 0's values first (Note [Three tiers under data parallel])
    if (options_.broadcast_from_rank0) options_.broadcast_from_rank0(chunk.flat());
    swap_->write(str("chunk.", c), chunk.storage()->data(), chunk.nbytes()).wait();
    iter_.nvme_write_bytes += chunk.nbytes();
    run_.nvme_write_bytes += chunk.nbytes();
    chunk.set_on_nvme();
  } else if (!params_off_[c]) {
    chunk.set_home(options_.device);
    device_home_bytes_ += chunk.nbytes();
  } else {
    track_host(chunk.nbytes());
  }
}

void Gemini::attach(nn::Module& model) {
  MW_CHECK(!adam_, "Gemini::attach called twice");
  MW_CHECK_T(InvalidArgument,
             options_.tensor_decays.empty() || options_.tensor_decays.size() == names_.size(),
             "Gemini: ", options_.tensor_decays.size(), " decay flags for ", names_.size(),
             " tensors");
  auto named = model.named_parameters();
  MW_CHECK_T(InvalidArgument, named.size() == names_.size(), "Gemini: the model has ", named.size(),
             " parameters, the layout ", names_.size());
  for (size_t i = 0; i < named.size(); ++i) {
    const auto& [name, p] = named[i];
    MW_CHECK_T(InvalidArgument,
               name == names_[i] && p.shape() == shapes_[i] && p.dtype() == DType::F32 &&
                   p.is_contiguous(),
               "Gemini: parameter ", i, " is '", name, "' ", p.desc(), ", the layout has '",
               names_[i], "' of shape ", shape_str(shapes_[i]), " (f32, contiguous)");
    Chunk& c = *chunks_[chunk_of_[i]];
    if (p.storage() == c.storage()) continue;  // built in place (make_parameter)
    // Note [Parameters in chunks]: copy the parameter in, then re-point it at the chunk.
    MW_CHECK_T(InvalidArgument, p.device().is_cpu(), "Gemini: parameter '", name, "' is on ",
               p.device().str(), "; build the model on the cpu and let Gemini place it");
    Tensor view = make_parameter(name);
    view.copy_(p);
    p.impl()->storage = c.storage();
    p.impl()->offset = view.offset();
    parameter_ready(name);
  }
  for (size_t c = 0; c < chunks_.size(); ++c)
    MW_CHECK(filled_[c] == static_cast<int64_t>(chunks_[c]->members().size()), "Gemini: chunk ", c,
             " has ", filled_[c], " of its ", chunks_[c]->members().size(), " tensors");
  for (size_t i = 0; i < names_.size(); ++i) states_.set(i, TensorState::kHold);
  params_ = model.parameters();
  set_chunk_views();  // Note [16-bit copies]
  // What HybridAdam steps: each chunk, or this rank's piece of it (Note [Sharded optimizer
  // states], shard.cpp), with its states where the chunk's go.
  std::vector<Tensor> stepped;
  std::vector<Device> state_devices;
  std::vector<optim::NoDecayRanges> no_decay;
  adam_index_.assign(chunks_.size(), -1);
  for (auto& c : chunks_) {
    const ChunkPiece p = piece(*c);
    if (p.numel == 0) continue;
    adam_index_[static_cast<size_t>(c->index())] = static_cast<int>(stepped.size());
    stepped.push_back(c->sharded() ? c->shard().narrow(0, 0, p.numel)
                      : sharded()  ? c->flat().narrow(0, p.offset, p.numel)
                                   : c->flat());
    state_devices.push_back(adam_options_.state_devices[static_cast<size_t>(c->index())]);
    if (!options_.tensor_decays.empty()) no_decay.push_back(piece_no_decay(*c, p));
  }
  adam_options_.state_devices = std::move(state_devices);
  adam_options_.no_decay = std::move(no_decay);
  piece_grads_.assign(chunks_.size(), Tensor());
  reduced_.assign(chunks_.size(), nullptr);
  piece_norm_sq_.assign(chunks_.size(), 0.0);
  adam_ = std::make_unique<optim::HybridAdam>(stepped, adam_options_);
  install_hooks(model);
}

void Gemini::install_hooks(nn::Module& model) {
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].impl()] = i;
  std::weak_ptr<char> alive = alive_;
  for (auto& [name, m] : model.named_modules()) {
    if (m->own_parameters().empty()) continue;
    ModuleInfo info;
    info.name = name;
    // An embedding's backward reads only the ids (Note [Gemini hooks]).
    info.needs_data_in_backward = dynamic_cast<nn::Embedding*>(m) == nullptr;
    for (auto& [pname, t] : m->own_parameters()) {
      const size_t i = index.at(t.impl());
      info.tensors.push_back(i);
      const int c = static_cast<int>(chunk_of_[i]);
      if (std::find(info.chunks.begin(), info.chunks.end(), c) == info.chunks.end())
        info.chunks.push_back(c);
    }
    modules_.emplace(m, std::move(info));
    m->add_forward_pre_hook([this, alive](nn::Module& mod, const Tensor&) {
      if (!alive.expired()) pre_op(mod, false);
    });
    m->add_forward_hook([this, alive](nn::Module& mod, const Tensor&, const Tensor&) {
      if (!alive.expired()) end_use(mod, TensorState::kHold);
    });
    m->add_backward_pre_hook([this, alive](nn::Module& mod) {
      if (!alive.expired()) pre_op(mod, true);
    });
    m->add_backward_hook([this, alive](nn::Module& mod) {
      if (!alive.expired()) end_use(mod, TensorState::kHoldAfterBwd);
    });
  }
  for (size_t i = 0; i < params_.size(); ++i)
    add_grad_ready_hook(params_[i], [this, alive, i](const Tensor&) {
      if (!alive.expired()) on_grad_ready(i);
    });
}

double Gemini::now_us() const { return trace_out_ ? trace_out_->now_us() : 0.0; }

bool Gemini::pinned(const Chunk& c) const {
  for (const ChunkMember& m : c.members())
    if (in_use_[m.tensor] > 0) return true;
  return false;
}

void Gemini::track_host(int64_t delta) {
  host_chunk_bytes_ += delta;
  iter_.host_chunk_peak_bytes = std::max(iter_.host_chunk_peak_bytes, host_chunk_bytes_);
  run_.host_chunk_peak_bytes = std::max(run_.host_chunk_peak_bytes, host_chunk_bytes_);
  if (trace_out_) trace_out_->counter("host chunks", now_us(), host_chunk_bytes_);
}

void Gemini::track_gathered(int64_t delta) {
  gathered_bytes_ += delta;
  iter_.gathered_peak_bytes = std::max(iter_.gathered_peak_bytes, gathered_bytes_);
  run_.gathered_peak_bytes = std::max(run_.gathered_peak_bytes, gathered_bytes_);
}

void Gemini::gather(Chunk& c, const std::string& why, DType dtype) {
  close_interval();  // Note [Non-model memory]
  const double t0 = now_us();
  const int64_t bytes = dtype == DType::F32 ? c.nbytes() : planned_copy_bytes(c);
  const AllocatorStats st = make_device_room(bytes);
  if (st.capacity_bytes > 0 && st.current_bytes + bytes > st.capacity_bytes)
    throw OutOfMemory(
        str("Gemini: ", why, " needs chunk ", c.index(), " (", bytes, " bytes) on ",
            options_.device.str(), ", but only ", st.capacity_bytes - st.current_bytes,
            " bytes are free of a ", st.capacity_bytes, "-byte capacity (chunks hold ",
            device_model_bytes(), ", non-model data ", st.current_bytes - device_model_bytes(),
            "). Raise the capacity, lower the batch, enable checkpointing, or pass a smaller "
            "--chunk-size"),
        bytes, st.capacity_bytes - st.current_bytes, st.capacity_bytes);
  if (c.sharded()) {
    gather_shard(c, options_.device, dtype);  // Note [Sharded parameters]: from every rank
  } else if (c.on_nvme()) {                   // Note [NVMe-homed chunks]: disk -> device copy
    void* bytes = c.gather_uninitialized(options_.device);
    try {
      DiskRead read = start_disk_read(c, bytes);
      finish_disk_read(c, read);
    } catch (...) {
      c.release_copy();
      throw;
    }
    iter_.nvme_read_bytes += c.nbytes();
    run_.nvme_read_bytes += c.nbytes();
  } else {
    c.gather(options_.device, dtype);
    iter_.h2d_bytes += bytes;
    run_.h2d_bytes += bytes;
  }
  gathered_.push_back(c.index());
  track_gathered(c.copy_nbytes());
  ++iter_.gathers;
  ++run_.gathers;
  if (trace_out_) {
    trace_out_->slice(str("gather chunk ", c.index()), "move", t0, now_us() - t0, 1);
    trace_out_->counter("device chunks", now_us(), device_model_bytes());
  }
}

void Gemini::forget_gathered(Chunk& c, int64_t copy_bytes) {
  close_interval();  // Note [Non-model memory]
  gathered_.erase(std::find(gathered_.begin(), gathered_.end(), c.index()));
  track_gathered(-copy_bytes);
}

void Gemini::release(Chunk& c, bool eviction) {
  if (shard_inflight_.count(c.index())) {  // never free bytes an all_gather is filling
    try {
      join_shard_gather(c);
    } catch (...) {  // released by the join; the communicator's next collective reports it
      return;
    }
  }
  if (auto it = inflight_.find(c.index()); it != inflight_.end()) {
    it->second.join();  // never free bytes a read or copy is filling; its error dies with it
    inflight_.erase(it);
  }
  forget_spill(c);  // Note [Memory pressure]
  const int64_t copy_bytes = c.copy_nbytes();
  c.release_copy();
  forget_gathered(c, copy_bytes);
  if (eviction) {
    ++iter_.evictions;
    ++run_.evictions;
  }
  if (trace_out_) {
    if (eviction) trace_out_->slice(str("evict chunk ", c.index()), "evict", now_us(), 1, 1);
    trace_out_->counter("device chunks", now_us(), device_model_bytes());
  }
}

void Gemini::pre_op(nn::Module& m, bool backward) {
  auto found = modules_.find(&m);
  if (found == modules_.end()) return;
  ModuleInfo& info = found->second;
  const PressurePause pause(*this, true);
  refuse_if_failed();
  sample_nonmodel();
  if (!pending_.empty()) poll_pending(false);
  for (size_t i : info.tensors)
    if (in_use_[i]++ == 0) states_.set(i, TensorState::kCompute);
  std::vector<int> need;
  if (!backward || info.needs_data_in_backward)
    for (int c : info.chunks)
      if (chunks_[static_cast<size_t>(c)]->host_home() ||
          chunks_[static_cast<size_t>(c)]->sharded())
        need.push_back(c);
  // Note [Evaluation forward]: each forward of an evaluation repeats the recorded forward ops.
  if (evaluating_ && eval_ops_ > 0 && op_ == eval_ops_) op_ = 0;
  const int64_t t = op_++;
  info.last_op = t;
  if (!spills_.empty()) poll_spills(false);  // Note [Deferred updates]
  if (recording_ && !evaluating_) {
    trace_.push_back({need});
    trace_keys_.emplace_back(&m, backward);
  } else if (!off_plan_ && (t >= plan_ops() ||
                            trace_keys_[static_cast<size_t>(t)] !=
                                std::make_pair(static_cast<const nn::Module*>(&m), backward))) {
    off_plan_ = true;  // another op sequence than the warmup's: minimal residency until step()
    ++iter_.off_plan;
    ++run_.off_plan;
    if (options_.verbose)
      std::fprintf(stderr,
                   "gemini: op %lld (%s %s) differs from the recorded iteration; minimal "
                   "residency until the next step\n",
                   static_cast<long long>(t), info.name.c_str(), backward ? "backward" : "forward");
  }
  make_room(need, t);
  info.op_start_us = now_us();
  if (trace_out_)
    trace_out_->counter("device in use", info.op_start_us,
                        allocator_for(options_.device).stats().current_bytes);
  for (int c : need) {
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    const DType dtype = copy_dtype_for(chunk, backward);
    if (chunk.gathered() && chunk.copy_dtype() != dtype) release(chunk, false);
    if (!chunk.gathered())
      gather(chunk, str(info.name, backward ? " backward" : " forward"), dtype);
    else
      wait_inflight(chunk);
  }
  prefetch_after(t);
}

// With a plan: the warmup's, or during an evaluation its forward part (Note [Evaluation forward]).
bool Gemini::planned() const {
  return !recording_ && !off_plan_ && options_.policy != Policy::kStatic;
}

int64_t Gemini::plan_ops() const {
  return evaluating_ ? eval_ops_ : static_cast<int64_t>(trace_keys_.size());
}

void Gemini::make_room(const std::vector<int>& need, int64_t t) {
  // Note [Minimal residency]; a sharded chunk always (Note [Sharded parameters]).
  for (int c : std::vector<int>(gathered_)) {
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    if ((!planned() || chunk.sharded()) && std::find(need.begin(), need.end(), c) == need.end() &&
        !pinned(chunk))
      release(chunk, false);
  }
  if (!planned()) return;
  std::vector<int> keep = need;
  for (int c : gathered_)
    if (pinned(*chunks_[static_cast<size_t>(c)])) keep.push_back(c);
  int64_t need_bytes = 0;
  for (int c : need)
    if (!chunks_[static_cast<size_t>(c)]->gathered())
      need_bytes += planned_copy_bytes(*chunks_[static_cast<size_t>(c)]);
  // What releasing each gathered chunk takes off gathered_bytes_: its copy's bytes (a 16-bit
  // copy's, not its f32 home's, which once let evictions stop early and the copies exceed the
  // budget), none for a copy spilled to RAM.
  std::vector<int64_t> bytes;
  for (auto& c : chunks_)
    bytes.push_back(std::count(spilled_.begin(), spilled_.end(), c->index()) ? 0
                                                                             : c->copy_nbytes());
  for (int c : choose_evictions(gathered_, keep, bytes, gathered_bytes_, need_bytes,
                                avail_[static_cast<size_t>(t)], plan_next(), t))
    release(*chunks_[static_cast<size_t>(c)], true);
}

void Gemini::end_use(nn::Module& m, TensorState after) {
  auto found = modules_.find(&m);
  if (found == modules_.end()) return;
  const ModuleInfo& info = found->second;
  const PressurePause pause(*this, true);
  for (size_t i : info.tensors)
    if (in_use_[i] > 0 && --in_use_[i] == 0) states_.set(i, after);
  if (trace_out_) {
    const double t = now_us();
    trace_out_->slice(str(info.name, after == TensorState::kHold ? " fwd" : " bwd"), "op",
                      info.op_start_us, t - info.op_start_us);
    trace_out_->counter("device in use", t, allocator_for(options_.device).stats().current_bytes);
  }
  if (!planned()) return;
  // Released right after the last use in the iteration (Note [Minimal residency]).
  for (int c : info.chunks) {
    Chunk& chunk = *chunks_[static_cast<size_t>(c)];
    if (chunk.gathered() && !pinned(chunk) && !plan_next().used_after(c, info.last_op))
      release(chunk, false);
  }
}

void Gemini::on_grad_ready(size_t i) {
  const PressurePause pause(*this, pressure_armed_);
  // Note [Gemini hooks]: an op without a backward hook (an embedding) ends its use here.
  if (states_.get(i) == TensorState::kHold) states_.set(i, TensorState::kCompute);
  if (states_.get(i) == TensorState::kCompute) {
    in_use_[i] = 0;
    states_.set(i, TensorState::kHoldAfterBwd);
  }
  states_.set(i, TensorState::kReadyForReduce);
  // Note [Deferred updates]: a tensor's second gradient since the last mark: a backward began.
  if (arrived_in_backward_[i]) begin_backward();
  arrived_in_backward_[i] = 1;
  Chunk& c = *chunks_[chunk_of_[i]];
  const Device grad_device = optim_on_host_[chunk_of_[i]] ? Device::cpu() : options_.device;
  if (c.grad_on_disk) restore_grad(c);  // Note [Deferred updates]: a later micro-batch
  if (!c.grad.defined()) {
    c.grad = Tensor::zeros({grad_buffer_numel(c)}, DType::F32, grad_device);
    if (grad_device.is_cpu()) track_host(c.grad.nbytes());
    if (deferred_ && c.on_nvme()) grads_in_ram_.push_back(c.index());
    for (const ChunkMember& m : c.members()) grad_in_buffer_[m.tensor] = 0;
  }
  const ChunkMember* member = nullptr;
  for (const ChunkMember& mm : c.members())
    if (mm.tensor == i) member = &mm;
  Tensor g = grad(params_[i]);
  if (g.defined()) {
    if (low_chunk_[chunk_of_[i]]) g = widened_gradient(g, grad_device);  // Note [16-bit copies]
    MW_CHECK_T(ShapeError, g.numel() == member->numel && g.dtype() == DType::F32,
               "Gemini: gradient of '", names_[i], "' is ", g.desc(), ", expected f32 with ",
               member->numel, " elements");
    add_gradient(c, *member, g, grad_device);
    set_grad(params_[i], Tensor());  // autograd keeps no separate .grad
  }
  states_.set(i, TensorState::kHold);
  if (++c.grads_ready == static_cast<int>(c.members().size())) finish_chunk(c);
}

void Gemini::finish_chunk(Chunk& c) {
  if (deferred_ && !updating_) return complete_deferred(c);
  if (sharded()) return update_piece(c);  // Note [Sharded optimizer states]
  if (c.gathered() && pinned(c)) return;  // still in use: step() updates it
  // Its last use in the iteration: the update needs the home bytes.
  if (c.on_nvme())
    bring_home(c);
  else if (c.gathered())
    release(c, false);
  const double t0 = now_us();
  set_grad(c.flat(), c.grad);
  if (c.grad.device().is_cpu()) track_host(-c.nbytes());
  c.grad = Tensor();
  c.grads_ready = 0;
  ++stepped_chunks_;
  const uint64_t ticket = adam_->step_param(static_cast<size_t>(adam_index_[c.index()]));
  if (c.on_nvme())
    pending_.push_back({c.index(), ticket, io::IoHandle(), false});
  else
    throttle_updates(ticket);
  if (trace_out_) trace_out_->slice(str("adam chunk ", c.index()), "optim", t0, now_us() - t0);
  poll_pending(false);
  // Note [Three tiers]: a disk-homed chunk waiting for its update holds its RAM copy and, in the
  // updater's queue, its gradient. When the disk is slower than backward these pile up (GPT-2 xl:
  // 1.8 GB of queued gradients), so backward waits for the oldest once more than one is pending.
  if (pending_.size() > 1) {
    const double w0 = now_us();
    while (pending_.size() > 1) settle_pending(0, /*block=*/true);
    if (trace_out_) trace_out_->slice("wait for chunk updates", "wait", w0, now_us() - w0);
  }
}

void Gemini::step() {
  arm_pressure(false);  // Note [Memory pressure]: until the next iteration's first op
  refuse_if_failed();
  MW_CHECK(!evaluating_, "Gemini::step inside an evaluation (end_eval first)");
  if (deferred_) {
    step_deferred();
  } else {
    // Chunks not stepped inside backward (a member without a gradient, or still in use).
    for (auto& c : chunks_)
      if (c->grad.defined()) {
        if (c->gathered()) release(*c, false);
        finish_chunk(*c);
      }
  }
  adam_->step();  // waits for the updates of NVMe-offloaded Adam states
  queued_updates_.clear();
  poll_pending(true);
  const bool warmup = recording_;
  if (recording_) {
    sample_nonmodel();
    recording_ = false;
    if (options_.policy != Policy::kStatic) build_plan();
    plan_shard_prefetch();  // Note [Shard prefetch]
  }
  // A gathered copy of an offloaded chunk is stale once its home was stepped.
  for (auto& c : chunks_)
    if (c->gathered()) release(*c, false);
  if (warmup && options_.gpu_margin_mem_ratio > 0) move_chunks_to_device();
  op_ = 0;
  off_plan_ = false;
  stepped_chunks_ = 0;
  begin_backward();
  Optimizer::step_ = adam_->step_count();
}

GeminiStats Gemini::take_step_stats() {
  GeminiStats s = iter_;
  iter_ = GeminiStats();
  iter_.host_chunk_peak_bytes = host_chunk_bytes_;
  iter_.gathered_peak_bytes = gathered_bytes_;
  return s;
}

}  // namespace mw::gemini
