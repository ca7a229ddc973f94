// Checked POSIX file I/O shared by the data formats: a read-only file that preads exactly, an
// atomic file writer, and a fault-injection point for every write.
//
// Invariants:
// - Inputs must be regular files: a FIFO, directory or device is refused at once (opened with
//   O_NONBLOCK and checked with fstat before anything reads or waits on it), naming the path.
// - Every read and write loops over short transfers and retries EINTR; offsets are 64-bit.
// - A system-call failure is an IoError naming the path, offset, length and errno text, plus the
//   caller's hint (what the user should do). A file that ends before the bytes it promised is a
//   FormatError ("truncated"), because the file is wrong rather than the system.
// - AtomicFileWriter / write_file_atomically() write ".NAME.tmp-PID" beside PATH, fsync it, rename
// it
//   over PATH and fsync the directory: a failure at any point (an error, SIGINT/SIGTERM per
//   Note [Stop signals]) leaves PATH as it was (absent or the old file), never half written, and
//   removes the temporary file; after kill -9 the temporary file is recognisable by its name and
//   the next save to PATH removes it (atomic_save.h, remove_stale_temporaries).
// - Every write of file data goes through write_exact(), the one fault-injection point: a test
//   (or the environment variable MW_WRITE_FAULT="enospc@N", for child processes) makes the Nth
//   write fail with ENOSPC or EIO, store only half its bytes, or stall half-way, without root or a
//   full disk (set_write_fault_for_testing below).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/interrupt.h"

namespace mw::data {

// Opens `path` read-only; refuses anything that is not a regular file (IoError naming what it is).
// Returns the descriptor (O_CLOEXEC, blocking) and sets *size_bytes. `what`/`hint` as below.
int open_regular_file(const std::string& path, const std::string& what, const std::string& hint,
                      int64_t* size_bytes);
// Note [Byte-order mark]: Windows editors (Notepad before 2019, PowerShell 5's Out-File -Encoding
// utf8) start UTF-8 text with EF BB BF. It marks the encoding and is not text: a config.json or
// vocab.json saved so was refused ("invalid JSON: expected a value, found byte 0xef"; RFC 8259 lets
// a parser ignore it), a merges.txt took "\xef\xbb\xbf#version: 0.2" for a merge, a .jsonl corpus
// failed on its first line, and a text document began with the mark's bytes as tokens. Readers of
// text drop it where a file starts: read_text_file and CorpusReader.
inline constexpr std::string_view kUtf8ByteOrderMark = "\xEF\xBB\xBF";

// The whole of a small regular text file (config.json), without a leading UTF-8 byte-order mark
// (Note [Byte-order mark]); FormatError past max_bytes.
std::string read_text_file(const std::string& path, const std::string& what,
                           const std::string& hint, int64_t max_bytes = int64_t{64} << 20);

class ReadOnlyFile {
 public:
  // `what` names the kind of file in messages ("safetensors file"); `hint` is appended to an
  // open failure ("pass --data a path to an llm.c .bin shard").
  ReadOnlyFile(const std::string& path, const std::string& what, const std::string& hint);
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size_bytes() const { return size_bytes_; }  // at open time
  // Reads exactly nbytes at offset into dst; thread-safe (pread on a shared descriptor).
  void read_exact(void* dst, int64_t nbytes, int64_t offset) const;

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
  int64_t size_bytes_ = 0;
};

// One contiguous piece of the file to be written; pieces are written back to back.
struct WritePiece {
  const void* data;
  int64_t nbytes;
};

// Writes nbytes at offset of fd exactly (looping over short writes, retrying EINTR, polling the
// stop flag between transfers); IoError naming `path` and the errno, with `hint`, on failure.
void write_exact(int fd, const std::string& path, const void* data, int64_t nbytes, int64_t offset,
                 const std::string& hint);

// Streams a file into its temporary sibling; commit() fsyncs and renames it into place. Destroyed
// without commit() (an exception, a signal), it removes the temporary file and PATH is untouched.
// `create_parents`: create PATH's missing directories first.
class AtomicFileWriter {
 public:
  AtomicFileWriter(std::string path, std::string hint, bool create_parents = false);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  void append(const void* data, int64_t nbytes);
  void commit();
  int64_t size_bytes() const { return offset_; }
  const std::string& temp_path() const { return tmp_; }

 private:
  std::string path_, tmp_, hint_;
  int fd_ = -1;
  int64_t offset_ = 0;
  TemporaryPath registered_;  // removed by a second stop signal (Note [Stop signals])
};

// A file's bytes produced in order: the producer calls the sink as often as it likes, each piece
// valid only during that call (a model streamed out of its tiers one tensor at a time).
using ByteSink = std::function<void(const void* data, int64_t nbytes)>;
using ByteProducer = std::function<void(const ByteSink& emit)>;

// See the invariants above. `hint` is appended to IoError messages ("pass --save a writable dir").
void write_file_atomically(const std::string& path, const std::vector<WritePiece>& pieces,
                           const std::string& hint);
// Writes a whole file in place (create/truncate, write, fsync): for files inside a staged
// directory (atomic_save.h), which is what makes them appear atomically.
void write_file(const std::string& path, const std::vector<WritePiece>& pieces,
                const std::string& hint);
void write_file_atomically(const std::string& path, const ByteProducer& produce,
                           const std::string& hint);
void write_file(const std::string& path, const ByteProducer& produce, const std::string& hint);

// The temporary sibling of a file or directory to be replaced: "DIR/.NAME.tmp-PID".
std::string temporary_sibling(const std::string& path, const char* kind = "tmp");
std::string parent_directory(const std::string& path);
// fsync of a directory (makes renames and new names in it durable). Errors are ignored when the
// directory cannot be opened (unusual permissions): the data itself is already on disk.
void fsync_directory(const std::string& dir);

// Fault injection (see the invariants). `nth_write` counts write_exact() calls from now, from 1.
// kNoSpace / kIoError fail that write and every later one (a full or broken disk stays so);
// kShortWrite stores half of that write in one transfer (the loop must finish it); kStall stores
// half, then waits for a stop signal (Note [Stop signals]) or kill -9: a save caught mid-way.
enum class WriteFault { kNone, kNoSpace, kIoError, kShortWrite, kStall };
void set_write_fault_for_testing(WriteFault fault, int64_t nth_write);

}  // namespace mw::data
