// Token streams over several shards: see Note [Data position] (token_stream.h).
#include "train/token_stream.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "core/random.h"
#include "data/token_shard.h"

namespace mw::train {

namespace fs = std::filesystem;

std::vector<std::string> resolve_shards(const std::string& spec, const std::string& split,
                                        const std::string& option) {
  std::vector<std::string> paths;
  std::error_code ec;
  if (spec.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    if (::glob(spec.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) paths.emplace_back(g.gl_pathv[i]);
    globfree(&g);
    MW_CHECK_T(InvalidArgument, !paths.empty(), option, " '", spec,
               "': the pattern matches no file; check the path (gpt2_tokenize writes "
               "DIR/train_000000.bin, DIR/val_000000.bin, ...)");
  } else if (fs::is_directory(spec, ec)) {
    MW_CHECK_T(IoError, !fs::exists(fs::path(spec) / data::kUnfinishedMarker, ec), option, " '",
               spec, "' holds the shards of a gpt2_tokenize run that has not finished: it is ",
               "still writing, or was killed half-way (Note [Unfinished corpus]); wait for it, or ",
               "remove the directory's shards and run gpt2_tokenize again");
    for (const auto& e : fs::directory_iterator(spec, ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(split + "_", 0) == 0 && name.size() > 4 &&
          name.compare(name.size() - 4, 4, ".bin") == 0)
        paths.push_back(e.path().string());
    }
    MW_CHECK_T(InvalidArgument, !paths.empty(), option, " '", spec, "' is a directory without ",
               split, "_*.bin shards: expected a regular file (an llm.c shard), a directory ",
               "written by gpt2_tokenize, or a glob such as 'DIR/", split, "_*.bin'");
  } else {
    paths.push_back(spec);  // a file: TokenShard names it if it is missing or not a shard
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::optional<int64_t> stamped_vocab_size(const std::string& spec) {
  if (spec.empty()) return std::nullopt;
  try {
    const data::TokenShard first(resolve_shards(spec, "train", "--data").front());
    if (first.tokenizer()) return first.tokenizer()->vocab_size;
  } catch (const Error&) {  // open_inputs says what is wrong with it
  }
  return std::nullopt;
}

TokenStream::TokenStream(const std::vector<std::string>& paths, bool shuffle, uint64_t shuffle_seed,
                         const std::string& option)
    : shuffle_(shuffle), seed_(shuffle_seed) {
  MW_CHECK_T(InvalidArgument, !paths.empty(), "a token stream needs at least one shard");
  const std::string hint = str("pass ", option, " a path to an llm.c .bin shard");
  for (const auto& p : paths) {
    shards_.emplace_back(p, hint);
    shard_start_.push_back(total_tokens_);
    total_tokens_ += shards_.back().num_tokens();
  }
}

void TokenStream::read_wrapped(int64_t first, int64_t count, int32_t* out) const {
  int64_t pos = first % total_tokens_;
  for (int64_t done = 0; done < count;) {
    // The shard holding `pos`: the last one starting at or before it.
    const auto it = std::upper_bound(shard_start_.begin(), shard_start_.end(), pos) - 1;
    const size_t s = static_cast<size_t>(it - shard_start_.begin());
    const int64_t in_shard = pos - shard_start_[s];
    const int64_t n = std::min(count - done, shards_[s].num_tokens() - in_shard);
    shards_[s].read(in_shard, n, out + done);
    done += n;
    pos = (pos + n) % total_tokens_;
  }
}

const std::vector<int64_t>& TokenStream::permutation(int64_t epoch, int64_t windows) {
  if (epoch == perm_epoch_) return perm_;
  perm_.resize(static_cast<size_t>(windows));
  for (int64_t w = 0; w < windows; ++w) perm_[w] = w;
  const RngState rng{seed_ ^ 0x5eed5eed5eed5eedull, static_cast<uint64_t>(epoch) << 40};
  for (int64_t w = windows - 1; w > 0; --w) {
    const int64_t j = static_cast<int64_t>(random_bits(rng, static_cast<uint64_t>(w)) %
                                           static_cast<uint64_t>(w + 1));
    std::swap(perm_[w], perm_[j]);
  }
  perm_epoch_ = epoch;
  return perm_;
}

void TokenStream::batch(int64_t index, int64_t B, int64_t T, int32_t* out) {
  MW_CHECK_T(InvalidArgument, index >= 0 && B >= 1 && T >= 1, "token batch needs index >= 0, ",
             "B >= 1 and T >= 1; got index ", index, ", B ", B, ", T ", T);
  if (!shuffle_) {
    // Modulo first, in 128 bits, so that no index can overflow (as TokenShard::batch).
    const unsigned __int128 first = static_cast<unsigned __int128>(index) *
                                    static_cast<unsigned __int128>(B) *
                                    static_cast<unsigned __int128>(T);
    read_wrapped(static_cast<int64_t>(first % static_cast<unsigned __int128>(total_tokens_)), B * T,
                 out);
    return;
  }
  const int64_t windows = total_tokens_ / T;
  MW_CHECK_T(InvalidArgument, windows >= 1, "shuffled data needs at least one sequence of ", T,
             " tokens; the shards hold ", total_tokens_, ": lower --seq or add data");
  for (int64_t r = 0; r < B; ++r) {
    const int64_t s = index * B + r;
    const int64_t w = permutation(s / windows, windows)[static_cast<size_t>(s % windows)];
    read_wrapped(w * T, T, out + r * T);
  }
}

int64_t TokenStream::epoch_of(int64_t index, int64_t B, int64_t T) const {
  if (shuffle_) return ((index + 1) * B - 1) / std::max<int64_t>(1, total_tokens_ / T);
  return ((index + 1) * B * T - 1) / total_tokens_;
}

void TokenStream::check_vocab(int64_t vocab_size) const {
  for (const auto& s : shards_) s.check_vocab(vocab_size);
}

void TokenStream::check_length(int64_t seq, const std::string& option) const {
  // --seq is 2 at least: below that, adding data is the only remedy.
  MW_CHECK_T(InvalidArgument, total_tokens_ >= seq, option, " holds ", total_tokens_, " tokens in ",
             num_shards(), " shard(s), fewer than one sequence of --seq ", seq,
             ": every row would repeat that text; ",
             total_tokens_ >= 2 ? str("add data or lower --seq to at most ", total_tokens_)
                                : str("add data (", seq, " tokens at least)"));
}

}  // namespace mw::train
