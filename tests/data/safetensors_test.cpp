// Tests of the safetensors reader and writer (src/data/safetensors.h): round trips, the exact byte
// layout HF expects, and a FormatError naming file and problem for every kind of corruption.
#include "data/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "data/json.h"
#include "temp_dir.h"

namespace mw::data {
namespace {

using testing::expect_throw_with;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// A file from a raw header text and data buffer: 8-byte little-endian length, header, data.
std::string make_file(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  std::string bytes(reinterpret_cast<const char*>(&n), 8);
  return bytes + header + data;
}

template <typename T>
std::vector<T> iota_vec(int64_t n, T start) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<T>(start + static_cast<T>(i));
  return v;
}

template <typename T>
void expect_bytes_equal(const std::vector<T>& expected, const std::vector<T>& got,
                        const std::string& name) {
  ASSERT_EQ(expected.size(), got.size()) << name;
  int shown = 0;
  for (size_t i = 0; i < expected.size() && shown < 5; ++i) {
    if (std::memcmp(&expected[i], &got[i], sizeof(T)) != 0) {
      ADD_FAILURE() << name << "[" << i << "]: expected " << +expected[i] << ", got " << +got[i];
      ++shown;
    }
  }
}

TEST(SafeTensors, RoundTripsDTypesShapesScalarsAndEmptyTensors) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  auto f32 = iota_vec<float>(2 * 3 * 4, -1.5f);
  auto f64 = iota_vec<double>(5, 0.25);
  std::vector<uint16_t> f16 = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000};  // 1, -2, max, tiny, -0
  std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x4049};                 // 1, -1, 3.14
  auto i32 = iota_vec<int32_t>(7, -3);
  auto i64 = iota_vec<int64_t>(3, int64_t{1} << 40);
  auto u16 = iota_vec<uint16_t>(9, 65530);  // wraps: exercises the full uint16 range
  float scalar = 42.5f;

  SafeTensorsWriter w;
  w.add("transformer.h.0.attn.c_attn.weight", DType::F32, {2, 3, 4}, f32.data());
  w.add("f64", DType::F64, {5}, f64.data());
  w.add("f16", DType::F16, {5, 1}, f16.data());
  w.add("empty", DType::F32, {0, 768}, nullptr);
  w.add("bf16", DType::BF16, {3}, bf16.data());
  w.add("scalar", DType::F32, {}, &scalar);
  w.add("i32", DType::I32, {7}, i32.data());
  w.add("i64", DType::I64, {1, 3}, i64.data());
  w.add("u16", DType::U16, {3, 3}, u16.data());
  w.set_metadata("format", "pt");
  w.set_metadata("producer", "memwall \"test\"");
  w.write(path);
  EXPECT_FALSE(std::filesystem::exists(temporary_sibling(path)));

  SafeTensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), 9u);
  // tensors() is in file-offset order, which for our writer is the order added.
  const char* order[] = {"transformer.h.0.attn.c_attn.weight",
                         "f64",
                         "f16",
                         "empty",
                         "bf16",
                         "scalar",
                         "i32",
                         "i64",
                         "u16"};
  for (int i = 0; i < 9; ++i) EXPECT_EQ(r.tensors()[i].name, order[i]);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("producer"), "memwall \"test\"");

  auto read_vec = [&](const std::string& name, auto tag, DType dtype, std::vector<int64_t> shape) {
    using T = decltype(tag);
    const TensorRecord& rec = r.at(name);
    EXPECT_EQ(rec.dtype, dtype) << name;
    EXPECT_EQ(rec.shape, shape) << name;
    EXPECT_EQ(rec.nbytes, rec.numel() * static_cast<int64_t>(sizeof(T))) << name;
    std::vector<T> out(static_cast<size_t>(rec.numel()));
    r.read(rec, out.data());
    return out;
  };
  expect_bytes_equal(f32, read_vec(order[0], float{}, DType::F32, {2, 3, 4}), "f32");
  expect_bytes_equal(f64, read_vec("f64", double{}, DType::F64, {5}), "f64");
  expect_bytes_equal(f16, read_vec("f16", uint16_t{}, DType::F16, {5, 1}), "f16");
  EXPECT_TRUE(read_vec("empty", float{}, DType::F32, {0, 768}).empty());
  expect_bytes_equal(bf16, read_vec("bf16", uint16_t{}, DType::BF16, {3}), "bf16");
  expect_bytes_equal({scalar}, read_vec("scalar", float{}, DType::F32, {}), "scalar");
  expect_bytes_equal(i32, read_vec("i32", int32_t{}, DType::I32, {7}), "i32");
  expect_bytes_equal(i64, read_vec("i64", int64_t{}, DType::I64, {1, 3}), "i64");
  expect_bytes_equal(u16, read_vec("u16", uint16_t{}, DType::U16, {3, 3}), "u16");

  // read_as_f32 widens every floating dtype exactly (these values are representable in each).
  EXPECT_EQ(r.read_as_f32(r.at("f16")),
            (std::vector<float>{1.0f, -2.0f, 65504.0f, 5.9604644775390625e-08f, -0.0f}));
  EXPECT_EQ(r.read_as_f32(r.at("bf16")), (std::vector<float>{1.0f, -1.0f, 3.140625f}));
  EXPECT_EQ(r.read_as_f32(r.at("f64")), (std::vector<float>{0.25f, 1.25f, 2.25f, 3.25f, 4.25f}));
  expect_throw_with<FormatError>([&] { r.read_as_f32(r.at("i32")); },
                                 {"\"i32\" is I32", "expected a floating dtype"});
}

