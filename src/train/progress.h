// The progress line of a training step: step/total, loss, LR, gradient norm, tokens/s, ETA and
// memory per tier. On a terminal it is redrawn in place ("\r"); otherwise each step prints one
// plain line after the documents' "[k] loss: x.xxx" line, which stays exactly as the ColossalAI
// documents and the README quote it.
#pragma once

#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace mw::train {

// "12m05s", "1h02m", "45s".
std::string format_duration(double seconds);

// "step 12/300 | loss 5.123 | lr 6.00e-04 | grad norm 1.23 (clipped) | 1234 tok/s | ETA 2m05s |
// RSS 300 MiB | sim:0 peak 700 MiB | NVMe 474 MiB". median_step_ms estimates the ETA.
std::string progress_text(const StepResult& r, int64_t total_steps, double median_step_ms,
                          const std::string& memory);

}  // namespace mw::train
