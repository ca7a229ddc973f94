// SwapSpace: random blob sizes (most not multiples of 4096) round-trip bit-identically on both
// backends, striped over several directories; space is reused and given back; files are unlinked
// on every path out; directory errors are clear; the O_DIRECT fallback warns once.
#include "offload/io/swap_space.h"

#include <sys/stat.h>

#include <fstream>
#include <random>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "io_test_util.h"
#include "offload/io/log.h"

namespace mw::io {
namespace {

using testing::count_open_fds;
using testing::fill_pattern;
using testing::matches_pattern;
using testing::TempDir;

class SwapTest : public testing::BackendTest {
 protected:
  std::unique_ptr<IoEngine> make(int depth = 16) { return BackendTest::make(depth); }
};

// Three directories, 256 KiB chunks, 40 blobs of random sizes written from 4 threads, rewritten
// partly with new sizes, read back concurrently.
TEST_P(SwapTest, RandomBlobsRoundTripAcrossStripedDirs) {
  TempDir a, b, c;
  auto engine = make(16);
  SwapOptions opts;
  opts.chunk_bytes = 256 << 10;
  SwapSpace swap({a.path(), b.path(), c.path()}, *engine, opts);
  EXPECT_TRUE(swap.direct());
  EXPECT_EQ(a.file_count() + b.file_count() + c.file_count(), 3);
  constexpr int kBlobs = 40, kThreads = 4;
  std::mt19937_64 rng(123);
  std::vector<int64_t> sizes(kBlobs);
  std::vector<uint64_t> seeds(kBlobs);
  std::vector<AlignedBuffer> bufs(kBlobs);
  auto new_value = [&](int i) {
    // 1 byte .. ~3 MiB, rarely a multiple of 4096.
    sizes[i] = 1 + static_cast<int64_t>(rng() % (3 << 20));
    seeds[i] = rng();
    bufs[i] = AlignedBuffer(sizes[i]);
    fill_pattern(bufs[i].data(), sizes[i], seeds[i]);
  };
  for (int i = 0; i < kBlobs; ++i) new_value(i);
  auto write_all = [&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        std::vector<IoHandle> hs;
        for (int i = t; i < kBlobs; i += kThreads)
          hs.push_back(swap.write("blob" + std::to_string(i), bufs[i].data(), sizes[i]));
        for (auto& h : hs) h.wait();
      });
    for (auto& th : ts) th.join();
  };
  write_all();
  for (int i = 0; i < kBlobs; i += 3) new_value(i);  // a third change size: free + reallocate
  write_all();
  EXPECT_EQ(swap.size(), kBlobs);
  std::vector<AlignedBuffer> back(kBlobs);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::vector<IoHandle> hs;
      for (int i = (t + 1) % kThreads; i < kBlobs; i += kThreads) {
        std::string key = "blob" + std::to_string(i);
        back[i] = AlignedBuffer(swap.nbytes(key));
        hs.push_back(swap.read(key, back[i].data()));
      }
      for (auto& h : hs) h.wait();
    });
  for (auto& th : ts) th.join();
  for (int i = 0; i < kBlobs; ++i) {
    EXPECT_EQ(swap.nbytes("blob" + std::to_string(i)), sizes[i]);
    ASSERT_TRUE(matches_pattern(back[i].data(), sizes[i], seeds[i])) << "blob " << i;
  }
  // The space in use is what the blobs need, padded to 4096, plus any holes.
  int64_t padded = 0;
  for (int i = 0; i < kBlobs; ++i) padded += round_up(sizes[i], kHostAlignment);
  EXPECT_EQ(swap.file_bytes() - swap.hole_bytes(), padded);
  // Erase everything: all files shrink to zero (holes before the tail merge, Note in
  // space_allocator.h).
  for (int i = 0; i < kBlobs; ++i) EXPECT_TRUE(swap.erase("blob" + std::to_string(i)));
  EXPECT_FALSE(swap.erase("blob0"));
  EXPECT_EQ(swap.file_bytes(), 0);
  for (const std::string& p : swap.file_paths()) {
    struct stat st {};
    ASSERT_EQ(stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_size, 0) << p << " should have been truncated";
  }
}

// A blob larger than chunk_bytes is split across the files round-robin, so each file holds a
// share; a rewrite of the same padded size reuses the same place.
TEST_P(SwapTest, LargeBlobIsStripedAndRewrittenInPlace) {
  TempDir a, b;
  auto engine = make(8);
  SwapOptions opts;
  opts.chunk_bytes = 64 << 10;
  SwapSpace swap({a.path(), b.path()}, *engine, opts);
  const int64_t n = 5 * (64 << 10) + 100;  // 6 chunks: 3 per file, the last one short
  AlignedBuffer buf(n);
  fill_pattern(buf.data(), n, 1);
  swap.write("w", buf.data(), n).wait();
  EXPECT_EQ(swap.file_bytes(), round_up(n, kHostAlignment));
  int64_t before = swap.file_bytes();
  fill_pattern(buf.data(), n, 2);
  swap.write("w", buf.data(), n - 50).wait();  // same padded size
  EXPECT_EQ(swap.file_bytes(), before);
  AlignedBuffer back(n);
  swap.read("w", back.data()).wait();
  EXPECT_TRUE(matches_pattern(back.data(), n - 50, 2));
  EXPECT_EQ(engine->stats().requests_failed, 0);
}