TEST(SafeTensors, ByteLayoutIsWhatHuggingFaceExpects) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<float> a = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  std::vector<uint16_t> b = {7, 8, 9};
  SafeTensorsWriter w;
  w.add("wte.weight", DType::F32, {2, 3}, a.data());
  w.add("b", DType::BF16, {3}, b.data());
  w.set_metadata("format", "pt");
  w.write(path);

  const std::string bytes = read_bytes(path);
  // The JSON HF's safe_open parses, written out by hand; then spaces up to a multiple of 8.
  const std::string json = R"({"__metadata__":{"format":"pt"},)"
                           R"("wte.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                           R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]}})";
  const size_t padded = (json.size() + 7) / 8 * 8;
  ASSERT_EQ(bytes.size(), 8 + padded + 30);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);  // LE by hand
  EXPECT_EQ(n, padded);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, json.size()), json);
  EXPECT_EQ(bytes.substr(8 + json.size(), padded - json.size()),
            std::string(padded - json.size(), ' '));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + padded, a.data(), 24), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + padded + 24, b.data(), 6), 0);
  EXPECT_EQ(w.header(), bytes.substr(8, padded));
}

TEST(SafeTensors, ReadsForeignFilesWithGapsAndUnsortedHeaders) {
  // HF writers order the header alphabetically, not by offset; we sort records by offset.
  TempDir dir;
  const std::string path = dir.file("x.safetensors");
  std::string data(20, '\0');
  float one = 1.0f, two = 2.0f;
  std::memcpy(&data[12], &one, 4);
  std::memcpy(&data[16], &two, 4);
  write_bytes(path, make_file(R"({"z":{"dtype":"F32","shape":[],"data_offsets":[12,16]},)"
                              R"("a":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}}  )",
                              data));
  SafeTensorsReader r(path);
  ASSERT_EQ(r.tensors().size(), 2u);
  EXPECT_EQ(r.tensors()[0].name, "z");
  EXPECT_EQ(r.read_as_f32(r.at("z")), std::vector<float>{1.0f});
  EXPECT_EQ(r.read_as_f32(r.at("a")), std::vector<float>{2.0f});
  EXPECT_TRUE(r.metadata().empty());
}

struct Corruption {
  const char* label;
  std::string bytes;
  std::vector<std::string> needles;
};

