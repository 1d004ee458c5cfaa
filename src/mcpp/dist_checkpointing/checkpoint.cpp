// Single-process checkpoint save (atomic commit) and reader; see checkpoint.h.
#include "mcpp/dist_checkpointing/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "mcpp/core/error.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/dist_checkpointing/durable_file.h"
#include "mcpp/dist_checkpointing/sharded_tensor.h"

namespace fs = std::filesystem;

namespace mcpp::dist_checkpointing {
namespace {

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
  // whole tensors in model.safetensors + optimizer.safetensors: version 1's layout, with version 3's checksum
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
  nlohmann::json j = manifest_to_json(m);
  seal_manifest(j);
  write_file_atomic(dir + "/" + kManifestFile, manifest_text(j));
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
  std::string tmp_dir = final_dir + ".tmp-" + random_token();
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
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(path, ec))) return -1;
  // A regular file of a few bytes: a FIFO here is refused, never waited on.
  std::string s = read_regular_file(path, "checkpoint tracker", 4096);
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
  const std::string base = fs::path(path).lexically_normal().filename().string().empty()
                               ? fs::path(path).lexically_normal().parent_path().filename().string()
                               : fs::path(path).lexically_normal().filename().string();
  if (base.find(".tmp-") != std::string::npos || base.find(".superseded-") != std::string::npos ||
      base.find(".deleting-") != std::string::npos)
    fail("{} is an uncommitted (staging), superseded or being-deleted checkpoint directory; it is never loaded", path);
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
      manifest_(read_manifest((fs::path(dir_) / kManifestFile).string())) {
  for (size_t i = 0; i < manifest_.tensors.size(); ++i) {
    auto [it, fresh] = index_.try_emplace(manifest_.tensors[i].key);
    if (fresh) key_order_.push_back(it->first);
    it->second.push_back(i);
  }
}

const ManifestEntry& CheckpointReader::entry(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) fail("checkpoint {} has no tensor '{}'", dir_, key);
  return manifest_.tensors[it->second.front()];
}

std::vector<const ManifestEntry*> CheckpointReader::entries(const std::string& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) fail("checkpoint {} has no tensor '{}'", dir_, key);
  std::vector<const ManifestEntry*> out;
  for (size_t i : it->second) out.push_back(&manifest_.tensors[i]);
  return out;
}

std::vector<std::string> CheckpointReader::keys() const { return key_order_; }

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

void CheckpointReader::check_entry_bytes(const ManifestEntry& e) const {
  // The data file's own header must name this shard with the manifest's dtype, shape and byte range: two
  // swapped entries, or two keys pointing at one range, are refused here before any byte is used.
  const SafetensorsHeader& h = header_for(e);
  const std::string name = shard_entry_name(e);
  const SafetensorsEntry* se = h.find(name);
  if (!se)
    fail("{}: tensor '{}' (entry '{}') is in the manifest but not in the file's header", h.path, e.key, name);
  if (!se->dtype_known || se->dtype != e.dtype || se->shape != e.local_shape ||
      h.data_start + se->begin != e.byte_offset || se->end - se->begin != e.byte_length) {
    fail("{}: tensor '{}' header entry ({} {} at bytes [{}, {})) disagrees with the manifest ({} {} at bytes [{}, {}))",
         h.path, e.key, se->dtype_str, shape_str(se->shape), h.data_start + se->begin, h.data_start + se->end,
         dtype_safetensors_name(e.dtype), shape_str(e.local_shape), e.byte_offset, e.byte_offset + e.byte_length);
  }
  if (e.byte_offset + e.byte_length > h.file_size) {
    fail("{} is truncated: tensor '{}' needs bytes [{}, {}) but the file has {} bytes", h.path, e.key,
         e.byte_offset, e.byte_offset + e.byte_length, h.file_size);
  }
}

void CheckpointReader::read_bytes(const ManifestEntry& e, void* dst, uint64_t begin, uint64_t end,
                                  bool check_sum) const {
  check_entry_bytes(e);
  const std::string path = (fs::path(dir_) / e.file).string();
  const std::string what = fmt::format("tensor '{}' (shard at {})", e.key, shape_str(e.global_offset));
  if (!check_sum) {
    pread_exact(path, e.byte_offset + begin, end - begin, static_cast<char*>(dst) + begin, what);
    bytes_read_ += end - begin;
    return;
  }
  pread_exact(path, e.byte_offset, e.byte_length, dst, what);
  bytes_read_ += e.byte_length;
  uint64_t got = xxh3_bytes(dst, e.byte_length);
  if (got != e.xxh3) {
    fail("{}: tensor '{}' checksum mismatch (xxh3 {} in the manifest, {} on disk; shard at offset {})", path,
         e.key, xxh3_hex(e.xxh3), xxh3_hex(got), shape_str(e.global_offset));
  }
}

