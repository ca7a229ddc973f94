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
// The largest step a file may hold (Note [Checked optimizer values]): 2^40, far past any run.
inline constexpr int64_t kMaxStep = int64_t{1} << 40;

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

// Checks that the file starts with the optimizer checkpoint's magic (a quick look before the
// model is built); FormatError naming the file otherwise.
void check_magic(AdamStateReader& r);

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
struct StateRun {
  int64_t at = 0;      // first element in the optimizer parameter
  size_t param = 0;    // the file parameter it is read from
  int64_t offset = 0;  // first element there
  int64_t numel = 0;
};
struct StateFileMap {
  std::vector<int64_t> file_numels;  // the file's parameters (the model's), in order
  std::vector<size_t> param;         // per optimizer parameter: its file parameter
  std::vector<int64_t> offset;       // and its first element there
  // When not empty, instead of param/offset: per optimizer parameter, the runs it is read from;
  // elements no run covers have no state (Note [Optimizer layouts]).
  std::vector<std::vector<StateRun>> runs;
};

// Note [Optimizer layouts]: the parameters an optimizer steps are the model's own (plain runs),
// Gemini's chunks (each the model's parameters packed at offsets, padding between), or 1-D pieces
// of either (ZeRO). A checkpoint records its file's layout as a StateFileMap over the model's
// parameters: model parameter p is elements [offset[p], offset[p] + numel) of file parameter
// param[p]. Loading it into another layout (Gemini with another chunk size or host budget, or no
// Gemini at all) maps each optimizer parameter onto the file through the model's parameters:
// remap_state_file gives, for optimizer parameter i = elements [piece_offset[i], + piece_numel[i])
// of the current layout's file parameter piece_param[i], the runs to read from a file written in
// `saved`'s layout. FormatError when `saved` does not describe a model of these parameters.
StateFileMap remap_state_file(const StateFileMap& saved, const StateFileMap& now,
                              const std::vector<int64_t>& model_numels,
                              const std::vector<size_t>& piece_param,
                              const std::vector<int64_t>& piece_offset,
                              const std::vector<int64_t>& piece_numel);

// An optimizer's view of a state file: its own parameters (map null) or pieces (map).
class StateFileRanges {
 public:
  StateFileRanges(const std::string& path, const std::vector<Tensor>& params,
                  const StateFileMap* map);
  int64_t step() const { return step_; }
  const std::string& path() const { return reader_.path(); }
  // The file holds states for (a file parameter of) optimizer parameter i.
  bool has_state(size_t i) const;
  // read_state_range for elements [off, off + n) of optimizer parameter i, through its runs.
  int64_t read(size_t i, int64_t off, int64_t n, float* m, float* v);

 private:
  AdamStateReader reader_;
  int64_t step_ = 0;
  std::vector<std::vector<StateSegment>> segments_;
  std::vector<std::vector<StateRun>> runs_;  // per optimizer parameter
};

}  // namespace mw::optim