TEST(SafeTensors, EveryCorruptionIsAFormatErrorNamingFileAndProblem) {
  TempDir dir;
  const std::string good_tensor = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\x01');
  std::string huge_len(8, '\0');
  huge_len[4] = 1;  // 2^32 bytes of header
  std::string past_end(8, '\0');
  past_end[0] = 100;  // 100-byte header in a file with 10 bytes after the length
  const std::vector<Corruption> cases = {
      {"empty file", "", {"is 0 bytes, shorter than the 8-byte header length"}},
      {"7 bytes", std::string(7, '\0'), {"is 7 bytes"}},
      {"absurd header length", huge_len + "{}", {"header length 4294967296 is absurd"}},
      {"git-lfs pointer",
       "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 548105171\n",
       {"is a git-lfs pointer", "git lfs pull"}},
      {"header past end", past_end + "0123456789", {"header length 100 runs past the end"}},
      {"invalid JSON", make_file("{\"w\": [1,}", ""), {"invalid JSON", ":1:"}},
      {"not an object", make_file("[]", ""), {"header must be a JSON object"}},
      {"metadata not strings",
       make_file(R"({"__metadata__":{"a":1}})", ""),
       {"\"__metadata__\" value of \"a\" must be a string"}},
      {"missing dtype",
       make_file(R"({"w":{"shape":[2],"data_offsets":[0,8]}})", data8),
       {"tensor \"w\"", "missing \"dtype\""}},
      {"missing shape",
       make_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", data8),
       {"missing \"shape\""}},
      {"missing offsets",
       make_file(R"({"w":{"dtype":"F32","shape":[2]}})", data8),
       {"missing \"data_offsets\""}},
      // Not one of the format's dtypes. (F8_E4M3, U8, BOOL, ... are listed and refused only
      // when read: HfFolders.MaskBuffersInU8OrBoolAreSkipped.)
      {"unknown dtype",
       make_file(R"({"w":{"dtype":"Q4","shape":[8],"data_offsets":[0,8]}})", data8),
       {"tensor \"w\"", "unsupported dtype \"Q4\""}},
      {"negative dim",
       make_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8),
       {"non-negative integers, found number -2"}},
      {"fractional dim",
       make_file(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8),
       {"non-negative integers, found number 2.0"}},
      {"string dim",
       make_file(R"({"w":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}})", data8),
       {"found string \"2\""}},
      {"one offset",
       make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", data8),
       {"must be an array [begin, end]"}},
      {"end before begin",
       make_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data8),
       {"data_offsets [8, 0] end before they begin"}},
      {"size mismatch",
       make_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8 + data8),
       {"span 8 bytes, but shape [3] of F32 needs 3 x 4 = 12 bytes"}},
      {"offsets outside buffer",
       make_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})", data8),
       {"run past the end of the data buffer, which holds 8 bytes"}},
      {"truncated data",
       make_file("{" + good_tensor + "}", data8.substr(0, 5)),
       {"data buffer, which holds 5 bytes", "truncated"}},
      {"overlap",
       make_file("{" + good_tensor + R"(,"v":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})",
                 data8),
       {"\"w\" (data bytes [0, 8)) and \"v\" (data bytes [4, 8)) overlap"}},
      {"overflowing shape",
       make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
                 data8),
       {"too large"}},
  };
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.label);
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);  // every message names the file
    expect_throw_with<FormatError>([&] { SafeTensorsReader r(path); }, needles);
  }
}

TEST(SafeTensors, TruncatingAValidFileAnywhereIsAnError) {
  // Every proper prefix of a valid file must be refused on open, never crash or read garbage.
  TempDir dir;
  std::vector<float> a(10, 1.0f);
  SafeTensorsWriter w;
  w.add("a", DType::F32, {10}, a.data());
  w.add("b", DType::F32, {2, 5}, a.data());
  const std::string full_path = dir.file("full.safetensors");
  w.write(full_path);
  const std::string bytes = read_bytes(full_path);
  const std::string path = dir.file("cut.safetensors");
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(path, bytes.substr(0, len));
    EXPECT_THROW(SafeTensorsReader{path}, FormatError) << "prefix of " << len << " bytes";
  }
}

