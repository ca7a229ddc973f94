// The training run's JSON-lines log (json_log.h).
#include "train/json_log.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/allocator.h"
#include "core/error.h"

namespace mw::train {

JsonLog::JsonLog(const std::string& path, int64_t first_step) : path_(path) {
  if (path.empty()) return;
  std::string kept;
  if (first_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        const json::Value v = json::parse(line, path);
        // An evaluation after update k has step k; the checkpoint at k came after it.
        const int64_t last = v.contains("val_loss") ? first_step : first_step - 1;
        if (v.is_object() && v.contains("step") && v.get_int("step") <= last) kept += line + "\n";
      } catch (const Error&) {  // a torn line: dropped
      }
    }
  }
  // Missing directories are created, as the check before the run promised
  // (data::check_output_path); a failure to create them is reported by the open.
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  out_ = std::make_unique<std::ofstream>(path, std::ios::trunc);
  *out_ << kept;
  MW_CHECK_T(IoError, out_->good(), "--log '", path, "' cannot be written: ", errno_text(errno),
             "; pass a path in a writable directory");
}

void JsonLog::write(const json::Value& rec, int64_t step) {
  if (!out_) return;
  std::string line;
  try {
    line = rec.dump();
  } catch (const Error& e) {  // a value JSON cannot hold: as a failed write
    return fail(str("--log '", path_, "' at step ", step, ": ", e.what()));
  }
  *out_ << line << "\n";
  out_->flush();
  if (!out_->good())
    fail(str("writing --log '", path_, "' failed at step ", step, " (", errno_text(errno), ")"));
}

void JsonLog::fail(const std::string& what) {
  if (failed_) return;  // reported once
  failed_ = true;
  std::fprintf(stderr, "gpt2_train: error: %s; training continues, the run will exit 1\n",
               what.c_str());
}

json::Value step_record(Trainer& t, const StepResult& r) {
  json::Value rec = json::Value::object();
  rec.set("step", r.step);
  rec.set("loss", r.loss);
  rec.set("lr", r.lr);
  rec.set("grad_norm", r.grad_norm >= 0 ? json::Value(r.grad_norm) : json::Value());
  rec.set("clipped", r.clipped);
  if (r.loss_scale > 0) {
    rec.set("loss_scale", r.loss_scale);
    rec.set("skipped", r.skipped);
  }
  rec.set("epoch", r.epoch);
  rec.set("tokens_per_s", r.step_ms > 0 ? 1000.0 * static_cast<double>(r.tokens) / r.step_ms : 0);
  rec.set("step_ms", r.step_ms);
  rec.set("forward_ms", r.forward_ms);
  rec.set("backward_ms", r.backward_ms);
  rec.set("step_cpu_ms", r.step_cpu_ms);
  rec.set("rss_mb", static_cast<double>(current_rss_bytes()) / (1 << 20));
  rec.set("peak_rss_mb", static_cast<double>(peak_rss_bytes()) / (1 << 20));
  json::Value peaks = json::Value::object();
  peaks.set("cpu", allocator_for(Device::cpu()).stats().peak_bytes);
  const Device dev = t.options().device;
  if (!dev.is_cpu()) peaks.set(dev.str(), allocator_for(dev).stats().peak_bytes);
  rec.set("device_peak_bytes", std::move(peaks));
  const json::Value g = t.take_offload_step_stats();
  for (int64_t i = 0; i < g.size(); ++i) rec.set(g.key(i), g.value(i));
  return rec;
}

json::Value eval_record(int64_t step, const EvalResult& e) {
  json::Value rec = json::Value::object();
  rec.set("step", step);
  // exp(loss) overflows past a loss of 709 (a diverging run); JSON has no inf, and the dump's
  // refusal stopped the run with "JSON cannot represent the number inf", unsaved: null instead.
  // The loss itself is NaN or inf where the weights are (a CUDA update is not checked, Note
  // [Non-finite values]) or an fp16 forward overflows: null too, not a failed log line.
  auto finite_or_null = [](double x) { return std::isfinite(x) ? json::Value(x) : json::Value(); };
  rec.set("val_loss", finite_or_null(e.loss));
  rec.set("val_ppl", finite_or_null(e.perplexity));
  return rec;
}

}  // namespace mw::train
