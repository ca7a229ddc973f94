// Device names and their parsing for command lines.
#include "core/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"
#include "core/numbers.h"

namespace mw {

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::CPU: return "cpu";
    case DeviceKind::Sim: return "sim:" + std::to_string(index);
    case DeviceKind::CUDA: return "cuda:" + std::to_string(index);
  }
  return "?";
}

Device parse_device(const std::string& text) {
  auto colon = text.find(':');
  std::string kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    std::string idx = text.substr(colon + 1);
    MW_CHECK_T(InvalidArgument, !idx.empty() && std::all_of(idx.begin(), idx.end(), ::isdigit),
               "device '", text, "': expected an index after ':' such as 'sim:0'");
    index = static_cast<int>(parse_integer(idx, str("device '", text, "' index"), 0, 1023));
  }
  if (kind == "cpu" && colon == std::string::npos) return Device::cpu();
  if (kind == "sim") return Device::sim(index);
  if (kind == "cuda") return Device::cuda(index);
  throw InvalidArgument(str("unknown device '", text, "': expected cpu, sim[:N] or cuda[:N]"));
}

}  // namespace mw