TEST(SafeTensors, MissingTensorAndMissingFileAreNamed) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  float x = 1.0f;
  SafeTensorsWriter w;
  w.add("wte.weight", DType::F32, {}, &x);
  w.write(path);
  SafeTensorsReader r(path);
  EXPECT_EQ(r.find("lm_head.weight"), nullptr);
  expect_throw_with<FormatError>([&] { r.at("lm_head.weight"); },
                                 {path, "no tensor \"lm_head.weight\"", "wte.weight"});
  try {
    SafeTensorsReader missing(dir.file("nope.safetensors"));
    ADD_FAILURE() << "opened a missing file";
  } catch (const IoError& e) {
    EXPECT_EQ(e.err, ENOENT);
    EXPECT_EQ(e.path, dir.file("nope.safetensors"));
    EXPECT_NE(std::string(e.what()).find("ENOENT"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--init-from"), std::string::npos) << e.what();
  }
}

TEST(SafeTensors, WriterRejectsBadInputAndFailedWritesLeaveNothing) {
  TempDir dir;
  float x = 0.0f;
  SafeTensorsWriter w;
  w.add("a", DType::F32, {}, &x);
  expect_throw_with<InvalidArgument>([&] { w.add("a", DType::F32, {}, &x); }, {"added twice"});
  expect_throw_with<InvalidArgument>([&] { w.add("__metadata__", DType::F32, {}, &x); },
                                     {"reserved"});
  expect_throw_with<InvalidArgument>(
      [&] {
        w.add("n", DType::F32, {2, -1}, &x);
      },
      {"[2, -1]", "non-negative"});
  expect_throw_with<InvalidArgument>([&] { w.add("z", DType::F32, {4}, nullptr); }, {"null data"});

  // A directory that does not exist: IoError naming the path, no file or .tmp left behind.
  const std::string path = dir.file("no_such_dir/model.safetensors");
  try {
    w.write(path);
    ADD_FAILURE() << "wrote into a missing directory";
  } catch (const IoError& e) {
    EXPECT_EQ(e.err, ENOENT);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--save"), std::string::npos) << e.what();
  }
  // Writing over an existing file replaces it whole.
  const std::string good = dir.file("m.safetensors");
  write_bytes(good, "old contents");
  w.write(good);
  EXPECT_EQ(SafeTensorsReader(good).tensors().size(), 1u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            1);  // no stray .tmp

  // EACCES: only observable when not root (root bypasses permission bits).
  if (::geteuid() != 0) {
    const std::string ro = dir.file("ro");
    std::filesystem::create_directory(ro);
    ::chmod(ro.c_str(), 0555);
    expect_throw_with<IoError>([&] { w.write(ro + "/m.safetensors"); }, {"EACCES", ro});
    ::chmod(ro.c_str(), 0755);
  }
}

// Note [Streaming save]: a tensor whose bytes are produced when the writer reaches it gives the
// same file as one added from memory, in pieces of any size; a producer that emits too few or too
// many bytes, or throws, leaves no file.
TEST(SafeTensors, StreamedTensorsWriteTheSameBytesAndAWrongCountLeavesNothing) {
  TempDir dir;
  std::vector<float> a(1000), b(37);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) * 0.5f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
  SafeTensorsWriter plain;
  plain.add("a", DType::F32, {10, 100}, a.data());
  plain.add("b", DType::F32, {37}, b.data());
  plain.write(dir.file("plain.safetensors"));
  int produced = 0;
  SafeTensorsWriter streamed;
  streamed.add_streamed("a", DType::F32, {10, 100}, [&](const ByteSink& emit) {
    ++produced;
    emit(a.data(), 1200);  // in three uneven pieces
    emit(reinterpret_cast<const char*>(a.data()) + 1200, 1);
    emit(reinterpret_cast<const char*>(a.data()) + 1201, 4000 - 1201);
  });
  streamed.add("b", DType::F32, {37}, b.data());
  EXPECT_EQ(produced, 0) << "a producer ran before write()";
  streamed.write(dir.file("streamed.safetensors"));
  EXPECT_EQ(produced, 1);
  EXPECT_EQ(read_bytes(dir.file("plain.safetensors")),
            read_bytes(dir.file("streamed.safetensors")));

  for (int64_t emit_bytes : {int64_t{3996}, int64_t{4004}}) {
    SafeTensorsWriter wrong;
    wrong.add_streamed("a", DType::F32, {10, 100}, [&](const ByteSink& emit) {
      std::vector<char> bytes(static_cast<size_t>(emit_bytes));
      emit(bytes.data(), emit_bytes);
    });
    expect_throw_with<InvalidArgument>([&] { wrong.write(dir.file("wrong.safetensors")); },
                                       {"\"a\"", "4000"});
  }
  SafeTensorsWriter failing;
  failing.add_streamed("a", DType::F32, {10, 100},
                       [](const ByteSink&) { throw IoError("the tier's read failed"); });
  expect_throw_with<IoError>([&] { failing.write(dir.file("failing.safetensors")); },
                             {"the tier's read failed"});
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()),
                          std::filesystem::directory_iterator()),
            2)
      << "a failed streamed write left a file or a .tmp behind";
}

}  // namespace
}  // namespace mw::data
