// Process-wide limits a long run may need raised.
//
// Note [Open files]: a training run keeps every --data shard open (data::TokenShard), and llm.c's
// FineWeb-Edu 100B comes as 1,000 shards; with the usual soft limit of 1,024 open files the run
// failed at the 1,018th shard ("Too many open files") and told the user to pass another shard.
// The soft limit is raised to the hard one at start, as Go's runtime does for its programs (the
// soft 1,024 exists for select(2), which memwall does not use); where the hard limit itself is
// too low, the error names the limit and `ulimit -n`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace mw {

// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the soft limit now (-1: unknown).
int64_t raise_open_file_limit();
// The soft limit on open files (-1: unknown).
int64_t open_file_limit();

// Calls f(dir, v2) for the folder of this process's cgroup and of each cgroup above it, as
// /proc/self/cgroup names them: in the v2 hierarchy (under /sys/fs/cgroup) and in the v1 hierarchy
// holding `v1_controller` ("cpu", "memory"; under /sys/fs/cgroup/<its controllers>). The limits of
// a cgroup are the least over these levels; a level whose folder is missing (Docker v1 mounts the
// container's own cgroup at the root, while /proc/self/cgroup names it from the host's) is passed
// all the same, and its files simply do not open. Note [CPU quota] (threads.cpp), the memory check.
void for_each_cgroup_level(const std::string& v1_controller,
                           const std::function<void(const std::string& dir, bool v2)>& f);

}  // namespace mw
