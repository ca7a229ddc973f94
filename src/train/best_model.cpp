// --save-best and --early-stop (Trainer::keep_best).
//
// Note [Best model and early stopping]: a person fine-tuning GPT-2 on a few megabytes of their
// own text overfits it within an epoch or two: the val loss falls, then rises while the train loss
// keeps falling, and the model saved after the last step is worse than one of the evaluations
// already showed. HF's Trainer answers with load_best_model_at_end and EarlyStoppingCallback;
// here `--save-best DIR` saves the model (an HF folder, written whole and renamed into place, as
// --save is) after every evaluation whose val loss is lower than every one before it, and
// `--early-stop N` ends the run after N evaluations in a row without a lower one (--save then
// saves the last model, --save-best holds the best). The lowest loss, its step and the count
// since are part of the checkpoint's trainer.json, so a resumed run keeps comparing against the
// same best (and, resuming bit for bit, finds and saves the same models). A NaN or infinite loss
// is never the best. Under data parallel the ranks agree on the verdict (their val losses are the
// same computation on the same weights; the agreement makes sure), because saving under ZeRO 3
// gathers parameters from every rank.
#include <cmath>

#include "core/numbers.h"
#include "train/data_parallel.h"
#include "train/trainer.h"

namespace mw::train {

BestVerdict Trainer::keep_best(const EvalResult& e) {
  BestVerdict v;
  if (o_.save_best.empty() && o_.early_stop == 0) return v;
  v.best = std::isfinite(e.loss) && e.loss < best_.loss;
  if (dp_ && dp_->comm().size() > 1) {
    const dist::CommStats before = dp_->comm().stats();
    v.best = dp_->mean_over_ranks(v.best ? 1.0 : 0.0) > 0;  // any rank: all of them
    dp_->exclude_comm_since(before);                        // not the training step's communication
  }
  if (v.best) {
    best_ = {e.loss, step_, 0};
    if (!o_.save_best.empty()) {
      save_model(o_.save_best, o_.save_dtype);
      await_root_saves();
    }
    v.text = o_.save_best.empty() ? " | best so far" : " | best so far, saved to " + o_.save_best;
    return v;
  }
  ++best_.evals_since;
  v.stop = o_.early_stop > 0 && best_.evals_since >= o_.early_stop && !done();  // not the end
  if (best_.step >= 0)
    v.text = str(" | best ", format_fixed(best_.loss, 3), " at step ", best_.step, " (",
                 best_.evals_since, " evaluation", best_.evals_since == 1 ? "" : "s", " ago)");
  return v;
}

std::string Trainer::early_stop_text() const {
  return str("Stopped early after step ", step_, " (--early-stop ", o_.early_stop,
             "): ", best_.evals_since, " evaluations without a val loss below ",
             format_fixed(best_.loss, 3), " (step ", best_.step, ")\n");
}

}  // namespace mw::train
