// make_private_dir and the file system checks (scratch_dir.h).
#include "offload/io/scratch_dir.h"

#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace mw::io {

namespace {

constexpr long kTmpfsMagic = 0x01021994;  // linux/magic.h
constexpr long kRamfsMagic = 0x858458f6;

}  // namespace

std::string memory_file_system(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec).lexically_normal();
  if (ec) return "";
  for (;;) {
    struct statfs s {};
    if (::statfs(p.c_str(), &s) == 0) {
      if (static_cast<long>(s.f_type) == kTmpfsMagic) return "tmpfs";
      if (static_cast<long>(s.f_type) == kRamfsMagic) return "ramfs";
      return "";
    }
    if (!p.has_relative_path()) return "";
    p = p.parent_path();
  }
}

std::string offload_base_among(const std::vector<std::string>& candidates) {
  for (const std::string& dir : candidates) {
    std::error_code ec;
    if (std::filesystem::is_directory(dir, ec) && ::access(dir.c_str(), W_OK | X_OK) == 0 &&
        memory_file_system(dir).empty())
      return dir;
  }
  return candidates.empty() ? "/tmp" : candidates.front();
}

std::string default_offload_base() {
  if (const char* base = ::getenv("TMPDIR"); base && *base) return base;
  return offload_base_among({"/tmp", "/var/tmp"});
}

std::string make_private_dir(const std::string& stem) {
  std::string pattern = str(default_offload_base(), "/memwall-", stem, "-XXXXXX");
  if (::mkdtemp(pattern.data()) == nullptr) {
    const int err = errno;
    throw IoError(str("cannot create a private offload directory '", pattern, "': ",
                      errno_text(err), "; pass --nvme-dir to a writable directory on a disk"),
                  pattern, 0, 0, err);
  }
  return pattern;
}

}  // namespace mw::io
