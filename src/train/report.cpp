// What the Trainer reports: the progress line, the memory per tier, and the closing lines of a run
// (time, memory, NVMe, Gemini, activation offload) with the optional outputs they come with.
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/numbers.h"
#include "core/parallel.h"
#include "train/data_parallel.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace mw::train {

namespace {
double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }
std::string mib_text(int64_t bytes) { return format_fixed(mib(bytes), 0) + " MiB"; }
// Sim, or a GPU: its peak against its memory, or the cap of --device cuda:SIZE.
std::string device_peak_text(Device device) {
  const AllocatorStats dev = allocator_for(device).stats();
  return str(device.str(), ": peak ", mib_text(dev.peak_bytes), " of ",
             mib_text(dev.capacity_bytes), " capacity",
             dev.arena_fallbacks > 0  // Note [Sim arena]: blocks its fragmented segment lacked
                 ? str(", ", dev.arena_fallbacks, " blocks outside its fragmented arena")
                 : std::string(),
             "\n");
}

// The run's Gemini line: traffic, gathers, evictions, host chunk peak, illegal transitions.
std::string gemini_line(const gemini::GeminiStats& g, int64_t illegal_transitions) {
  return str("Gemini: ", format_fixed(mib(g.h2d_bytes), 1), " MiB host->device (", g.gathers,
             " gathers, ", g.prefetches, " ahead), ", format_fixed(mib(g.d2h_bytes), 1),
             " MiB device->host, ", g.evictions, " evictions",
             g.pressure_evictions > 0  // Note [Memory pressure]
                 ? str(" (", g.pressure_evictions, " for memory the plan did not expect)")
                 : std::string(),
             g.landed_prefetches > 0  // Note [Memory pressure]
                 ? str(", ", g.landed_prefetches,
                       " sharded prefetches landed in RAM (the device refused them)")
                 : std::string(),
             ", host chunk peak ", format_fixed(mib(g.host_chunk_peak_bytes), 1), " MiB, ",
             illegal_transitions, " illegal state transitions\n");
}

}  // namespace

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  char buf[48];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llds", static_cast<long long>(s));
  return buf;
}

std::string progress_text(const StepResult& r, int64_t total_steps, double median_step_ms,
                          const std::string& memory) {
  char lr[32];
  std::snprintf(lr, sizeof lr, "%.2e", r.lr);
  std::string t =
      str("step ", r.step + 1, "/", total_steps, " | loss ", format_fixed(r.loss, 3), " | lr ", lr);
  if (r.grad_norm >= 0)
    t += str(" | grad norm ", format_fixed(r.grad_norm, 3), r.clipped ? " (clipped)" : "");
  const double tok_s = r.step_ms > 0 ? 1000.0 * static_cast<double>(r.tokens) / r.step_ms : 0;
  const double eta_s = median_step_ms * 1e-3 * static_cast<double>(total_steps - r.step - 1);
  return t +
         str(" | ", format_fixed(tok_s, 0), " tok/s | ETA ", format_duration(eta_s), " | ", memory);
}

std::string Trainer::memory_text() const {
  std::string t = "RSS " + mib_text(current_rss_bytes());
  if (!o_.device.is_cpu())
    t += str(" | ", o_.device.str(), " peak ",
             mib_text(allocator_for(o_.device).stats().peak_bytes));
  int64_t disk_bytes = 0;
  if (hybrid_ && hybrid_->nvme()) disk_bytes += hybrid_->nvme()->stats().file_bytes;
  if (gem_) disk_bytes += gem_->nvme_chunk_bytes();
  if (disk_bytes > 0) t += " | NVMe " + mib_text(disk_bytes);
  return t;
}

std::string Trainer::peaks_text() const {
  std::string t = str("Memory: host allocator peak ",
                      mib_text(allocator_for(Device::cpu()).stats().peak_bytes), " in use");
  if (!o_.device.is_cpu())
    t += str(" | ", o_.device.str(), " peak ",
             mib_text(allocator_for(o_.device).stats().peak_bytes));
  return t + str(" | peak RSS ", mib_text(peak_rss_bytes()), "\n");
}

