// Checked POSIX file I/O shared by the data formats: a read-only file that preads exactly, and an
// atomic whole-file writer.
//
// Invariants:
// - Every read and write loops over short transfers and retries EINTR; offsets are 64-bit.
// - A system-call failure is an IoError naming the path, offset, length and errno text, plus the
//   caller's hint (what the user should do). A file that ends before the bytes it promised is a
//   FormatError ("truncated"), because the file is wrong rather than the system.
// - write_file_atomically() writes PATH.tmp, fsyncs it, renames it over PATH and fsyncs the
//   directory: a failure at any point leaves PATH as it was (absent or the old file), never half
//   written, and removes PATH.tmp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mw::data {

class ReadOnlyFile {
 public:
  // `what` names the kind of file in messages ("safetensors file"); `hint` is appended to an
  // open failure ("pass --data a path to an llm.c .bin shard").
  ReadOnlyFile(const std::string& path, const std::string& what, const std::string& hint);
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return size_bytes_; }  // at open time
  // Reads exactly nbytes at offset into dst; thread-safe (pread on a shared descriptor).
  void read_exact(void* dst, int64_t nbytes, int64_t offset) const;

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
  int64_t size_bytes_ = 0;
};

// One contiguous piece of the file to be written; pieces are written back to back.
struct WritePiece {
  const void* data;
  int64_t nbytes;
};

// See the invariants above. `hint` is appended to IoError messages ("pass --save a writable dir").
void write_file_atomically(const std::string& path, const std::vector<WritePiece>& pieces,
                           const std::string& hint);

}  // namespace mw::data
