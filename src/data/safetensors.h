// The HuggingFace safetensors format: reader and writer.
//
// Layout: an 8-byte little-endian u64 N; N bytes of JSON header
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ..}
// then the data buffer; offsets are relative to its start, byte ranges [b, e).
//
// Reader invariants (checked on open; each failure is a FormatError naming the file, the tensor and
// what was expected and found; opening never reads the data buffer):
// - the file has the 8-byte length, the header length is at most kMaxHeaderBytes and fits the file;
// - the header is strict JSON, an object; "__metadata__", if present, maps strings to strings;
// - every tensor has a known dtype, a shape of non-negative integers, data_offsets [b, e] with
//   0 <= b <= e <= data buffer size and e - b == numel * dtype size; tensor byte ranges do not
//   overlap. Gaps and trailing bytes are tolerated.
// tensors() is sorted by file offset (sequential reads); names are unique (JSON keys).
//
// Writer invariants: the header is padded with spaces to a multiple of 8 bytes (as HF does, so the
// data buffer starts 8-aligned); tensors are laid out back to back in the order added; the file
// appears under its final name only when complete (file_io.h, write_file_atomically).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "data/file_io.h"

namespace mw::data {

inline constexpr int64_t kMaxHeaderBytes = int64_t{100} << 20;  // the HF library's own limit

// "F32" <-> DType::F32 etc. Unknown names are a FormatError naming the dtype and the known ones.
const char* safetensors_dtype_name(DType dtype);
DType parse_safetensors_dtype(const std::string& name);

struct TensorRecord {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // [] for a scalar
  int64_t file_offset;         // absolute byte offset of the first element in the file
  int64_t nbytes;
  // A dtype memwall does not read (BOOL, U8, I8, ...: the attention-mask buffers older transformers
  // saved): its name in the file, and `dtype` is meaningless. Such a tensor is listed and its bytes
  // bounds-checked; reading it is refused. (The whole file was refused until session 38.)
  std::string unread_dtype;
  int64_t numel() const;
  std::string dtype_text() const;  // the file's name of the dtype ("F32", "U8")
};

class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);

  const std::vector<TensorRecord>& tensors() const { return tensors_; }
  const TensorRecord* find(const std::string& name) const;
  // FormatError naming the file and the tensor when missing.
  const TensorRecord& at(const std::string& name) const;
  // Reads the tensor's raw little-endian bytes (record.nbytes of them) into dst. Thread-safe.
  void read(const TensorRecord& record, void* dst) const;
  // Reads a floating tensor (F32, F64, F16, BF16) converted to float; FormatError for others.
  std::vector<float> read_as_f32(const TensorRecord& record) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_.path(); }
  int64_t header_bytes() const { return header_bytes_; }

 private:
  ReadOnlyFile file_;
  int64_t header_bytes_ = 0;
  std::vector<TensorRecord> tensors_;
  std::map<std::string, int64_t> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

class SafeTensorsWriter {
 public:
  // Adds a tensor whose numel(shape) * dtype_size(dtype) bytes start at `data`. The bytes are NOT
  // copied: they must stay valid and unchanged until write() returns. InvalidArgument for a
  // repeated or reserved name, a negative dimension, or null data with a non-empty shape.
  void add(std::string name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Adds a tensor whose bytes are produced only when write() reaches it (Note [Streaming save] in
  // models/gpt2/hf_io.cpp): `produce` must emit exactly numel * dtype size bytes, in order; an
  // exception it throws abandons the file.
  void add_streamed(std::string name, DType dtype, std::vector<int64_t> shape,
                    ByteProducer produce);
  void set_metadata(std::string key, std::string value);
  // The header JSON exactly as write() puts it in the file, padding included.
  std::string header() const;
  // Writes the file atomically (or, with atomic = false, in place: for a file inside a staged
  // folder, atomic_save.h); IoError naming the path (and ENOSPC/EACCES) on failure.
  void write(const std::string& path, bool atomic = true) const;
  int64_t num_tensors() const { return static_cast<int64_t>(entries_.size()); }

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    int64_t nbytes;
    ByteProducer produce;  // set for add_streamed
  };
  // The tensor's byte count; InvalidArgument for a bad name, dtype or shape.
  int64_t check_new(const std::string& name, DType dtype, const std::vector<int64_t>& shape) const;
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace mw::data
