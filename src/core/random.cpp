// The process-wide default generator (random.h).
#include "core/random.h"

namespace mw {
Generator& default_generator() {
  static Generator g(0);
  return g;
}
}  // namespace mw
