// Typed exceptions for all of memwall, and the MW_CHECK macro that raises them.
//
// Invariant: library code never calls exit() or abort(). Every recoverable failure is one of the
// exception types below, whose message says what was expected, what was found, and what to do.
// Only the main() functions in apps/ catch these and turn them into exit codes.
#pragma once

#include <cerrno>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mw {

// Base class: anything memwall throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed something malformed: a bad option value, an out-of-range index.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Shapes, strides or dtypes of operands do not fit the op.
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A device allocator could not satisfy a request. Carries the numbers a user needs.
class OutOfMemory : public Error {
 public:
  OutOfMemory(const std::string& what, int64_t requested_bytes, int64_t free_bytes,
              int64_t capacity_bytes)
      : Error(what),
        requested_bytes(requested_bytes),
        free_bytes(free_bytes),
        capacity_bytes(capacity_bytes) {}
  int64_t requested_bytes, free_bytes, capacity_bytes;
};

// A file could not be read or written. Names the file, offset, length and errno.
class IoError : public Error {
 public:
  IoError(const std::string& what, std::string path, int64_t offset, int64_t length, int err)
      : Error(what), path(std::move(path)), offset(offset), length(length), err(err) {}
  // For failures that are not one transfer (opening, creating a directory): the message says all.
  explicit IoError(const std::string& what) : Error(what), offset(0), length(0), err(0) {}
  std::string path;
  int64_t offset, length;
  int err;  // errno value, 0 when not from a system call
};

// A file exists but its content is wrong: truncated, corrupt, or for another model.
class FormatError : public Error {
 public:
  using Error::Error;
};

// The autograd graph was used wrongly: a saved tensor modified in place, backward twice, ...
class AutogradError : public Error {
 public:
  using Error::Error;
};

// A device runtime (CUDA, cuBLAS, io_uring) reported failure.
class DeviceError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Formats any streamable arguments into one string.
template <typename... Args>
std::string str(Args&&... args) {
  return detail::concat(std::forward<Args>(args)...);
}

// strerror that is thread-safe and returns a std::string ("No space left on device (ENOSPC)").
std::string errno_text(int err);
// What an EFBIG means to the user, one text for every writer that names it.
inline constexpr const char* kFileTooLargeHint =
    "the file size limit (ulimit -f) or the file system's maximum file size was hit";

}  // namespace mw

// MW_CHECK(cond, msg...) throws mw::Error; MW_CHECK_T(Type, cond, msg...) throws mw::Type.
// The message pieces are only formatted when the check fails.
#define MW_CHECK_T(Type, cond, ...)                        \
  do {                                                     \
    if (!(cond)) [[unlikely]] {                            \
      throw ::mw::Type(::mw::detail::concat(__VA_ARGS__)); \
    }                                                      \
  } while (0)
#define MW_CHECK(cond, ...) MW_CHECK_T(Error, cond, __VA_ARGS__)
