// safetensors reader (validating every header field against the file) and writer. See
// safetensors.h for the layout and the invariants.
#include "data/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "core/allocator.h"
#include "core/error.h"
#include "data/json.h"

namespace mw::data {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host would need byte swaps");

namespace {

const char* kOpenHint = "pass --init-from a folder holding model.safetensors";
const char* kWriteHint = "pass --save a writable directory";

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {
    {DType::F32, "F32"}, {DType::F64, "F64"}, {DType::F16, "F16"}, {DType::BF16, "BF16"},
    {DType::I32, "I32"}, {DType::I64, "I64"}, {DType::U16, "U16"},
};

// numel of `shape`, or -1 on int64 overflow.
int64_t checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == dtype) return d.name;
  }
  throw InvalidArgument(str("dtype ", dtype_name(dtype), " has no safetensors name"));
}

DType parse_safetensors_dtype(const std::string& name) {
  for (const DTypeName& d : kDTypeNames) {
    if (name == d.name) return d.dtype;
  }
  throw FormatError(
      str("unsupported dtype \"", name, "\"; memwall reads F32, F64, F16, BF16, I32, I64 and U16"));
}

int64_t TensorRecord::numel() const { return checked_numel(shape); }

std::string TensorRecord::dtype_text() const {
  return unread_dtype.empty() ? safetensors_dtype_name(dtype) : unread_dtype;
}

