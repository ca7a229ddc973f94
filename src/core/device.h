// Device = {kind, index}. Kinds: cpu (host RAM), sim (a simulated accelerator whose memory is host
// memory behind its own capped allocator), cuda (a GPU, when the CUDA backend is built).
//
// Invariant: sim runs exactly the CPU kernels, so a sim run is bitwise identical to a cpu run; only
// where bytes live, and which allocator counts them, differs (Note [The sim device], allocator.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/numbers.h"  // parse_bytes, for the callers that parse devices and sizes together

namespace mw {

enum class DeviceKind : uint8_t { CPU, Sim, CUDA };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;

  static Device cpu() { return {DeviceKind::CPU, 0}; }
  static Device sim(int index = 0) { return {DeviceKind::Sim, index}; }
  static Device cuda(int index = 0) { return {DeviceKind::CUDA, index}; }

  bool is_cpu() const { return kind == DeviceKind::CPU; }
  bool is_sim() const { return kind == DeviceKind::Sim; }
  bool is_cuda() const { return kind == DeviceKind::CUDA; }
  // True where the CPU kernels can read the bytes directly (cpu and sim).
  bool is_host_addressable() const { return kind != DeviceKind::CUDA; }

  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "sim:0", "cuda:0"
};

// Parses "cpu", "sim", "sim:1", "cuda", "cuda:0". Throws InvalidArgument otherwise.
Device parse_device(const std::string& text);

}  // namespace mw
