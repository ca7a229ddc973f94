// The --log writer (train/json_log.h): a value JSON cannot hold fails that line as a failed write
// does (reported, the run goes on and exits 1), never the run; eval records log an overflowing
// perplexity, and a NaN or infinite loss, as null.
#include "train/json_log.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../data/temp_dir.h"

namespace mw::train {
namespace {

using data::testing::read_bytes;
using data::testing::TempDir;

TEST(JsonLog, AValueJsonCannotHoldFailsTheLineNotTheRun) {
  TempDir tmp;
  JsonLog log(tmp.file("log.jsonl"), 0);
  json::Value bad = json::Value::object();
  bad.set("x", std::numeric_limits<double>::infinity());
  EXPECT_NO_THROW(log.write(bad, 3));
  EXPECT_TRUE(log.failed());
  EvalResult e;
  e.loss = 5000;  // a diverged model: exp(5000) is inf
  e.perplexity = std::exp(e.loss);
  const json::Value rec = eval_record(4, e);
  EXPECT_EQ(rec.dump(), "{\"step\":4,\"val_loss\":5000.0,\"val_ppl\":null}");
  log.write(rec, 4);
  EXPECT_EQ(read_bytes(tmp.file("log.jsonl")), rec.dump() + "\n");
  e.loss = std::numeric_limits<double>::quiet_NaN();  // NaN weights (an unchecked CUDA update)
  e.perplexity = std::exp(e.loss);
  const json::Value nan_rec = eval_record(5, e);
  EXPECT_EQ(nan_rec.dump(), "{\"step\":5,\"val_loss\":null,\"val_ppl\":null}");
  JsonLog log2(tmp.file("log2.jsonl"), 0);
  log2.write(nan_rec, 5);
  EXPECT_FALSE(log2.failed()) << "a NaN validation loss failed the log line (and the run, exit 1)";
}

}  // namespace
}  // namespace mw::train