void CheckpointReader::read_region(const std::string& key, const Shape& region_offset, const Tensor& dst) const {
  if (!dst.defined()) fail("read '{}': destination tensor is undefined", key);
  const std::vector<const ManifestEntry*> es = entries(key);
  const ManifestEntry& first = *es.front();
  const Rect region{region_offset, dst.shape()};
  bool inside = region_offset.size() == first.global_shape.size();
  for (size_t d = 0; inside && d < region_offset.size(); ++d)
    inside = region_offset[d] >= 0 && region_offset[d] + region.shape[d] <= first.global_shape[d];
  if (dst.dtype() != first.dtype || !inside) {
    fail("{}: tensor '{}' is {} {} in the checkpoint but the destination is {} {} at offset {}",
         (fs::path(dir_) / first.file).string(), key, dtype_name(first.dtype), shape_str(first.global_shape),
         dtype_name(dst.dtype()), shape_str(dst.shape()), shape_str(region_offset));
  }
  // Plan: which shards intersect, and check they cover the region exactly once before reading any.
  std::vector<std::pair<const ManifestEntry*, Rect>> plan;
  int64_t covered = 0;
  for (const ManifestEntry* e : es) {
    if (auto x = intersect(Rect{e->global_offset, e->local_shape}, region)) {
      covered += x->numel();
      plan.emplace_back(e, *x);
    }
  }
  if (covered != region.numel())
    fail("{}: tensor '{}': the saved shards cover {} of the {} elements of region offset {} shape {}", dir_, key,
         covered, region.numel(), shape_str(region_offset), shape_str(region.shape));
  Tensor host = dst.is_cpu() ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::CPU);
  const size_t es_bytes = dtype_size(first.dtype);
  const size_t nd = region.shape.size();
  for (const auto& [e, x] : plan) {
    Shape src_at(nd), dst_at(nd), last(nd);
    for (size_t d = 0; d < nd; ++d) {
      src_at[d] = x.offset[d] - e->global_offset[d];
      dst_at[d] = x.offset[d] - region.offset[d];
      last[d] = src_at[d] + x.shape[d] - 1;
    }
    // Flat element span [lo, hi] of the intersection inside the saved shard.
    int64_t lo = 0, hi = 0;
    for (size_t d = 0; d < nd; ++d) {
      lo = lo * e->local_shape[d] + src_at[d];
      hi = hi * e->local_shape[d] + last[d];
    }
    const char* src = nullptr;
    std::vector<char> buf;
    if (verify_checksums_ && cached_entry_ == e) {
      src = cached_bytes_.data();  // the last verified shard: consecutive regions of one shard read it once
    } else {
      check_entry_bytes(*e);  // before allocating: the bytes a manifest claims must exist on disk
      buf.resize(e->byte_length);
      read_bytes(*e, buf.data(), static_cast<uint64_t>(lo) * es_bytes, static_cast<uint64_t>(hi + 1) * es_bytes,
                 /*check_sum=*/verify_checksums_);
      if (verify_checksums_) {
        cached_bytes_ = std::move(buf);
        cached_entry_ = e;
        src = cached_bytes_.data();
      } else {
        src = buf.data();
      }
    }
    copy_rect(host.raw(), region.shape, dst_at, src, e->local_shape, src_at, x.shape, es_bytes);
  }
  if (!dst.is_cpu()) {
    Tensor target = dst;  // same storage
    target.copy_from(host);
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
  read_region(key, Shape(e.global_shape.size(), 0), dst);
}

Tensor CheckpointReader::read(const std::string& key) const {
  const ManifestEntry& e = entry(key);
  for (const ManifestEntry* ep : entries(key)) check_entry_bytes(*ep);  // its bytes exist before we allocate
  Tensor t;
  try {
    t = Tensor::empty(e.global_shape, e.dtype, Device::CPU);
  } catch (const std::exception& err) {  // std::bad_alloc, or the allocator's "out of host memory"
    fail("{}: tensor '{}' ({} {}, {} bytes) does not fit in host memory: {}", dir_, key, dtype_name(e.dtype),
         shape_str(e.global_shape), shape_numel(e.global_shape) * static_cast<int64_t>(dtype_size(e.dtype)),
         err.what());
  }
  read_into(key, t);
  return t;
}

void CheckpointReader::verify(const std::string& key) const {
  if (verified_.count(key)) return;  // every shard of key already passed (callers loop over entries)
  for (const ManifestEntry* ep : entries(key)) {
    check_entry_bytes(*ep);  // before allocating: the bytes a manifest claims must exist on disk
    std::vector<char> buf(ep->byte_length);
    read_bytes(*ep, buf.data(), 0, ep->byte_length, /*check_sum=*/true);  // header check + checksum, always
  }
  verified_.insert(key);
}

std::vector<std::string> CheckpointReader::unlisted_header_entries() const {
  std::set<std::string> files;
  std::set<std::pair<std::string, std::string>> listed;  // (file, entry name)
  for (const ManifestEntry& e : manifest_.tensors) {
    files.insert(e.file);
    listed.insert({e.file, shard_entry_name(e)});
  }
  std::vector<std::string> out;
  for (const std::string& f : files) {
    const SafetensorsHeader& h = header_for(*std::find_if(manifest_.tensors.begin(), manifest_.tensors.end(),
                                                          [&](const ManifestEntry& e) { return e.file == f; }));
    for (const SafetensorsEntry& se : h.entries)
      if (!listed.count({f, se.name})) out.push_back(fmt::format("{} (in {})", se.name, h.path));
  }
  return out;
}

}  // namespace mcpp::dist_checkpointing
