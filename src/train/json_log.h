// The training run's JSON-lines log (--log): one object per step, and one per evaluation, written
// as the run goes, so a killed run leaves every finished step's line.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "data/json.h"
#include "train/trainer.h"

namespace mw::train {

class JsonLog {
 public:
  // A resumed run (first_step > 0) keeps the records of steps before first_step and drops the
  // rest: those of the killed run after its checkpoint, and a line torn by kill -9. So the log
  // reads as one run whose step continues. An empty path logs nothing.
  JsonLog(const std::string& path, int64_t first_step);
  // A failed write is reported once on stderr; the run goes on to save the model, then exits 1.
  void write(const json::Value& rec, int64_t step);
  bool failed() const { return failed_; }

 private:
  void fail(const std::string& what);  // reported once on stderr

  std::string path_;
  std::unique_ptr<std::ofstream> out_;
  bool failed_ = false;
};

// {"step", "loss", "lr", "grad_norm", ..., "device_peak_bytes", Gemini's counters}.
json::Value step_record(Trainer& t, const StepResult& r);
// {"step", "val_loss", "val_ppl"} (val_ppl null where exp(val_loss) overflows).
json::Value eval_record(int64_t step, const EvalResult& e);

}  // namespace mw::train
