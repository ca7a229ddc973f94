// libFuzzer target: the llm.c token-shard reader (src/data/token_shard.h). Opening any file must
// succeed or throw a typed error; an opened shard must serve batches (which wrap around its end),
// its largest token and the vocabulary check.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/token_shard.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = mw::fuzz::input_file().write(data, size);
  try {
    const mw::data::TokenShard shard(path);
    std::vector<int32_t> batch(2 * 5);
    for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{1} << 40}) {
      shard.batch(step, 2, 5, batch.data());
      for (int32_t id : batch) {
        if (id < 0 || id > 65535) __builtin_trap();  // uint16 tokens only
      }
    }
    const int32_t max_id = shard.max_token();
    if (max_id < 0 || max_id > 65535) __builtin_trap();
    shard.check_vocab(50257);
  } catch (const mw::Error&) {
  }
  return 0;
}
