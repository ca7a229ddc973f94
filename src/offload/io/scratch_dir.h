// A private scratch directory for offloaded bytes: "<TMPDIR or /tmp>/memwall-<stem>-XXXXXX".
// Owners create their swap files in it, unlink the files at once and remove the directory right
// after (Note [NVMe files], optim/nvme_states.h), so nothing outlives the process on any exit path.
#pragma once

#include <string>

namespace mw::io {

// Throws IoError naming the directory and what to do when it cannot be created.
std::string make_private_dir(const std::string& stem);

}  // namespace mw::io
