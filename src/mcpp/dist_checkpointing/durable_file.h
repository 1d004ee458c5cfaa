// Durable file operations of the checkpoint commit protocols (checkpoint.cpp's single-writer save and
// sharded_save.cpp's multi-rank save share them):
//   fsync_path(path, directory)      open + fsync a file or a directory (mcpp::Error naming the path)
//   write_file_atomic(path, text)    write path.tmp-<random>, fsync it, (fault point), rename over path,
//                                    fsync the parent directory: readers see the old or the new file
//   random_token()                   16 hex digits for staging names (iter_N.tmp-<token>)
#pragma once
#include <string>

namespace mcpp::dist_checkpointing {

void fsync_path(const std::string& path, bool directory);
// `fault_point_name`: when non-null, the kill/fail point (fault_injection.h) between the fsynced temp file
// and the rename.
void write_file_atomic(const std::string& path, const std::string& text, const char* fault_point_name = nullptr);
std::string random_token();

}  // namespace mcpp::dist_checkpointing