namespace {
// The other dtypes of the safetensors format, with their element sizes: listed, never read.
int64_t unread_dtype_size(const std::string& name) {
  for (const auto& [n, size] :
       std::initializer_list<std::pair<const char*, int64_t>>{{"BOOL", 1},
                                                              {"U8", 1},
                                                              {"I8", 1},
                                                              {"F8_E4M3", 1},
                                                              {"F8_E5M2", 1},
                                                              {"I16", 2},
                                                              {"U32", 4},
                                                              {"U64", 8}})
    if (name == n) return size;
  return 0;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
// Reader

namespace {

// The reader's error: the file, then the problem.
struct Problem {
  const std::string& path;
  FormatError operator()(const std::string& problem) const {
    return FormatError(str("safetensors file '", path, "': ", problem));
  }
};

// The header's length (checked against the file) and its JSON object.
json::Value read_header(ReadOnlyFile& file, const Problem& fail, int64_t* header_bytes) {
  const int64_t file_bytes = file.size_bytes();
  if (file_bytes < 8) {
    throw fail(str("the file is ", file_bytes,
                   " bytes, shorter than the 8-byte header length that starts every safetensors "
                   "file (truncated, or not a safetensors file)"));
  }
  uint64_t n = 0;
  file.read_exact(&n, 8, 0);  // little-endian u64 (static_assert above)
  if (n > static_cast<uint64_t>(kMaxHeaderBytes)) {
    // A clone of a model repository without git-lfs holds text pointers in place of the weights.
    char start[8];
    std::memcpy(start, &n, 8);
    if (std::string_view(start, 8) == "version ")
      throw fail(
          "is a git-lfs pointer (a text file naming the weights), not the weights: fetch them "
          "with `git lfs pull` in the repository");
    throw fail(str("header length ", n, " is absurd (the limit is ", kMaxHeaderBytes,
                   " bytes): the file is corrupt or not a safetensors file"));
  }
  if (static_cast<int64_t>(n) > file_bytes - 8) {
    throw fail(str("header length ", n, " runs past the end of the ", file_bytes,
                   "-byte file (truncated or corrupt)"));
  }
  *header_bytes = static_cast<int64_t>(n);
  std::string text(static_cast<size_t>(n), '\0');
  file.read_exact(text.data(), *header_bytes, 8);
  json::Value header;
  try {
    header = json::parse(text, "safetensors header of '" + fail.path + "'");
  } catch (const FormatError& e) {
    throw FormatError(str(e.what(), " (the file is corrupt or not a safetensors file)"));
  }
  if (!header.is_object())
    throw fail(str("header must be a JSON object, found ", header.describe()));
  return header;
}

void read_metadata(const json::Value& entry, const Problem& fail,
                   std::map<std::string, std::string>& metadata) {
  if (!entry.is_object()) {
    throw fail(str("\"__metadata__\" must be an object of strings, found ", entry.describe()));
  }
  for (int64_t m = 0; m < entry.size(); ++m) {
    if (!entry.value(m).is_string()) {
      throw fail(str("\"__metadata__\" value of \"", entry.key(m), "\" must be a string, found ",
                     entry.value(m).describe()));
    }
    metadata[entry.key(m)] = entry.value(m).as_string();
  }
}

// Where a tensor's data lies and how large it is, as the header says.
struct Extent {
  int64_t data_start = 0, data_bytes = 0, file_bytes = 0, header_bytes = 0;
};

// The [begin, end) data offsets of a tensor entry, each a non-negative integer, end >= begin.
template <typename Bad>
std::pair<int64_t, int64_t> read_offsets(const json::Value& entry, const Bad& bad) {
  const json::Value& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    throw bad(str("\"data_offsets\" must be an array [begin, end], found ", offsets.describe()));
  }
  for (const json::Value& o : offsets.elements()) {
    if (!o.is_integer() || o.as_int() < 0) {
      throw bad(str("\"data_offsets\" must hold non-negative integers, found ", o.describe()));
    }
  }
  const int64_t begin = offsets.at(int64_t{0}).as_int();
  const int64_t end = offsets.at(int64_t{1}).as_int();
  if (end < begin) throw bad(str("data_offsets [", begin, ", ", end, "] end before they begin"));
  return {begin, end};
}

// One tensor entry of the header, every field checked against the file.
TensorRecord read_record(const std::string& name, const json::Value& entry, const Problem& fail,
                         const Extent& x) {
  auto bad = [&](const std::string& problem) {
    return fail(str("tensor \"", name, "\": ", problem));
  };
  if (!entry.is_object()) throw bad(str("expected an object, found ", entry.describe()));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) throw bad(str("missing \"", key, "\""));
  }
  TensorRecord rec;
  rec.name = name;
  const json::Value& dtype = entry.at("dtype");
  if (!dtype.is_string()) throw bad(str("\"dtype\" must be a string, found ", dtype.describe()));
  int64_t element_bytes = unread_dtype_size(dtype.as_string());
  if (element_bytes > 0) {
    rec.dtype = DType::U16;  // meaningless: unread_dtype says what it is
    rec.unread_dtype = dtype.as_string();
  } else {
    try {
      rec.dtype = parse_safetensors_dtype(dtype.as_string());
    } catch (const FormatError& e) {
      throw bad(e.what());
    }
    element_bytes = dtype_size(rec.dtype);
  }
  const json::Value& shape = entry.at("shape");
  if (!shape.is_array()) throw bad(str("\"shape\" must be an array, found ", shape.describe()));
  for (const json::Value& d : shape.elements()) {
    if (!d.is_integer() || d.as_int() < 0) {
      throw bad(str("\"shape\" must hold non-negative integers, found ", d.describe()));
    }
    rec.shape.push_back(d.as_int());
  }
  const auto [begin, end] = read_offsets(entry, bad);
  const int64_t numel = checked_numel(rec.shape);
  int64_t expected_bytes = 0;
  if (numel < 0 || __builtin_mul_overflow(numel, element_bytes, &expected_bytes)) {
    throw bad(str("shape ", shape_text(rec.shape), " is too large to address"));
  }
  if (end - begin != expected_bytes) {
    throw bad(str("data_offsets [", begin, ", ", end, "] span ", end - begin, " bytes, but shape ",
                  shape_text(rec.shape), " of ", dtype.as_string(), " needs ", numel, " x ",
                  element_bytes, " = ", expected_bytes, " bytes"));
  }
  if (end > x.data_bytes) {
    throw bad(str("data_offsets [", begin, ", ", end, "] run past the end of the data buffer, ",
                  "which holds ", x.data_bytes, " bytes (file of ", x.file_bytes,
                  " bytes, header of ", x.header_bytes, "): the file is truncated or corrupt"));
  }
  rec.file_offset = x.data_start + begin;
  rec.nbytes = end - begin;
  return rec;
}

