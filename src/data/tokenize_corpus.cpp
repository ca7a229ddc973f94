// A corpus tokenized into llm.c token shards (data/tokenize_corpus.h).
#include "data/tokenize_corpus.h"

#include <unistd.h>

#include <filesystem>

#include "core/error.h"
#include "core/parallel.h"

namespace mw::data {

void ShardSplits::add(bool starts_document, const std::vector<int32_t>& ids, bool starts_val) {
  if (starts_val) {
    current = &val;
    current->add(&eot, 1);
  } else if (starts_document && val_from_byte < 0) {
    // To val when that brings val's share nearer val_fraction than train would: |v + d - f(t + d)|
    // < |v - f(t + d)|, with d the document's first chunk (all of it but for documents of
    // megabytes). Until session 39 a document went to val whenever val held less than its share
    // before it, so the second document was val however long: 98.9% val at --val-fraction 0.05.
    const double d = static_cast<double>(ids.size()) + 1;  // with its <|endoftext|>
    const double goal = val_fraction * (static_cast<double>(num_tokens()) + d);
    current = static_cast<double>(val.num_tokens()) + d / 2 < goal ? &val : &train;
    current->add(&eot, 1);
  } else if (starts_document) {
    current->add(&eot, 1);  // a marked document of the one text file, in the split it is in
  }
  current->add(ids.data(), static_cast<int64_t>(ids.size()));
}

bool is_shard_file_name(const std::string& name) {
  return (name.rfind("train_", 0) == 0 || name.rfind("val_", 0) == 0) &&
         std::filesystem::path(name).extension() == ".bin";
}

void prepare_shard_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MW_CHECK_T(IoError, !ec && std::filesystem::is_directory(dir), "--out '", dir,
             "' cannot be created as a directory (", ec.message(),
             "); pass --out a writable directory");
  MW_CHECK_T(IoError, ::access(dir.c_str(), W_OK) == 0, "--out '", dir,
             "' is not writable; pass --out a writable directory");
  // Shards of an earlier run would mix with this run's (train_000001.bin of a larger corpus).
  const bool unfinished = std::filesystem::exists(dir + "/" + kUnfinishedMarker, ec);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    MW_CHECK_T(IoError, !is_shard_file_name(name), "--out '", dir, "' already holds token shards (",
               name, unfinished ? ", of a gpt2_tokenize run killed half-way" : "",
               "); remove them or pass --out another directory");
  }
}

namespace {

struct Pending {
  std::string text;
  bool starts_document;
  std::vector<int32_t> ids;
  bool starts_val = false;  // Note [One document]
};

// Appends the chunk to the batch, cut in two where the one document's val part starts (Note [One
// document]); `offset` is the chunk's first byte in the corpus.
void add_chunk(std::vector<Pending>& batch, std::string_view text, bool starts_document,
               int64_t offset, ShardSplits& splits, bool& cut_pending) {
  const int64_t end = offset + static_cast<int64_t>(text.size());
  size_t cut = std::string_view::npos;
  if (splits.val_at_document) {  // val starts with the first document at or after the byte
    if (starts_document && splits.val_cut_byte < 0 && offset >= splits.val_from_byte) cut = 0;
  } else if (cut_pending) {
    cut = 0;  // no boundary was left in the chunk before: this one starts val
  } else if (splits.val_from_byte >= 0 && splits.val_cut_byte < 0 && end > splits.val_from_byte) {
    cut = first_safe_cut(text,
                         static_cast<size_t>(std::max<int64_t>(0, splits.val_from_byte - offset)));
    cut_pending = cut == std::string_view::npos;
  }
  if (cut == std::string_view::npos) {
    batch.push_back({std::string(text), starts_document, {}});
    return;
  }
  cut_pending = false;
  splits.val_cut_byte = offset + static_cast<int64_t>(cut);
  if (cut > 0) batch.push_back({std::string(text.substr(0, cut)), starts_document, {}});
  batch.push_back({std::string(text.substr(cut)), cut == 0 && starts_document, {}, true});
}

// Slice s of the batch holds the chunks whose first byte falls in [s, s + 1) * bytes / workers;
// encodes the slices in parallel.
void encode_batch(std::vector<Pending>& batch, int64_t batch_bytes,
                  std::vector<std::unique_ptr<BpeTokenizer>>& workers) {
  const int64_t n_workers = static_cast<int64_t>(workers.size());
  std::vector<size_t> first(n_workers + 1, batch.size());
  int64_t offset = 0;
  for (size_t i = 0, s = 0; i < batch.size(); ++i) {
    while (s < static_cast<size_t>(n_workers) && offset >= int64_t(s) * batch_bytes / n_workers)
      first[s++] = i;
    offset += static_cast<int64_t>(batch[i].text.size());
  }
  parallel_for(n_workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s)
      for (size_t i = first[s]; i < first[s + 1]; ++i)
        workers[s]->encode(batch[i].text, batch[i].ids);
  });
}

}  // namespace

void tokenize_corpus(CorpusReader& reader, std::vector<std::unique_ptr<BpeTokenizer>>& workers,
                     ShardSplits& splits, const std::function<void(int64_t tokens)>& progress) {
  const int64_t n_workers = static_cast<int64_t>(workers.size());
  std::vector<Pending> batch;
  int64_t batch_bytes = 0;
  bool more = true, cut_pending = false;
  while (more) {
    CorpusChunk chunk;
    more = reader.next(chunk);
    if (more) {
      add_chunk(batch, chunk.text, chunk.starts_document, chunk.offset, splits, cut_pending);
      batch_bytes += static_cast<int64_t>(chunk.text.size());
      if (batch_bytes < n_workers * kChunkBytes) continue;
    }
    encode_batch(batch, batch_bytes, workers);
    for (const Pending& c : batch) splits.add(c.starts_document, c.ids, c.starts_val);
    progress(splits.num_tokens());
    batch.clear();
    batch_bytes = 0;
  }
}

namespace {
constexpr size_t kListedShards = 3;
}  // namespace

std::string split_summary(const char* name, const TokenShardWriter& w) {
  const std::vector<std::string>& paths = w.paths();
  std::string out = str(name, ": ", w.num_tokens(), " tokens in ", paths.size(), " shard(s)");
  const auto listed = [&](size_t i) {
    return str(" ", paths[i], " (", static_cast<int64_t>(std::filesystem::file_size(paths[i])),
               " bytes)");
  };
  // Many small shards (--shard-tokens 1 gives one per token): the first two and the last.
  const size_t n = paths.size();
  const size_t head = n > kListedShards ? kListedShards - 1 : n;
  for (size_t i = 0; i < head; ++i) out += listed(i);
  if (head < n) out += str(" ... (", n - kListedShards, " more)") + listed(n - 1);
  return out + "\n";
}

}  // namespace mw::data
