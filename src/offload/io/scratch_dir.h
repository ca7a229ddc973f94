// A private scratch directory for offloaded bytes: "<base>/memwall-<stem>-XXXXXX", where the base
// is $TMPDIR, else /tmp unless that lives in RAM, else /var/tmp (Note [Offload in RAM]).
// Owners create their swap files in it, unlink the files at once and remove the directory right
// after (Note [NVMe files], optim/nvme_states.h), so nothing outlives the process on any exit path.
//
// Note [Offload in RAM]: a tmpfs or ramfs folder is memory, so bytes "offloaded" into it never
// leave RAM: they leave the process's RSS (page-cache pages are not mapped) but take the machine's
// MemAvailable all the same, and O_DIRECT, which tmpfs accepts since Linux 6.6, changes nothing.
// Many systems mount /tmp so (Debian 13, Fedora, Arch), which made --offload nvme and Gemini's
// third tier there an expensive copy into RAM reported as disk. So the default base skips a /tmp in
// RAM for /var/tmp (on disk by the FHS), an explicit $TMPDIR or --nvme-dir in RAM is taken as
// asked but warned about, and the memory check counts those bytes as host RAM
// (train/memory_check.cpp).
#pragma once

#include <string>
#include <vector>

namespace mw::io {

// Throws IoError naming the directory and what to do when it cannot be created.
std::string make_private_dir(const std::string& stem);

// Where make_private_dir makes its directories: $TMPDIR when set, else
// offload_base_among({"/tmp", "/var/tmp"}).
std::string default_offload_base();
// The first of `candidates` that is a writable folder not in RAM; the first when none is.
std::string offload_base_among(const std::vector<std::string>& candidates);

// "tmpfs" or "ramfs" when the file system that holds `path` (or would, once created: its nearest
// existing ancestor) keeps its files in RAM; "" otherwise or when it cannot be told.
std::string memory_file_system(const std::string& path);

}  // namespace mw::io
