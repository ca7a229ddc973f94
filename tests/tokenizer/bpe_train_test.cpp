// BPE training (GPT-2's vocabulary layout, determinism, a hand-checked merge order) and the
// streaming corpus reader (chunks cut at piece boundaries give the ids of the whole text).
#include "data/bpe_train.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "../data/temp_dir.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/corpus.h"

namespace mw::data {
namespace {

const std::string kFixture = std::string(MW_SOURCE_DIR) + "/tests/fixtures/bpe/";

TEST(BpeTrain, LearnsTheMostFrequentPairsInOrder) {
  BpeTrainer trainer;
  // Pieces: "aaab" x1, "Ġaaab" x2, "Ġaab" x2 (a space joins the word after it).
  trainer.add_text("aaab aab aaab aab aaab");
  const BpeModel m = trainer.train(256 + 3 + 1);
  // Pair counts: (a,a) 1*2 + 2*2 + 2*1 = 8, (a,b) 5, (Ġ,a) 4: "a a" first. Then in [aa a b] x1,
  // [Ġ aa a b] x2, [Ġ aa b] x2: (Ġ,aa) 4, (aa,a) 3, (a,b) 3, (aa,b) 2: "Ġ aa". Then in [aa a b] x1,
  // [Ġaa a b] x2, [Ġaa b] x2: (a,b) 3, (Ġaa,a) 2, (Ġaa,b) 2, (aa,a) 1: "a b".
  ASSERT_EQ(m.merges.size(), 3u);
  EXPECT_EQ(m.merges[0], std::make_pair(std::string("a"), std::string("a")));
  EXPECT_EQ(m.merges[1], std::make_pair(std::string("\xc4\xa0"), std::string("aa")));
  EXPECT_EQ(m.merges[2], std::make_pair(std::string("a"), std::string("b")));
  // GPT-2's layout: "!" is id 0, the byte tokens come first, <|endoftext|> last.
  ASSERT_EQ(m.vocab.size(), 260u);
  EXPECT_EQ(m.vocab[0], std::make_pair(std::string("!"), 0));
  EXPECT_EQ(m.vocab[256], std::make_pair(std::string("aa"), 256));
  EXPECT_EQ(m.vocab[259], std::make_pair(std::string(kEndOfText), 259));
}

TEST(BpeTrain, IsDeterministicAndRoundTrips) {
  const std::string text = testing::read_bytes(kFixture + "train.txt");
  BpeTrainer a, b;
  a.add_text(text);
  b.add_text(text);
  const BpeModel ma = a.train(500), mb = b.train(500);
  EXPECT_EQ(ma.merges, mb.merges);
  EXPECT_EQ(ma.vocab, mb.vocab);
  BpeTokenizer tok(ma, "trained");
  EXPECT_EQ(tok.vocab_size(), 500);
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_THROW(a.train(256), InvalidArgument);
  EXPECT_THROW(a.train(65537), InvalidArgument);
}

TEST(BpeTrain, StopsWhenNoPairRepeats) {
  BpeTrainer trainer;
  trainer.add_text("abcdef");  // every pair occurs once
  EXPECT_TRUE(trainer.train(1000).merges.empty());
}

// Note [Chunk boundaries]: a document of several MiB, read in chunks, encodes to the ids of the
// whole text in one call.
TEST(Corpus, ChunkedDocumentsEncodeLikeTheWholeText) {
  BpeTokenizer tok(load_vocab_and_merges(kFixture + "vocab.json", kFixture + "merges.txt"),
                   "fixture");
  const std::string base = testing::read_bytes(kFixture + "train.txt");
  std::mt19937 rng(3);
  std::string text;
  while (static_cast<int64_t>(text.size()) < 3 * kChunkBytes) {
    // Random slices of the fixture, so whitespace runs and multi-byte characters meet the cuts.
    const size_t start = rng() % base.size(), length = rng() % 200;
    text += base.substr(start, length);
  }
  testing::TempDir tmp;
  std::ofstream(tmp.file("big.txt"), std::ios::binary) << text;
  CorpusReader reader({tmp.file("big.txt")}, "text");
  std::vector<int32_t> chunked;
  int64_t chunks = 0;
  for (CorpusChunk c; reader.next(c); ++chunks) {
    EXPECT_EQ(c.starts_document, chunks == 0);
    tok.encode(c.text, chunked);
  }
  EXPECT_GE(chunks, 3);
  EXPECT_EQ(reader.num_documents(), 1);
  EXPECT_EQ(reader.bytes_read(), static_cast<int64_t>(text.size()));
  EXPECT_TRUE(chunked == tok.encode(text)) << "chunked encoding differs from the whole text's";
}

}  // namespace
}  // namespace mw::data