std::string Trainer::finish_report(double total_s) {
  std::string out = str("Time: ", format_fixed(total_s, 3), " s\n");
  out += str("Mem usage: ", format_fixed(mib(current_rss_bytes()), 0), " MB\n");
  const double med = median(step_ms_);
  const int64_t tokens = o_.batch * o_.seq * o_.grad_accum;
  out += str("Peak RSS: ", mib_text(peak_rss_bytes()), " | median step: ", format_fixed(med, 1),
             " ms | ", format_fixed(med > 0 ? 1000.0 * static_cast<double>(tokens) / med : 0.0, 0),
             " tokens/s | threads: ", num_threads(), "\n");
  const AllocatorStats host = allocator_for(Device::cpu()).stats();
  out += str("Host allocator: peak ", mib_text(host.peak_bytes), " in use, ",
             mib_text(host.current_bytes), " in use now, ", mib_text(host.cached_bytes),
             " cached | optimizer state in memory: ", mib_text(opt_->state_bytes_in_memory()), " (",
             opt_->name(), ")",
             hybrid_ && hybrid_->nvme()  // its slots are host memory outside the allocator
                 ? str(", of it NVMe staging ", mib_text(hybrid_->nvme()->stats().staging_bytes))
                 : std::string(),
             "\n");
  if (!o_.device.is_cpu()) out += device_peak_text(o_.device);
  if (gem_) {
    const gemini::GeminiStats& g = gem_->run_stats();
    out += gemini_line(g, gem_->illegal_transitions());
    if (o_.updates_in_last_backward() && !dp_ && step_ > 0)  // Note [Updates in the last backward]
      out += str("Gemini: ", format_fixed(static_cast<double>(g.updated_in_backward) / step_, 1),
                 " of ", gem_->chunks().size(),
                 " chunks per step updated in the last micro-batch's backward\n");
    if (trace_) {
      trace_->write(o_.trace);
      out += str("Trace: ", trace_->size(), " events in ", o_.trace, "\n");
    }
  }
  if (hybrid_ && hybrid_->nvme()) {
    const optim::NvmeStats st = hybrid_->nvme()->stats();
    const double gb = 1e9;
    auto f = [](double v, int d) { return format_fixed(v, d); };
    out += str(
        "NVMe: read ", f(st.bytes_read / gb, 3), " GB, written ", f(st.bytes_written / gb, 3),
        " GB | ", f(st.bytes_read / gb / total_s, 2), " GB/s read, ",
        f(st.bytes_written / gb / total_s, 2), " GB/s written over the run | updater waited for ",
        "reads ", f(st.consumer_wait_ms, 0), " ms (hidden behind backward), step() waited for the ",
        "updater ", f(st.flush_wait_ms, 0), " ms, backward waited for the row split ",
        f(st.join_wait_ms, 0), " ms (both exposed) | staging ", mib_text(st.staging_bytes),
        ", file ", mib_text(st.file_bytes), ", borrowed gradient slots ",
        mib_text(st.borrowed_bytes_max), ", ", st.spare_slices, " spare-slot slices, ",
        st.fixed_transfers, " transfers into registered slots | row split: ", st.split_rows,
        " rows, held pages ", f(mib(st.held_bytes_max), 1), " MiB max | gradients waiting for ",
        "the updater ", mib_text(st.queued_grad_bytes_max), " max\n");
    if (!o_.nvme_timeline.empty()) {
      std::error_code ec;  // missing directories, as data::check_output_path promised
      std::filesystem::create_directories(std::filesystem::path(o_.nvme_timeline).parent_path(),
                                          ec);
      std::ofstream csv(o_.nvme_timeline);
      MW_CHECK_T(IoError, csv.good(), "--nvme-timeline '", o_.nvme_timeline, "' cannot be written");
      csv << "param,offset,numel,read_issue_ms,read_done_ms,compute_start_ms,compute_end_ms,"
             "write_issue_ms,write_done_ms,spare\n";
      for (const auto& t : hybrid_->nvme()->last_timeline())
        csv << t.param << ',' << t.offset << ',' << t.numel << ',' << t.read_issue_ms << ','
            << t.read_done_ms << ',' << t.compute_start_ms << ',' << t.compute_end_ms << ','
            << t.write_issue_ms << ',' << t.write_done_ms << ',' << t.spare << '\n';
      for (const auto& [name, ms] : phase_ms_) csv << "# " << name << ' ' << ms << '\n';
    }
  }
  out += save_optimizer_output();
  out += str("Median forward (with loss): ", format_fixed(median(forward_ms_), 1),
             " ms | backward: ", format_fixed(median(backward_ms_), 1),
             " ms | step CPU time: ", format_fixed(median(step_cpu_ms_), 1), " ms\n");
  if (offloader_) {
    offloader_->wait_idle();
    const auto st = offloader_->stats();
    out += str("Activation offload: ", mib_text(st.to_host_bytes), " to host, ",
               mib_text(st.to_device_bytes), " back | ", st.offloaded, " offloaded, ", st.kept,
               " kept, ", st.prefetch_hits, " prefetch hits, ", st.prefetch_waits, " waits, ",
               st.sync_fetches, " sync fetches, ", st.cancelled, " cancelled | unpack wait ",
               format_fixed(st.unpack_wait_ms, 0), " ms\n");
  }
  return out;
}