// Sorts the records by file offset and checks that no two non-empty ranges overlap.
void sort_and_check_overlaps(std::vector<TensorRecord>& tensors, const Problem& fail,
                             int64_t data_start) {
  std::stable_sort(
      tensors.begin(), tensors.end(),
      [](const TensorRecord& a, const TensorRecord& b) { return a.file_offset < b.file_offset; });
  const TensorRecord* prev = nullptr;
  for (const TensorRecord& rec : tensors) {
    if (rec.nbytes == 0) continue;
    if (prev && rec.file_offset < prev->file_offset + prev->nbytes) {
      throw fail(str("tensors \"", prev->name, "\" (data bytes [", prev->file_offset - data_start,
                     ", ", prev->file_offset - data_start + prev->nbytes, ")) and \"", rec.name,
                     "\" (data bytes [", rec.file_offset - data_start, ", ",
                     rec.file_offset - data_start + rec.nbytes,
                     ")) overlap: the header is corrupt"));
    }
    if (!prev || rec.file_offset + rec.nbytes > prev->file_offset + prev->nbytes) prev = &rec;
  }
}

}  // namespace

SafeTensorsReader::SafeTensorsReader(const std::string& path)
    : file_(path, "safetensors file", kOpenHint) {
  const Problem fail{path};
  const json::Value header = read_header(file_, fail, &header_bytes_);
  Extent x;
  x.file_bytes = file_.size_bytes();
  x.header_bytes = header_bytes_;
  x.data_start = 8 + header_bytes_;
  x.data_bytes = x.file_bytes - x.data_start;
  for (int64_t i = 0; i < header.size(); ++i) {
    if (header.key(i) == "__metadata__")
      read_metadata(header.value(i), fail, metadata_);
    else
      tensors_.push_back(read_record(header.key(i), header.value(i), fail, x));
  }
  sort_and_check_overlaps(tensors_, fail, x.data_start);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = static_cast<int64_t>(i);
}

const TensorRecord* SafeTensorsReader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorRecord& SafeTensorsReader::at(const std::string& name) const {
  const TensorRecord* rec = find(name);
  if (!rec) {
    std::string some;
    for (size_t i = 0; i < tensors_.size() && i < 5; ++i) {
      some += (i ? ", " : "") + tensors_[i].name;
    }
    throw FormatError(str("safetensors file '", path(), "' has no tensor \"", name, "\"; it holds ",
                          tensors_.size(), " tensors (", some, tensors_.size() > 5 ? ", ..." : "",
                          "): is it a checkpoint of another model?"));
  }
  return *rec;
}

void SafeTensorsReader::read(const TensorRecord& record, void* dst) const {
  MW_CHECK_T(FormatError, record.unread_dtype.empty(), "safetensors file '", path(), "': tensor \"",
             record.name, "\" is ", record.unread_dtype,
             ", which memwall does not read (F32, F64, F16, BF16, I32, I64, U16)");
  file_.read_exact(dst, record.nbytes, record.file_offset);
}

