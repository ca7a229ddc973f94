// Chunk-size search (Note [Chunk-size search]), packing, the tensor-state whitelist and the OPT
// planner against an exhaustive search.
#include "offload/gemini/chunk_search.h"

#include <gtest/gtest.h>

#include <random>

#include "models/gpt2/spec.h"
#include "offload/gemini/placement.h"
#include "offload/gemini/tensor_state.h"

namespace mw::gemini {
namespace {

std::vector<int64_t> gpt2_sizes(const std::string& preset) {
  std::vector<int64_t> sizes;
  for (const auto& spec : gpt2::tensor_specs(gpt2::Config::preset(preset)))
    sizes.push_back(shape_numel(spec.shape));
  return sizes;
}

// ColossalAI's Gemini example prints, for GPT-2 small with hidden_dim 768: "used number: 118.68
// MB, wasted number: 0.75 MB, total wasted percentage is 0.63%". The units are 2^20 elements.
// The numbers below are the element arithmetic of Note [Chunk-size search] done by hand (the
// embedding 50257 x 768 = 38,597,376 is the only size above mean + 3 std = 10,584,051.6).
TEST(ChunkSearch, ReproducesTheDocumentsLineForGpt2Small) {
  ChunkSearchOptions o;
  o.interval_numel = 768;
  const std::vector<int64_t> sizes = gpt2_sizes("small");
  const ChunkSearchResult r = search_chunk_size(sizes, o);
  EXPECT_EQ(r.total_numel, 124439808);
  EXPECT_FALSE(r.single_chunk);
  ASSERT_EQ(r.outlier.size(), sizes.size());
  EXPECT_TRUE(r.outlier[0]);  // transformer.wte.weight
  for (size_t i = 1; i < sizes.size(); ++i) EXPECT_FALSE(r.outlier[i]) << i;
  EXPECT_EQ(r.chunk_numel, 43312896);  // 56397 x 768
  EXPECT_EQ(r.wasted_numel, 783360);   // 0.747 x 2^20
  const std::string line = r.log_line();
  EXPECT_NE(line.find("used number: 118.68 MB, wasted number: 0.75 MB, total wasted percentage "
                      "is 0.63%"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.rfind("searching chunk configuration is completed in ", 0), 0u) << line;
}

TEST(ChunkSearch, SmallModelsAreOneChunkAndWasteIsEveryTail) {
  const ChunkSearchResult r = search_chunk_size({10, 20, 30});
  EXPECT_TRUE(r.single_chunk);
  EXPECT_EQ(r.chunk_numel, 60);
  EXPECT_EQ(r.wasted_numel, 0);
  // First fit in order into 50: [10, 20] (tail 20), [30] (tail 20).
  EXPECT_EQ(packing_waste({10, 20, 30}, 50), 40);
  EXPECT_EQ(packing_waste({50, 50}, 50), 0);
  // A tensor larger than the chunks (--chunk-size below wte's size) gets a chunk of its own size,
  // and the open chunk stays open, as pack_chunks does: 10 and 20 share one chunk, 20 wasted.
  // (Counted as a chunk of the given size, it made the waste negative: -11.95% printed.)
  EXPECT_EQ(packing_waste({10, 80, 20}, 50), 20);
  EXPECT_EQ(pack_chunks({10, 80, 20}, 50, {}), (std::vector<int>{0, 1, 0}));
}

TEST(ChunkSearch, PackingIsFirstFitInOrderWithOutliersAlone) {
  // Capacity 100: 60 | outlier 500 alone | 30 joins 60's chunk | 20 opens chunk 2 | 200 > capacity.
  const std::vector<int> chunk =
      pack_chunks({60, 500, 30, 20, 200, 10}, 100, {false, true, false, false, false, false});
  EXPECT_EQ(chunk, (std::vector<int>{0, 1, 0, 2, 3, 2}));
}

TEST(TensorStates, FollowTheWhitelistAndCountWhatIsNot) {
  using S = TensorState;
  EXPECT_TRUE(is_legal_transition(S::kFree, S::kHold));
  EXPECT_TRUE(is_legal_transition(S::kHold, S::kCompute));
  EXPECT_TRUE(is_legal_transition(S::kCompute, S::kHoldAfterBwd));
  EXPECT_TRUE(is_legal_transition(S::kHoldAfterBwd, S::kReadyForReduce));
  EXPECT_TRUE(is_legal_transition(S::kReadyForReduce, S::kHold));
  EXPECT_FALSE(is_legal_transition(S::kHold, S::kReadyForReduce));
  EXPECT_FALSE(is_legal_transition(S::kCompute, S::kReadyForReduce));
  EXPECT_FALSE(is_legal_transition(S::kReadyForReduce, S::kCompute));
  TensorStates st({"a", "b"});
  st.set(0, S::kHold);
  st.set(0, S::kHold);  // the same state: not a transition
  EXPECT_EQ(st.illegal_transitions(), 0);
  st.set(0, S::kReadyForReduce);  // illegal: applied and counted
  st.set(1, S::kReadyForReduce);
  EXPECT_EQ(st.illegal_transitions(), 2);
  EXPECT_EQ(st.get(0), S::kReadyForReduce);
}

// Belady's OPT evicts the fewest chunks when all chunks have one size, so on such traces its
// host -> device bytes must equal the exhaustive minimum. A planner that evicts the nearest next
// use, or any chunk at random, fails this on most of the traces.
TEST(Placement, OptPlanEqualsBruteForceOnEqualSizedChunks) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 40; ++trial) {
    const int nchunks = 3 + static_cast<int>(rng() % 3);
    const int nops = 6 + static_cast<int>(rng() % 6);
    std::vector<TraceOp> trace(static_cast<size_t>(nops));
    for (auto& op : trace) {
      op.chunks.push_back(static_cast<int>(rng() % static_cast<unsigned>(nchunks)));
      if (rng() % 3 == 0) {
        const int other = static_cast<int>(rng() % static_cast<unsigned>(nchunks));
        if (other != op.chunks[0]) op.chunks.push_back(other);
      }
    }
    const std::vector<int64_t> bytes(static_cast<size_t>(nchunks), 100);
    const std::vector<int64_t> avail(static_cast<size_t>(nops), 200 + 100 * (trial % 2));
    const PlanResult plan = plan_opt(trace, bytes, avail);
    ASSERT_TRUE(plan.fits);
    EXPECT_EQ(plan.load_bytes, brute_force_min_load_bytes(trace, bytes, avail))
        << "trial " << trial;
  }
}

TEST(Placement, StaticOffloadIsInChunkOrderAndDeterministic) {
  EXPECT_EQ(choose_offloaded({10, 10, 10, 10}, 0.5), (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(choose_offloaded({10, 10, 10, 10}, 0.0), (std::vector<bool>(4, false)));
  EXPECT_EQ(choose_offloaded({10, 10, 10, 10}, 1.0), (std::vector<bool>(4, true)));
  EXPECT_EQ(choose_offloaded({30, 10, 10}, 0.4), (std::vector<bool>{true, false, false}));
}

}  // namespace
}  // namespace mw::gemini

namespace mw::gemini {
namespace {

// Note [Three tiers]: the states go to disk first, then replicated chunks last first, and only then
// sharded chunks' pieces, last first (Note [Pieces on disk]), each just until the rest fits.
TEST(Placement, TiersHomeReplicatedChunksOnDiskBeforePieces) {
  // Four chunks of K bytes: 0 and 1 replicated, 2 and 3 sharded over two ranks (K/2-byte pieces);
  // the states (8 bytes per chunk here) stream through a window of two 4096-byte slots, the least
  // a window takes (optim::staging_window_bytes), though 100 bytes were asked for.
  constexpr int64_t K = 100000;
  std::vector<TierChunk> chunks;
  for (int c = 0; c < 4; ++c) chunks.push_back({K, c < 2 ? K : K / 2, 8, true, true, c >= 2});
  const int64_t reserve = 3 * K, window = 2 * 4096;
  auto plan = [&](int64_t cap) { return plan_tiers(chunks, cap, 0.0, 100, 1024); };
  auto disk = [](const TierPlan& t) {
    std::vector<int> out;
    for (size_t c = 0; c < t.on_disk.size(); ++c)
      if (t.on_disk[c]) out.push_back(static_cast<int>(c));
    return out;
  };
  // Everything fits (homes 3K, states 32): nothing on disk, the states in RAM.
  TierPlan t = plan(3 * K + 32 + reserve);
  EXPECT_EQ(disk(t), std::vector<int>{});
  EXPECT_EQ(t.nvme_fraction, 0.0);
  // One byte short: all states to disk (the window stays), then chunk 1 (the last replicated),
  // though chunk 3's piece comes later in chunk order.
  t = plan(3 * K + 32 + reserve - 1);
  EXPECT_EQ(t.nvme_fraction, 1.0);
  EXPECT_EQ(disk(t), (std::vector<int>{1}));
  EXPECT_EQ(t.disk_chunk_bytes, K);
  // Both replicated chunks, then the pieces last first: 3, then 2.
  EXPECT_EQ(disk(plan(K + reserve + window)), (std::vector<int>{0, 1}));
  EXPECT_EQ(disk(plan(K / 2 + reserve + window)), (std::vector<int>{0, 1, 3}));
  t = plan(reserve + window);
  EXPECT_EQ(disk(t), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(t.disk_chunk_bytes, 3 * K);
  EXPECT_EQ(t.host_bytes(), reserve + window);
  EXPECT_THROW(plan(reserve + window - 1), InvalidArgument);
  // A piece homed on the device stays there: the others go, and nothing is asked of it.
  chunks[3].params_off = false;
  EXPECT_EQ(disk(plan(reserve + window)), (std::vector<int>{0, 1, 2}));
}

// Deferred updates (--grad-accum, --grad-clip, fp16): a RAM-homed chunk's gradient stays until
// step(), so the budget counts it and homing the chunk on disk frees both (the gradient spills);
// a sharded piece's gradient stays wherever the chunk is homed (kept_on_disk).
TEST(Placement, TiersCountGradientsKeptUntilTheStep) {
  constexpr int64_t K = 100000;
  std::vector<TierChunk> chunks;
  for (int c = 0; c < 4; ++c) {
    chunks.push_back({K, K, 8, true, true, false});
    chunks.back().kept_grad_bytes = K;
  }
  const int64_t reserve = 4 * K, window = 2 * 4096;
  auto plan = [&](int64_t cap) { return plan_tiers(chunks, cap, 0.0, 100, 1024); };
  TierPlan t = plan(8 * K + 32 + reserve);  // homes 4K, gradients 4K, states 32
  EXPECT_EQ(t.disk_chunk_bytes, 0);
  EXPECT_EQ(t.kept_grad_bytes, 4 * K);
  t = plan(8 * K + 32 + reserve - 1);  // the states go, then chunk 3 with its gradient
  EXPECT_EQ(t.on_disk, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(t.kept_grad_bytes, 3 * K);
  EXPECT_EQ(t.host_bytes(), 6 * K + window + reserve);
  for (TierChunk& c : chunks) c.kept_on_disk = true;
  t = plan(7 * K + window + reserve);
  EXPECT_EQ(t.on_disk, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(t.kept_grad_bytes, 4 * K);
}

// Note [Three tiers]: the reserve is two gradient buffers of different chunks and a RAM copy, 2 x
// the largest chunk + the next (with deferred updates two copies, 2 x (the largest + the next));
// and the window is whole slots sized to the largest chunk's states when those are below a
// slice's.
TEST(Placement, TierReserveAndWindowFollowTheChunks) {
  constexpr int64_t M = 1 << 20;
  auto tiers = [](std::vector<int64_t> bytes) {
    std::vector<TierChunk> out;
    for (int64_t b : bytes) out.push_back({b, b, 2 * b, true, true, false});
    return out;
  };
  const int64_t huge = int64_t{1} << 40;
  // An embedding chunk of 40 MiB beside blocks of 8: 88 MiB, not 120.
  EXPECT_EQ(plan_tiers(tiers({40 * M, 8 * M, 8 * M}), huge, 0.0, 32 * M, 1 << 19).reserve_bytes,
            88 * M);
  EXPECT_EQ(plan_tiers(tiers({8 * M, 8 * M, 8 * M}), huge, 0.0, 32 * M, 1 << 19).reserve_bytes,
            24 * M);
  std::vector<TierChunk> deferred = tiers({40 * M, 8 * M, 8 * M});
  for (TierChunk& c : deferred) c.kept_grad_bytes = c.bytes;
  EXPECT_EQ(plan_tiers(deferred, huge, 0.0, 32 * M, 1 << 19).reserve_bytes, 96 * M);
  // One chunk: its gradient buffer and its RAM copy.
  EXPECT_EQ(plan_tiers(tiers({8 * M}), huge, 0.0, 32 * M, 1 << 19).reserve_bytes, 16 * M);
  // The window as slots: 4 MiB ones (512 Ki-element slices) for chunks larger than a slice, two
  // at least, whatever --nvme-window says.
  const auto window = [&](std::vector<int64_t> bytes, int64_t asked) {
    return plan_tiers(tiers(bytes), huge, 1.0, asked, 1 << 19).host_state_bytes;
  };
  EXPECT_EQ(window({40 * M}, 1 * M), 8 * M);
  EXPECT_EQ(window({40 * M}, 32 * M), 32 * M);
  EXPECT_EQ(window({40 * M}, 33 * M), 32 * M);
  // Chunks of 64 KiB (16 Ki elements): slots of their m and v, 128 KiB, no more of them than
  // the states have slices (one here: two slots at least; 1 MiB asked made 8 before session 41).
  EXPECT_EQ(window({64 * 1024}, 1 * M), 256 * 1024);
  EXPECT_EQ(window(std::vector<int64_t>(8, 64 * 1024), 1 * M), 1 * M);  // eight: all 8 slots
  EXPECT_EQ(window({64 * 1024}, 100), 256 * 1024);
}

// Chunks homed and stepped on the device (static 0/0) send nothing through RAM: no transients,
// and no NVMe window for states there are none of (--host-capacity 1MiB was refused for 62 MiB).
TEST(Placement, ChunksKeptOnTheDeviceReserveNoHostMemory) {
  constexpr int64_t M = 1 << 20;
  std::vector<TierChunk> on_device;
  for (int64_t b : {40 * M, 8 * M}) on_device.push_back({b, b, 2 * b, false, false, false});
  const TierPlan t = plan_tiers(on_device, 1 * M, 0.0, 32 * M, 1 << 19);
  EXPECT_EQ(t.host_bytes(), 0);
  EXPECT_EQ(t.nvme_fraction, 0.0);
  // One chunk homed on the host: its transients only.
  on_device[1].params_off = true;
  EXPECT_EQ(plan_tiers(on_device, 1 << 30, 0.0, 32 * M, 1 << 19).reserve_bytes, 16 * M);
}

}  // namespace
}  // namespace mw::gemini
