// libFuzzer target: the strict JSON parser (src/data/json.h). Any input must parse or throw a
// FormatError; a parsed value must serialise and parse back to the same text.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const mw::json::Value v = mw::json::parse(text, "fuzz.json");
    const std::string once = v.dump();
    if (mw::json::parse(once, "dumped.json").dump() != once) __builtin_trap();
  } catch (const mw::Error&) {
  }
  return 0;
}