std::vector<float> SafeTensorsReader::read_as_f32(const TensorRecord& record) const {
  MW_CHECK_T(FormatError, record.unread_dtype.empty() && is_floating(record.dtype),
             "safetensors file '", path(), "': tensor \"", record.name, "\" is ",
             record.dtype_text(), ", expected a floating dtype (F32, F64, F16, BF16)");
  const int64_t numel = record.numel();
  std::vector<float> out(static_cast<size_t>(numel));
  if (record.dtype == DType::F32) {
    read(record, out.data());
    return out;
  }
  std::vector<char> raw(static_cast<size_t>(record.nbytes));
  read(record, raw.data());
  for (int64_t i = 0; i < numel; ++i) {
    if (record.dtype == DType::F64) {
      double d;
      std::memcpy(&d, raw.data() + 8 * i, 8);
      out[i] = static_cast<float>(d);
    } else {
      uint16_t h;
      std::memcpy(&h, raw.data() + 2 * i, 2);
      out[i] = record.dtype == DType::F16 ? half_to_float(h) : bf16_to_float(h);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

int64_t SafeTensorsWriter::check_new(const std::string& name, DType dtype,
                                     const std::vector<int64_t>& shape) const {
  MW_CHECK_T(InvalidArgument, name != "__metadata__",
             "safetensors: \"__metadata__\" is reserved and cannot name a tensor");
  for (const Entry& e : entries_) {
    MW_CHECK_T(InvalidArgument, e.name != name, "safetensors: tensor \"", name,
               "\" was added twice; names must be unique");
  }
  for (int64_t d : shape) {
    MW_CHECK_T(InvalidArgument, d >= 0, "safetensors: tensor \"", name, "\" has shape ",
               shape_text(shape), "; dimensions must be non-negative");
  }
  safetensors_dtype_name(dtype);  // throws for a dtype safetensors cannot name
  int64_t numel = checked_numel(shape);
  int64_t nbytes = 0;
  MW_CHECK_T(InvalidArgument,
             numel >= 0 && !__builtin_mul_overflow(numel, dtype_size(dtype), &nbytes),
             "safetensors: tensor \"", name, "\" shape ", shape_text(shape), " is too large");
  return nbytes;
}

void SafeTensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            const void* data) {
  const int64_t nbytes = check_new(name, dtype, shape);
  MW_CHECK_T(InvalidArgument, data != nullptr || nbytes == 0, "safetensors: tensor \"", name,
             "\" has ", nbytes, " bytes but null data");
  entries_.push_back({std::move(name), dtype, std::move(shape), data, nbytes, {}});
}

void SafeTensorsWriter::add_streamed(std::string name, DType dtype, std::vector<int64_t> shape,
                                     ByteProducer produce) {
  MW_CHECK_T(InvalidArgument, produce != nullptr, "safetensors: tensor \"", name,
             "\" has no producer");
  const int64_t nbytes = check_new(name, dtype, shape);
  entries_.push_back(
      {std::move(name), dtype, std::move(shape), nullptr, nbytes, std::move(produce)});
}

void SafeTensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafeTensorsWriter::header() const {
  json::Value root = json::Value::object();
  if (!metadata_.empty()) {
    json::Value meta = json::Value::object();
    for (const auto& [k, v] : metadata_) meta.set(k, v);
    root.set("__metadata__", std::move(meta));
  }
  int64_t offset = 0;
  for (const Entry& e : entries_) {
    json::Value t = json::Value::object();
    t.set("dtype", safetensors_dtype_name(e.dtype));
    json::Value shape = json::Value::array();
    for (int64_t d : e.shape) shape.push_back(d);
    t.set("shape", std::move(shape));
    json::Value offsets = json::Value::array();
    offsets.push_back(offset);
    offsets.push_back(offset + e.nbytes);
    t.set("data_offsets", std::move(offsets));
    root.set(e.name, std::move(t));
    offset += e.nbytes;
  }
  std::string text = root.dump();
  text.resize(static_cast<size_t>(round_up(static_cast<int64_t>(text.size()), 8)), ' ');
  return text;
}

void SafeTensorsWriter::write(const std::string& path, bool atomic) const {
  const std::string text = header();
  const uint64_t n = text.size();
  ByteProducer produce = [&](const ByteSink& emit) {
    emit(&n, 8);
    emit(text.data(), static_cast<int64_t>(text.size()));
    for (const Entry& e : entries_) {
      if (!e.produce) {
        emit(e.data, e.nbytes);
        continue;
      }
      int64_t emitted = 0;
      e.produce([&](const void* data, int64_t nbytes) {
        MW_CHECK_T(InvalidArgument, emitted + nbytes <= e.nbytes, "safetensors: tensor \"", e.name,
                   "\" produced more than its ", e.nbytes, " bytes");
        emit(data, nbytes);
        emitted += nbytes;
      });
      MW_CHECK_T(InvalidArgument, emitted == e.nbytes, "safetensors: tensor \"", e.name,
                 "\" produced ", emitted, " of its ", e.nbytes, " bytes");
    }
  };
  if (atomic)
    write_file_atomically(path, produce, kWriteHint);
  else
    write_file(path, produce, kWriteHint);
}

}  // namespace mw::data
