// The file format of Adam's states, shared by HybridAdam and AdamW (--save-optimizer, training
// checkpoints' optimizer.bin): one writer, one reader, one header parser.
//
// Note [Optimizer checkpoint format]: one file, little-endian, written front to back:
//   "MWADAMv1"                                  8 bytes
//   int64 step, int64 nparams
//   per parameter: int64 numel, int64 nsegments, then nsegments x (int64 offset, int64 numel,
//                  int64 step)                  a segment is a range of elements with one step
//                  count
//   data: per parameter, per segment: m (numel f32) then v (numel f32)
// In-memory parameters save one segment; offloaded ones one per slice (Note [NVMe slices]), so the
// per-slice step counters of a partially applied step survive (Note [NVMe failure guarantee]).
// Loading maps segments onto whatever placement the loading optimizer has.
#pragma once

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/file_io.h"

namespace mw::optim {

inline constexpr char kAdamStateMagic[8] = {'M', 'W', 'A', 'D', 'A', 'M', 'v', '1'};

struct StateSegment {
  int64_t offset = 0, numel = 0, step = 0;
  int64_t data_pos = 0;  // file offset of its m (v follows)
};

// Streams the checkpoint into a temporary sibling (data/file_io.h, AtomicFileWriter), coalescing
// the small header fields into 1 MiB writes; close() renames it into place. Destroyed without
// close() (an error, a stop signal), the temporary file is removed and any earlier checkpoint is
// kept.
class AdamStateWriter {
 public:
  explicit AdamStateWriter(std::string path)
      : file_(std::move(path), "pass --save-optimizer a path in a writable directory",
              /*create_parents=*/true) {}
  void put(const void* data, int64_t nbytes) {
    const char* p = static_cast<const char*>(data);
    if (buffer_.size() + static_cast<size_t>(nbytes) > kBufferBytes) drain();
    if (static_cast<size_t>(nbytes) >= kBufferBytes)
      file_.append(p, nbytes);
    else
      buffer_.insert(buffer_.end(), p, p + nbytes);
  }
  void put_i64(int64_t x) { put(&x, 8); }
  void close() {
    drain();
    file_.commit();
  }

 private:
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  void drain() {
    if (!buffer_.empty()) file_.append(buffer_.data(), static_cast<int64_t>(buffer_.size()));
    buffer_.clear();
  }
  data::AtomicFileWriter file_;
  std::vector<char> buffer_;
};

class AdamStateReader {
 public:
  explicit AdamStateReader(std::string path) : path_(std::move(path)) {
    int64_t size_bytes = 0;
    fd_ = data::open_regular_file(path_, "optimizer checkpoint",
                                  "pass --load-optimizer a file written by --save-optimizer",
                                  &size_bytes);
  }
  ~AdamStateReader() { ::close(fd_); }
  void get_at(int64_t pos, void* data, int64_t nbytes) {
    char* p = static_cast<char*>(data);
    while (nbytes > 0) {
      ssize_t n = ::pread(fd_, p, static_cast<size_t>(nbytes), pos);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        int err = errno;
        throw IoError(str("reading optimizer checkpoint '", path_, "' at offset ", pos, ": ",
                          errno_text(err)),
                      path_, pos, nbytes, err);
      }
      MW_CHECK_T(FormatError, n > 0, "optimizer checkpoint '", path_, "' is truncated at offset ",
                 pos, "; it was not completely written. Use another checkpoint");
      p += n;
      pos += n;
      nbytes -= n;
    }
  }
  int64_t get_i64() {
    int64_t x = 0;
    get_at(pos_, &x, 8);
    pos_ += 8;
    return x;
  }
  int64_t pos() const { return pos_; }
  void skip(int64_t n) { pos_ += n; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t pos_ = 0;
};

// Reads the header of a checkpoint written for `params`: returns its step and, per parameter, its
// segments with their data positions. FormatError naming the file for anything else.
std::vector<std::vector<StateSegment>> read_segments(AdamStateReader& r,
                                                     const std::vector<Tensor>& params,
                                                     int64_t& step);
// The same for parameters of these element counts.
std::vector<std::vector<StateSegment>> read_segments(AdamStateReader& r,
                                                     const std::vector<int64_t>& numels,
                                                     int64_t& step);

// Reads elements [off, off + n) of one parameter's m and v (zeros where no segment covers them)
// from its `segments`; returns their step count (0: no state). FormatError when the range spans
// segments of different steps (a partially applied step, Note [NVMe failure guarantee]).
int64_t read_state_range(AdamStateReader& r, const std::vector<StateSegment>& segments, int64_t off,
                         int64_t n, float* m, float* v);

// Note [Sharded state files]: under ZeRO (train/zero_state_file.h) an optimizer steps 1-D pieces
// of the model's parameters, while the file is the one-process file of the whole model. Optimizer
// parameter i is then elements [offset[i], offset[i] + its numel) of file parameter param[i], and
// loading reads only those ranges (pread at their positions: not the whole file).
struct StateFileMap {
  std::vector<int64_t> file_numels;  // the file's parameters (the model's), in order
  std::vector<size_t> param;         // per optimizer parameter: its file parameter
  std::vector<int64_t> offset;       // and its first element there
};

// An optimizer's view of a state file: its own parameters (map null) or pieces (map).
class StateFileRanges {
 public:
  StateFileRanges(const std::string& path, const std::vector<Tensor>& params,
                  const StateFileMap* map);
  int64_t step() const { return step_; }
  const std::string& path() const { return reader_.path(); }
  // The file holds states for (the file parameter of) optimizer parameter i.
  bool has_state(size_t i) const { return !segments_[param_[i]].empty(); }
  // read_state_range for elements [off, off + n) of optimizer parameter i.
  int64_t read(size_t i, int64_t off, int64_t n, float* m, float* v) {
    return read_state_range(reader_, segments_[param_[i]], offset_[i] + off, n, m, v);
  }

 private:
  AdamStateReader reader_;
  int64_t step_ = 0;
  std::vector<std::vector<StateSegment>> segments_;
  std::vector<size_t> param_;
  std::vector<int64_t> offset_;
};

}  // namespace mw::optim
