// Single-process checkpoint save (atomic commit) and reader; see checkpoint.h.
#include "mcpp/dist_checkpointing/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include "mcpp/core/error.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
namespace {

std::string random_suffix() {
  std::random_device rd;
  return fmt::format("{:08x}{:04x}", rd(), static_cast<unsigned>(::getpid()) & 0xffffu);
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail("cannot open {} to fsync: {}", path, std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) fail("cannot fsync {}: {}", path, std::strerror(err));
}

// Writes `text` to `path` through `path`.tmp-<random>: write, fsync, rename, fsync the directory.
void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp-" + random_suffix();
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot create {}", tmp);
    out << text;
    out.flush();
    if (!out) fail("cannot write {}", tmp);
  }
  fsync_path(tmp, /*directory=*/false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot rename {} to {}: {}", tmp, path, std::strerror(err));
  }
  fsync_path(fs::path(path).parent_path().string(), /*directory=*/true);
}

std::string file_for_key(const std::string& key) {
  return key.rfind("optimizer.", 0) == 0 ? "optimizer.safetensors" : "model.safetensors";
}

// Writes the data files and the manifest into the staging directory `dir`.
void write_contents(const std::string& dir, const CheckpointContents& c) {
  std::vector<std::string> files;  // in first-use order
  std::map<std::string, std::vector<size_t>> by_file;
  std::set<std::string> keys;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const auto& nt = c.tensors[i];
    if (nt.key.empty()) fail("save_checkpoint: tensor {} has an empty key", i);
    if (!keys.insert(nt.key).second) fail("save_checkpoint: duplicate tensor key '{}'", nt.key);
    if (!nt.tensor.defined()) fail("save_checkpoint: tensor '{}' is undefined", nt.key);
    std::string f = file_for_key(nt.key);
    if (!by_file.count(f)) files.push_back(f);
    by_file[f].push_back(i);
  }
  Manifest m;
  m.iteration = c.iteration;
  m.meta = c.meta;
  std::map<std::string, ManifestEntry> entries;
  const std::map<std::string, std::string> st_meta = {
      {"format", "pt"}, {"mcpp_iteration", std::to_string(c.iteration)}};
  for (const auto& f : files) {
    std::vector<SafetensorsItem> items;
    for (size_t i : by_file[f]) items.push_back({c.tensors[i].key, c.tensors[i].tensor});
    auto written = write_safetensors(dir + "/" + f, items, st_meta, /*fsync_file=*/true);
    for (size_t k = 0; k < written.size(); ++k) {
      const Tensor& t = items[k].tensor;
      ManifestEntry e;
      e.key = items[k].name;
      e.dtype = t.dtype();
      e.global_shape = t.shape();
      e.global_offset = Shape(t.shape().size(), 0);
      e.local_shape = t.shape();
      e.file = f;
      e.byte_offset = written[k].byte_offset;
      e.byte_length = written[k].byte_length;
      e.xxh3 = written[k].xxh3;
      entries[e.key] = e;
    }
  }
  for (const auto& nt : c.tensors) m.tensors.push_back(entries.at(nt.key));  // caller's order
  write_file_atomic(dir + "/" + kManifestFile, manifest_to_json(m).dump(1) + "\n");
}

}  // namespace

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string save_checkpoint(const std::string& save_dir, const CheckpointContents& c) {
  if (c.iteration < 0) fail("save_checkpoint: negative iteration {}", c.iteration);
  if (!c.meta.is_object()) fail("save_checkpoint: meta must be a JSON object");
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  if (ec) fail("cannot create save directory {}: {}", save_dir, ec.message());
  std::string final_dir = (fs::path(save_dir) / iteration_dir_name(c.iteration)).string();
  if (fs::exists(final_dir, ec))
    fail("refusing to overwrite existing checkpoint {} (remove it or save another iteration)", final_dir);
  std::string tmp_dir = final_dir + ".tmp-" + random_suffix();
  if (!fs::create_directory(tmp_dir, ec) || ec)
    fail("cannot create staging directory {}: {}", tmp_dir, ec ? ec.message() : "exists");
  try {
    write_contents(tmp_dir, c);
    fsync_path(tmp_dir, /*directory=*/true);
    if (fs::exists(final_dir, ec)) fail("refusing to overwrite existing checkpoint {}", final_dir);
    if (::rename(tmp_dir.c_str(), final_dir.c_str()) != 0)
      fail("cannot rename {} to {}: {}", tmp_dir, final_dir, std::strerror(errno));
  } catch (...) {
    fs::remove_all(tmp_dir, ec);
    throw;
  }
  fsync_path(save_dir, /*directory=*/true);
  write_file_atomic((fs::path(save_dir) / kTrackerFile).string(), std::to_string(c.iteration) + "\n");
  return final_dir;
}

int64_t latest_iteration(const std::string& load_dir) {
  std::string path = (fs::path(load_dir) / kTrackerFile).string();
  std::ifstream in(path);
  if (!in) return -1;
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && std::isspace(static_cast<unsigned char>(s[start]))) ++start;
  s = s.substr(start);
  if (s.empty() || s.size() > 18 || !std::all_of(s.begin(), s.end(), ::isdigit))
    fail("{}: expected an iteration number, got '{}'", path, s);
  return std::stoll(s);
}

