// Regular-file opening and bounded reads; see regular_file.h.
#include "mcpp/core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "mcpp/core/error.h"

namespace mcpp {

FileDescriptor::~FileDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

uint64_t FileDescriptor::size() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail("cannot stat descriptor {}: {}", fd_, std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

std::string file_kind_name(unsigned mode) {
  if (S_ISDIR(mode)) return "directory";
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISLNK(mode)) return "symbolic link";
  return "special file";
}

FileDescriptor open_regular_file(const std::string& path, const std::string& what) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail("cannot open {} {}: {}", what, path, std::strerror(errno));
  FileDescriptor f(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail("cannot stat {} {}: {}", what, path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("{} {} is a {}, not a regular file", what, path, file_kind_name(st.st_mode));
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return f;
}

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  const FileDescriptor f = open_regular_file(path, what);
  const uint64_t size = f.size();
  if (size > max_bytes)
    fail("{} {} has {} bytes, more than the {} bytes any such file may have (damaged?)", what, path, size, max_bytes);
  std::string out(size, '\0');
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(f.get(), out.data() + done, size - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot read {} {}: {}", what, path, std::strerror(errno));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<uint64_t>(n);
  }
  out.resize(done);
  return out;
}

}  // namespace mcpp
