// Note [Streaming from rank 0] (rank0_stream.h).
#include "offload/gemini/rank0_stream.h"

namespace mw::gemini {

void stream_from_rank0(
    const Rank0Stream& s,
    const std::function<void(const std::function<void(int64_t unit)>& need)>& write) {
  int64_t held = -1;
  auto drop = [&] {
    if (held >= 0) s.release(held);
    held = -1;
  };
  auto announce = [&](int64_t unit) {
    unit = s.from_rank0(unit);
    if (unit < 0 || unit == held) return unit;
    drop();
    s.gather(unit);
    held = unit;
    return unit;
  };
  try {
    if (!s.root) {
      while (announce(-1) >= 0) {
      }
    } else {
      try {
        write([&](int64_t unit) {
          if (unit != held) announce(unit);
        });
      } catch (...) {
        try {
          announce(-1);  // let the others go before failing
        } catch (...) {
        }
        throw;
      }
      announce(-1);
    }
  } catch (...) {
    drop();
    throw;
  }
  drop();
}

}  // namespace mw::gemini
