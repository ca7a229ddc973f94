// StagingWindow (Note [Staging window]): items are read ahead in the expected order and come back
// bit-identical round after round on both backends; the next round expects the order the last one
// acquired; an out-of-order acquire while every slot is taken goes through the spare without
// deadlock; failed reads and writes surface as promised (Note [Staging failures]) with nothing
// lost; lent slots carry items and go back at the end of a round; files and descriptors are
// released with transfers still in flight.
#include "offload/io/staging_window.h"

#include <cerrno>
#include <chrono>
#include <thread>

#include "core/allocator.h"
#include "core/error.h"
#include "io_test_util.h"

namespace mw::io {
namespace {

using testing::count_open_fds;
using testing::fill_pattern;
using testing::matches_pattern;
using testing::TempDir;

constexpr int64_t kSlotBytes = 16384;

// Item i's size: most not multiples of 4096, the last one a whole slot.
int64_t item_bytes(int64_t i, int64_t n) {
  return i == n - 1 ? kSlotBytes : 1000 + (3001 * i) % 14000;
}
// The pattern item i holds after round r.
uint64_t seed_of(int64_t i, int round) { return static_cast<uint64_t>(1000 * round + i); }

// An engine, a swap file and a window of `slots` slots over n items, expected order 0..n-1.
struct Fixture {
  Fixture(BackendKind backend, int64_t n, int64_t slots, const std::string& dir) {
    IoOptions o;
    o.backend = backend;
    o.queue_depth = 8;
    engine = IoEngine::create(o);
    swap = std::make_unique<SwapSpace>(std::vector<std::string>{dir}, *engine);
    std::vector<StagingItem> items;
    std::vector<int64_t> order;
    for (int64_t i = 0; i < n; ++i) {
      items.push_back({"item." + std::to_string(i), item_bytes(i, n)});
      order.push_back(i);
    }
    StagingOptions so;
    so.slot_bytes = kSlotBytes;
    so.window_bytes = slots * kSlotBytes;
    so.record_times = true;
    window =
        std::make_unique<StagingWindow>(std::move(items), std::move(order), *swap, *engine, so);
  }
  // Acquires item i, checks it holds round r-1's pattern (zeros for round 0), writes round r's.
  void step(int64_t i, int64_t n, int round) {
    StagingLease lease = window->acquire(i);
    ASSERT_TRUE(lease) << "item " << i;
    ASSERT_FALSE(lease.read_error) << "item " << i;
    const int64_t nbytes = item_bytes(i, n);
    if (round == 0) {
      const auto* p = static_cast<const uint8_t*>(lease.data);
      for (int64_t b = 0; b < nbytes; ++b) ASSERT_EQ(p[b], 0) << "item " << i << " byte " << b;
    } else {
      EXPECT_TRUE(matches_pattern(lease.data, nbytes, seed_of(i, round - 1))) << "item " << i;
    }
    fill_pattern(lease.data, nbytes, seed_of(i, round));
    window->write_back(lease);
  }
  // step() on every item, in the expected order of the first round.
  void whole_round(int64_t n, int round) {
    for (int64_t i = 0; i < n; ++i) step(i, n, round);
  }
  std::unique_ptr<IoEngine> engine;
  std::unique_ptr<SwapSpace> swap;
  std::unique_ptr<StagingWindow> window;  // destroyed first
  ~Fixture() {
    window.reset();
    swap.reset();
  }
};

// Polls `cond` for up to 10 s (the pump works on its own thread).
template <typename F>
bool eventually(F cond) {
  for (int i = 0; i < 10000; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

class StagingTest : public ::testing::TestWithParam<BackendKind> {};

// Four rounds in the expected order: never-written items read as zeros, then every round sees
// the bytes of the one before; reads happen ahead of the consumer; nothing takes the spare.
TEST_P(StagingTest, ItemsComeBackInTheExpectedOrderRoundAfterRound) {
  TempDir dir;
  const int64_t n = 9;
  Fixture f(GetParam(), n, 3, dir.path());
  double round_end_ms = 0;
  for (int round = 0; round < 4; ++round) {
    if (round > 0) {  // the first slots' reads were issued ahead, before anyone asked
      for (int64_t i = 0; i < 3; ++i)
        EXPECT_TRUE(eventually([&] { return f.window->times(i).read_done_ms >= round_end_ms; }))
            << "round " << round << " item " << i;
    }
    f.whole_round(n, round);
    round_end_ms = f.window->now_ms();
    f.window->end_round();
  }
  f.window->await_write_backs();
  const StagingStats st = f.window->stats();
  EXPECT_EQ(st.spare_items, 0);
  EXPECT_EQ(st.staging_bytes, 3 * kSlotBytes);
  EXPECT_FALSE(f.window->failed());
  // Every round wrote every item once (padded to 4096); rounds 1..3 read them back, and the pump
  // may already have read up to the three slots of a fifth round.
  int64_t padded = 0;
  for (int64_t i = 0; i < n; ++i) padded += round_up(item_bytes(i, n), 4096);
  const IoStats io = f.engine->stats();
  EXPECT_EQ(io.bytes_written, 4 * padded);
  EXPECT_GE(io.bytes_read, 3 * padded);
  EXPECT_LE(io.bytes_read, 3 * padded + 3 * kSlotBytes);
}

// A window larger than its items makes a slot per item, no more (an item is in one slot at a
// time): 64 slots asked over 5 items took 64 slots' RAM, pinned, that nothing could use.
TEST_P(StagingTest, AWindowLargerThanItsItemsMakesASlotPerItem) {
  TempDir dir;
  const int64_t n = 5;
  Fixture f(GetParam(), n, 64, dir.path());
  for (int round = 0; round < 3; ++round) {
    f.whole_round(n, round);
    f.window->end_round();
  }
  f.window->await_write_backs();
  EXPECT_EQ(f.window->stats().staging_bytes, n * kSlotBytes);
  EXPECT_EQ(f.window->stats().spare_items, 0);
  EXPECT_FALSE(f.window->failed());
}

// The next round expects the order this one acquired in: its first items are read ahead.
TEST_P(StagingTest, NextRoundExpectsTheOrderThisOneAcquiredIn) {
  TempDir dir;
  const int64_t n = 8;
  Fixture f(GetParam(), n, 2, dir.path());
  f.whole_round(n, 0);
  f.window->end_round();
  // Round 1 acquires back to front: slots hold items 0 and 1, so item 7 goes through the spare.
  const std::vector<int64_t> backwards = {7, 6, 5, 4, 3, 2, 1, 0};
  for (int64_t i : backwards) f.step(i, n, 1);
  f.window->end_round();
  EXPECT_EQ(f.window->order(), backwards);
  EXPECT_TRUE(eventually([&] {
    return f.window->times(7).read_done_ms >= 0 && f.window->times(6).read_done_ms >= 0;
  }));
  const int64_t spares = f.window->stats().spare_items;
  for (int64_t i : backwards) f.step(i, n, 2);
  EXPECT_EQ(f.window->stats().spare_items, spares);  // the learned order needed no spare
  f.window->end_round();
  EXPECT_FALSE(f.window->failed());
}

// Every slot holds a read of another item: the out-of-order acquire takes the spare slot, and an
// acquire whose item sits in a slot still works while the spare lease is out.
TEST_P(StagingTest, OutOfOrderAcquireTakesTheSpareWithoutDeadlock) {
  TempDir dir;
  const int64_t n = 6;
  Fixture f(GetParam(), n, 2, dir.path());
  f.whole_round(n, 0);
  f.window->end_round();
  ASSERT_TRUE(eventually([&] {
    return f.window->times(0).read_done_ms >= 0 && f.window->times(1).read_done_ms >= 0;
  }));
  StagingLease far = f.window->acquire(5);  // items 0 and 1 fill both slots
  ASSERT_TRUE(far);
  EXPECT_EQ(far.slot, -1);
  EXPECT_TRUE(matches_pattern(far.data, item_bytes(5, n), seed_of(5, 0)));
  EXPECT_EQ(f.window->stats().spare_items, 1);
  EXPECT_EQ(f.window->stats().staging_bytes, 3 * kSlotBytes);  // the spare counts once made
  f.step(0, n, 1);  // in a slot: unaffected by the spare lease
  fill_pattern(far.data, item_bytes(5, n), seed_of(5, 1));
  f.window->write_back(far);
  for (int64_t i : {1, 2, 3, 4}) f.step(i, n, 1);
  f.window->end_round();
  f.whole_round(n, 2);  // round 1's bytes, the spare's included
  f.window->end_round();
  EXPECT_FALSE(f.window->failed());
}

// Note [Staging failures]: a failed read reaches the consumer through its lease and fails the
// window; acquires of items not yet read then return empty leases; the stored bytes are intact.
TEST_P(StagingTest, FailedReadIsReportedByItsLeaseAndStopsReadAhead) {
  TempDir dir;
  const int64_t n = 6;
  Fixture f(GetParam(), n, 2, dir.path());
  f.whole_round(n, 0);
  f.window->await_write_backs();
  f.engine->set_fault_injector([](const IoRequest& r, int64_t) {
    return r.op == IoOp::kRead ? Fault{EIO, -1} : Fault{};
  });
  f.window->end_round();  // round 1's reads start, and fail
  StagingLease lease = f.window->acquire(0);
  ASSERT_TRUE(lease);
  ASSERT_TRUE(lease.read_error);
  EXPECT_THROW(std::rethrow_exception(lease.read_error), IoError);
  f.window->release(lease);
  EXPECT_TRUE(f.window->failed());
  try {
    std::rethrow_exception(f.window->error());
  } catch (const IoError& e) {
    EXPECT_EQ(e.err, EIO);
  }
  StagingLease second = f.window->acquire(1);  // read into the other slot, and failed too
  ASSERT_TRUE(second);
  EXPECT_TRUE(second.read_error);
  f.window->release(second);
  StagingLease later = f.window->acquire(4);
  EXPECT_FALSE(later);  // never read: the window stopped at the failure
  f.engine->set_fault_injector({});
  f.window->pause();
  for (int64_t i = 2; i < n; ++i)
    EXPECT_TRUE(matches_pattern(f.window->load(i), item_bytes(i, n), seed_of(i, 0))) << i;
}

// A failed write-back keeps the new bytes in RAM: load() serves them, and store() clears that.
TEST_P(StagingTest, FailedWriteKeepsTheNewBytesInRam) {
  TempDir dir;
  const int64_t n = 4;
  Fixture f(GetParam(), n, 2, dir.path());
  f.whole_round(n, 0);
  f.window->end_round();
  f.window->await_write_backs();
  f.engine->set_fault_injector([](const IoRequest& r, int64_t) {
    return r.op == IoOp::kWrite ? Fault{ENOSPC, -1} : Fault{};
  });
  f.step(0, n, 1);
  f.window->await_write_backs();
  EXPECT_TRUE(f.window->failed());
  f.engine->set_fault_injector({});
  f.window->pause();
  EXPECT_TRUE(matches_pattern(f.window->load(0), item_bytes(0, n), seed_of(0, 1)));  // from RAM
  EXPECT_TRUE(matches_pattern(f.window->load(1), item_bytes(1, n), seed_of(1, 0)));  // disk
  fill_pattern(f.window->store_buffer(), item_bytes(0, n), seed_of(0, 7));
  f.window->store(0);
  EXPECT_TRUE(matches_pattern(f.window->load(0), item_bytes(0, n), seed_of(0, 7)));
}

// Lent memory carries items as extra slots for one round and is handed back by end_round().
TEST_P(StagingTest, LentSlotsCarryItemsUntilTheRoundEnds) {
  TempDir dir;
  const int64_t n = 10;
  Fixture f(GetParam(), n, 2, dir.path());
  f.whole_round(n, 0);
  f.window->end_round();
  {
    AlignedBuffer lent(5 * kSlotBytes + 100);
    EXPECT_TRUE(f.window->lend(lent.data(), lent.size(), 4 * kSlotBytes));  // capped at 4 slots
    EXPECT_EQ(f.window->stats().lent_bytes_max, 4 * kSlotBytes);
    EXPECT_FALSE(f.window->lend(lent.data(), lent.size(), 4 * kSlotBytes));  // cap reached
    f.whole_round(n, 1);
    f.window->end_round();  // after it the buffer may go
  }
  f.whole_round(n, 2);
  f.window->end_round();
  EXPECT_FALSE(f.window->failed());
}

// Destroying the window with write-backs and reads in flight joins them; the files go with the
// swap space and no descriptor is left open.
TEST_P(StagingTest, ReleasesEverythingWithTransfersInFlight) {
  TempDir dir;
  const int fds_before = count_open_fds();
  {
    const int64_t n = 12;
    Fixture f(GetParam(), n, 4, dir.path());
    f.whole_round(n, 0);
    f.window->end_round();  // reads start, the last writes may still be going
  }
  EXPECT_EQ(dir.file_count(), 0);
  EXPECT_EQ(count_open_fds(), fds_before);
}

TEST(StagingWindowOptions, BadItemsAndSlotsAreClearErrors) {
  TempDir dir;
  auto engine = IoEngine::create();
  SwapSpace swap({dir.path()}, *engine);
  StagingOptions so;
  so.slot_bytes = 5000;
  EXPECT_THROW(StagingWindow({{"a", 10}}, {0}, swap, *engine, so), InvalidArgument);
  so.slot_bytes = 4096;
  EXPECT_THROW(StagingWindow({{"a", 5000}}, {0}, swap, *engine, so), InvalidArgument);
  EXPECT_THROW(StagingWindow({{"a", 10}}, {}, swap, *engine, so), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, StagingTest,
                         ::testing::Values(BackendKind::kUring, BackendKind::kThreads),
                         [](const auto& info) {
                           return std::string(backend_kind_name(info.param));
                         });

}  // namespace
}  // namespace mw::io