json::Value Trainer::take_offload_step_stats() {
  json::Value rec = json::Value::object();
  if (hybrid_ && hybrid_->nvme()) {
    // Counted as the engine completes requests: a step's last write-backs, still in flight when
    // it returns, fall in the next step's count (the sum over the run is exact).
    const optim::NvmeStats st = hybrid_->nvme()->stats();
    rec.set("adam_nvme_read_bytes", st.bytes_read - nvme_read_logged_);
    rec.set("adam_nvme_write_bytes", st.bytes_written - nvme_written_logged_);
    nvme_read_logged_ = st.bytes_read, nvme_written_logged_ = st.bytes_written;
  }
  if (dp_) {  // wire bytes this rank sent in the step's parameter and gradient collectives
    const dist::CommStats c = dp_->stats().comm;
    const int64_t gather = c.wire_bytes[static_cast<size_t>(dist::Collective::kAllGather)];
    const int64_t scatter = c.wire_bytes[static_cast<size_t>(dist::Collective::kReduceScatter)];
    rec.set("all_gather_bytes", gather - all_gather_logged_);
    rec.set("reduce_scatter_bytes", scatter - reduce_scatter_logged_);
    all_gather_logged_ = gather, reduce_scatter_logged_ = scatter;
  }
  if (!gem_) return rec;
  const gemini::GeminiStats g = gem_->take_step_stats();
  rec.set("host_chunk_peak_bytes", g.host_chunk_peak_bytes);
  rec.set("h2d_bytes", g.h2d_bytes);
  rec.set("d2h_bytes", g.d2h_bytes);
  rec.set("nvme_read_bytes", g.nvme_read_bytes);
  rec.set("nvme_write_bytes", g.nvme_write_bytes);
  rec.set("evictions", g.evictions);
  rec.set("pressure_evictions", g.pressure_evictions);  // Note [Memory pressure]
  if (gem_->shards_parameters()) rec.set("landed_prefetches", g.landed_prefetches);
  rec.set("prefetches", g.prefetches);
  rec.set("prefetch_wait_ms", g.prefetch_wait_ms);
  if (gem_->shards_parameters()) rec.set("shard_gather_ms", g.shard_gather_ms);
  rec.set("illegal_transitions", gem_->illegal_transitions());
  return rec;
}

}  // namespace mw::train