std::vector<int64_t> list_iterations(const std::string& save_dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::exists(save_dir, ec)) return out;  // a fresh --save/--load directory holds no checkpoints
  static const std::regex kIterDir("iter_([0-9]{7,})");
  for (const auto& de : fs::directory_iterator(save_dir, ec)) {
    std::smatch m;
    std::string name = de.path().filename().string();
    if (!std::regex_match(name, m, kIterDir)) continue;
    if (!fs::exists(de.path() / kManifestFile)) continue;
    out.push_back(std::stoll(m[1].str()));
  }
  if (ec) fail("cannot list {}: {}", save_dir, ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

std::string resolve_checkpoint_dir(const std::string& path, int64_t iteration) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) fail("checkpoint path {} is not a directory", path);
  if (fs::exists(fs::path(path) / kManifestFile)) return path;
  static const std::regex kIterDir("iter_[0-9]{7,}(\\.tmp-.*)?");
  if (std::regex_match(fs::path(path).filename().string(), kIterDir))
    fail("missing manifest {} (an uncommitted or damaged checkpoint)", (fs::path(path) / kManifestFile).string());
  if (iteration < 0) {
    iteration = latest_iteration(path);
    if (iteration < 0)
      fail("no checkpoint in {}: neither {} nor {} found", path, kManifestFile, kTrackerFile);
  }
  return (fs::path(path) / iteration_dir_name(iteration)).string();
}

CheckpointReader::CheckpointReader(const std::string& path, int64_t iteration)
    : dir_(resolve_checkpoint_dir(path, iteration)),
      manifest_(read_manifest((fs::path(dir_) / kManifestFile).string())) {}

const ManifestEntry& CheckpointReader::entry(const std::string& key) const {
  const ManifestEntry* e = manifest_.find(key);
  if (!e) fail("checkpoint {} has no tensor '{}'", dir_, key);
  return *e;
}

const SafetensorsHeader& CheckpointReader::header_for(const ManifestEntry& e) const {
  auto it = headers_.find(e.file);
  if (it != headers_.end()) return *it->second;
  std::string path = (fs::path(dir_) / e.file).string();
  if (!fs::exists(path)) fail("missing data file {} (holds tensor '{}')", path, e.key);
  std::shared_ptr<SafetensorsHeader> h;
  try {
    h = std::make_shared<SafetensorsHeader>(read_safetensors_header(path));
  } catch (const Error& err) {
    fail("{} (while reading tensor '{}')", err.what(), e.key);
  }
  headers_[e.file] = h;
  return *h;
}

void CheckpointReader::read_bytes(const ManifestEntry& e, void* dst) const {
  const SafetensorsHeader& h = header_for(e);
  if (!e.is_whole())
    fail("{}: tensor '{}' is a shard (global_offset {}); this reader reads whole tensors", h.path,
         e.key, shape_str(e.global_offset));
  const SafetensorsEntry* se = h.find(e.key);
  const bool header_agrees = se && h.data_start + se->begin == e.byte_offset &&
                             se->end - se->begin == e.byte_length;
  if (header_agrees && e.byte_offset + e.byte_length > h.file_size) {
    fail("{} is truncated: tensor '{}' needs bytes [{}, {}) but the file has {} bytes", h.path, e.key,
         e.byte_offset, e.byte_offset + e.byte_length, h.file_size);
  }
  if (e.byte_offset < h.data_start || e.byte_offset + e.byte_length > h.file_size) {
    fail("{}: tensor '{}' manifest bytes [{}, {}) out of range (data section [{}, {}))", h.path, e.key,
         e.byte_offset, e.byte_offset + e.byte_length, h.data_start, h.file_size);
  }
  pread_exact(h.path, e.byte_offset, e.byte_length, dst, fmt::format("tensor '{}'", e.key));
  uint64_t got = xxh3_bytes(dst, e.byte_length);
  if (got != e.xxh3) {
    fail("{}: tensor '{}' checksum mismatch (xxh3 {} in the manifest, {} on disk)", h.path, e.key,
         xxh3_hex(e.xxh3), xxh3_hex(got));
  }
}

void CheckpointReader::read_into(const std::string& key, const Tensor& dst) const {
  const ManifestEntry& e = entry(key);
  if (!dst.defined()) fail("read_into '{}': destination tensor is undefined", key);
  if (dst.dtype() != e.dtype || dst.shape() != e.global_shape) {
    fail("{}: tensor '{}' is {} {} in the checkpoint but the destination is {} {}",
         (fs::path(dir_) / e.file).string(), key, dtype_name(e.dtype), shape_str(e.global_shape),
         dtype_name(dst.dtype()), shape_str(dst.shape()));
  }
  if (dst.is_cpu()) {
    read_bytes(e, dst.raw());
  } else {
    Tensor host = Tensor::empty(e.global_shape, e.dtype, Device::CPU);
    read_bytes(e, host.raw());
    Tensor target = dst;  // same storage
    target.copy_from(host);
  }
}

Tensor CheckpointReader::read(const std::string& key) const {
  const ManifestEntry& e = entry(key);
  Tensor t = Tensor::empty(e.global_shape, e.dtype, Device::CPU);
  read_into(key, t);
  return t;
}

void CheckpointReader::verify(const std::string& key) const {
  const ManifestEntry& e = entry(key);
  const SafetensorsHeader& h = header_for(e);
  const SafetensorsEntry* se = h.find(key);
  if (!se) fail("{}: tensor '{}' is in the manifest but not in the file's header", h.path, key);
  if (!se->dtype_known || se->dtype != e.dtype || se->shape != e.local_shape ||
      h.data_start + se->begin != e.byte_offset || se->end - se->begin != e.byte_length) {
    fail("{}: tensor '{}' header entry ({} {} at {}) disagrees with the manifest ({} {} at {})", h.path,
         key, se->dtype_str, shape_str(se->shape), h.data_start + se->begin,
         dtype_safetensors_name(e.dtype), shape_str(e.local_shape), e.byte_offset);
  }
  std::vector<char> buf(e.byte_length);
  read_bytes(e, buf.data());
}

}  // namespace mcpp::dist_checkpointing
