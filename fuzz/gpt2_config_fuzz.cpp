// libFuzzer target: the HuggingFace config.json loader (src/models/gpt2/config_json.cpp). Any text
// must load into a valid Config or throw a typed error; a loaded config must write JSON that loads
// back to the same JSON.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "models/gpt2/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const mw::gpt2::Config config = mw::gpt2::Config::from_json_text(text, "config.json");
    config.validate();
    const std::string once = config.to_json();
    if (mw::gpt2::Config::from_json_text(once, "written.json").to_json() != once) __builtin_trap();
  } catch (const mw::Error&) {
  }
  return 0;
}
