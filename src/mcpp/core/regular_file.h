// Opening files a user or a damaged disk hands us: only regular files, never a FIFO, device, socket or
// directory (a FIFO would block a reader forever; /dev/zero would never end).
//
// Contract:
//   open_regular_file(path, what)  open(O_RDONLY | O_NONBLOCK | O_CLOEXEC) — O_NONBLOCK so opening a FIFO
//                                  returns at once — then fstat; anything but a regular file is closed and
//                                  refused with an mcpp::Error "<what> <path> is a FIFO, not a regular file"
//                                  (directory / character device / ...). O_NONBLOCK is then cleared. Returns
//                                  an owned descriptor.
//   read_regular_file(path, what, max_bytes)   the whole file as bytes; a file over max_bytes is refused
//                                  naming both sizes (a multi-GB "manifest" is damage, not data).
// `what` names the file's role in errors ("manifest", "vocab file", "--tokens file").
#pragma once
#include <cstdint>
#include <string>

namespace mcpp {

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd = -1) : fd_(fd) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileDescriptor& operator=(FileDescriptor&& o) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  int get() const { return fd_; }
  uint64_t size() const;  // fstat's st_size

 private:
  int fd_;
};

FileDescriptor open_regular_file(const std::string& path, const std::string& what);
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes);
// A short name for the kind of a non-regular file ("FIFO", "directory", "character device", ...).
std::string file_kind_name(unsigned mode);

}  // namespace mcpp
