// Chunk-size search and chunk packing (docs/gemini.md, docs/references.md "Gemini").
//
// All sizes are in elements, as in ColossalAI: its log line says "MB" but counts 2^20 elements, so
// GPT-2 small's 124,439,808 parameters print as "used number: 118.68".
//
// Note [Chunk-size search]: given the parameter sizes in packing order,
//  1. if they total less than min_chunk_numel, they form one chunk of exactly that total;
//  2. otherwise sizes above mean + 3 std (of all sizes) are outliers (GPT-2's 38.6M-element token
//     embedding) and each gets a chunk of its own;
//  3. every candidate size from ceil(max(min_chunk_numel, largest remaining) / interval) * interval
//     up to search_range_numel more, in steps of interval (the hidden size, else 1024), is tried
//     by simulating first-fit packing in order; a chunk's unused tail is waste (the last one's
//     too);
//  4. the least waste wins (the first on ties).
// Packing (pack_chunks) is then first-fit in order: a tensor opens a new chunk when it does not fit
// in the current one. Outliers are chunks of their own at their place in the order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mw::gemini {

struct ChunkSearchOptions {
  int64_t min_chunk_numel = int64_t{32} << 20;     // ColossalAI min_chunk_size_m = 32
  int64_t search_range_numel = int64_t{32} << 20;  // search_range_m = 32
  int64_t interval_numel = 1024;                   // the hidden size when known
  bool filter_outliers = true;                     // step 2
};

struct ChunkSearchResult {
  int64_t chunk_numel = 0;    // the chosen capacity
  int64_t total_numel = 0;    // all parameters ("used number")
  int64_t wasted_numel = 0;   // unused tails of the non-outlier chunks ("wasted number")
  bool single_chunk = false;  // step 1: everything in one chunk
  std::vector<bool> outlier;  // per size: gets a chunk of its own
  double seconds = 0;         // time the search took
  // ColossalAI's line: "searching chunk configuration is completed in 0.27 s. used number: 118.68
  // MB, wasted number: 0.75 MB, total wasted percentage is 0.63%" (units of 2^20 elements).
  std::string log_line() const;
};

// Waste of first-fit packing `sizes` (in order) into chunks of chunk_numel (ColossalAI's
// _get_unused_byte): the sum of every chunk's unused tail, the last chunk's included. A tensor
// larger than chunk_numel (a --chunk-size below it) has a chunk of its own size, as in pack_chunks.
int64_t packing_waste(const std::vector<int64_t>& sizes, int64_t chunk_numel);

ChunkSearchResult search_chunk_size(const std::vector<int64_t>& sizes,
                                    const ChunkSearchOptions& options = {});

// The chunk of each tensor (0, 1, ...), first-fit in order with capacity chunk_numel; outliers (or
// any tensor larger than the capacity) get a chunk of their own.
std::vector<int> pack_chunks(const std::vector<int64_t>& sizes, int64_t chunk_numel,
                             const std::vector<bool>& outlier);

}  // namespace mw::gemini
