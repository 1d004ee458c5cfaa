// Durable file operations shared by the checkpoint commit protocols; see durable_file.h.
#include "mcpp/dist_checkpointing/durable_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/fault_injection.h"

namespace mcpp::dist_checkpointing {

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} to fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail("cannot fsync {}: {}", path, std::strerror(err));
}

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

void write_file_atomic(const std::string& path, const std::string& text, const char* fault_point_name) {
  const std::string tmp = path + ".tmp-" + random_token();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create {}", tmp);
    out << text;
    out.flush();
    if (!out) fail("cannot write {}", tmp);
  }
  fsync_path(tmp, /*directory=*/false);
  if (fault_point_name) fault_point(fault_point_name);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  fsync_path(std::filesystem::path(path).parent_path().string(), /*directory=*/true);
}

}  // namespace mcpp::dist_checkpointing
