// Device names and byte-count parsing for command lines.
#include "core/device.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "core/error.h"

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
    index = std::stoi(idx);
  }
  if (kind == "cpu" && colon == std::string::npos) return Device::cpu();
  if (kind == "sim") return Device::sim(index);
  if (kind == "cuda") return Device::cuda(index);
  throw InvalidArgument(str("unknown device '", text, "': expected cpu, sim[:N] or cuda[:N]"));
}

int64_t parse_bytes(const std::string& text) {
  size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  MW_CHECK_T(InvalidArgument, pos > 0, "byte count '", text,
             "': expected a number with an optional unit such as 4GiB, 512MiB or 1.5GB");
  double value = std::stod(text.substr(0, pos));
  std::string unit = text.substr(pos);
  double scale = 0;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "KiB" || unit == "K")
    scale = 1024.0;
  else if (unit == "MiB" || unit == "M")
    scale = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G")
    scale = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T")
    scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB")
    scale = 1e3;
  else if (unit == "MB")
    scale = 1e6;
  else if (unit == "GB")
    scale = 1e9;
  else if (unit == "TB")
    scale = 1e12;
  MW_CHECK_T(InvalidArgument, scale > 0, "byte count '", text, "': unknown unit '", unit,
             "'; use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB");
  return static_cast<int64_t>(std::llround(value * scale));
}

}  // namespace mw