// Fault on one chunk of one blob: that blob's handle throws, the neighbour blob is intact.
TEST_P(SwapTest, FaultInOneBlobLeavesOthersIntact) {
  TempDir d;
  auto engine = make(8);
  SwapOptions opts;
  opts.chunk_bytes = 16 << 10;
  SwapSpace swap({d.path()}, *engine, opts);
  const int64_t n = 100000;
  AlignedBuffer x(n), y(n);
  fill_pattern(x.data(), n, 10);
  fill_pattern(y.data(), n, 20);
  swap.write("x", x.data(), n).wait();
  int64_t base = engine->stats().requests_completed;
  engine->set_fault_injector([base](const IoRequest&, int64_t seq) {
    Fault f;
    if (seq == base + 2) f.error = EIO;         // third chunk of y
    if (seq == base + 4) f.short_bytes = 4096;  // a short one, resumed
    return f;
  });
  IoHandle hy = swap.write("y", y.data(), n);
  EXPECT_THROW(hy.wait(), IoError);
  engine->set_fault_injector({});
  AlignedBuffer back(n);
  swap.read("x", back.data()).wait();
  EXPECT_TRUE(matches_pattern(back.data(), n, 10));
}

// Files disappear with the SwapSpace, including when a constructor fails half-way and when an
// exception unwinds past it; no descriptor is left open.
TEST_P(SwapTest, FilesAndDescriptorsAreReleasedOnEveryPath) {
  TempDir a, b;
  auto engine = make(4);
  int fds_before = count_open_fds();
  {
    SwapSpace swap({a.path(), b.path()}, *engine);
    AlignedBuffer buf(10000);
    swap.write("k", buf.data(), 10000).wait();
    EXPECT_EQ(a.file_count() + b.file_count(), 2);
  }
  EXPECT_EQ(a.file_count() + b.file_count(), 0);
  // Second directory is unusable (its parent is a regular file): the first file must be removed.
  std::string blocker = b.path() + "/not-a-dir";
  std::ofstream(blocker) << "x";
  EXPECT_THROW(SwapSpace({a.path(), blocker + "/sub"}, *engine), IoError);
  EXPECT_EQ(a.file_count(), 0);
  try {
    AlignedBuffer buf(4096);  // declared first: it must outlive the write SwapSpace's dtor joins
    SwapSpace swap({a.path()}, *engine);
    IoHandle h = swap.write("k", buf.data(), 4096);
    throw std::runtime_error("unwind");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(a.file_count(), 0);
  EXPECT_EQ(count_open_fds(), fds_before);
}

INSTANTIATE_TEST_SUITE_P(Backends, SwapTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreads),
                         [](const auto& info) {
                           return std::string(backend_kind_name(info.param));
                         });

TEST(SwapSpaceDirs, MissingDirectoryIsCreated) {
  TempDir root;
  auto engine = IoEngine::create({BackendKind::kThreads, 4, 0});
  std::string deep = root.path() + "/x/y/z";
  SwapSpace swap({deep}, *engine);
  struct stat st {};
  EXPECT_EQ(stat(deep.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST(SwapSpaceDirs, UnusableDirectoryGivesClearError) {
  TempDir root;
  auto engine = IoEngine::create({BackendKind::kThreads, 4, 0});
  std::string file = root.path() + "/plain";
  std::ofstream(file) << "x";
  try {
    SwapSpace swap({file}, *engine);
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(file), std::string::npos) << what;
    EXPECT_NE(what.find("directory"), std::string::npos) << what;
  }
}

TEST(SwapSpaceDirs, RejectsMisalignedBuffers) {
  TempDir root;
  auto engine = IoEngine::create({BackendKind::kThreads, 4, 0});
  SwapSpace swap({root.path()}, *engine);
  AlignedBuffer buf(8192);
  EXPECT_THROW(swap.write("k", static_cast<char*>(buf.data()) + 8, 100), InvalidArgument);
  EXPECT_THROW(swap.read("missing", buf.data()), InvalidArgument);
}

// Note [O_DIRECT fallback]: a file system that refuses O_DIRECT gives buffered files and exactly
// one warning that names the consequence.
TEST(SwapSpaceDirs, BufferedFallbackWarnsOnce) {
  TempDir a, b;
  auto engine = IoEngine::create({BackendKind::kThreads, 4, 0});
  std::vector<std::string> warnings;
  LogSink old = set_log_sink([&](LogLevel level, const std::string& m) {
    if (level == LogLevel::kWarning) warnings.push_back(m);
  });
  set_refuse_direct_for_testing(true);
  {
    SwapSpace swap({a.path(), b.path()}, *engine);
    EXPECT_FALSE(swap.direct());
    AlignedBuffer buf(5000), back(5000);
    fill_pattern(buf.data(), 5000, 9);
    swap.write("k", buf.data(), 5000).wait();
    swap.read("k", back.data()).wait();
    EXPECT_TRUE(matches_pattern(back.data(), 5000, 9));
  }
  set_refuse_direct_for_testing(false);
  set_log_sink(old);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("page cache"), std::string::npos) << warnings[0];
}

}  // namespace
}  // namespace mw::io
