// libFuzzer target: the safetensors reader (src/data/safetensors.h). Opening any file must succeed
// or throw a typed error; an opened file's records must lie inside it, and reading each (as raw
// bytes and, for floating dtypes, as f32) must succeed.
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "data/safetensors.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = mw::fuzz::input_file().write(data, size);
  try {
    const mw::data::SafeTensorsReader reader(path);
    for (const mw::data::TensorRecord& r : reader.tensors()) {
      if (r.file_offset < 0 || r.nbytes < 0 || r.file_offset + r.nbytes > int64_t(size)) {
        __builtin_trap();  // a record the reader accepted reaches outside the file
      }
      std::vector<char> bytes(static_cast<size_t>(r.nbytes));
      reader.read(r, bytes.data());
      try {
        reader.read_as_f32(r);
      } catch (const mw::FormatError&) {  // not a floating dtype
      }
    }
  } catch (const mw::Error&) {
  }
  return 0;
}
