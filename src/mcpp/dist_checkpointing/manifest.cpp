// manifest.json (de)serialization and validation; see manifest.h.
#include "mcpp/dist_checkpointing/manifest.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include <fmt/ranges.h>
#include <xxhash.h>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"

namespace mcpp::dist_checkpointing {
namespace {

const nlohmann::json& field(const nlohmann::json& obj, const char* name, const std::string& where) {
  auto it = obj.find(name);
  if (it == obj.end()) fail("{}: missing field '{}'", where, name);
  return *it;
}

uint64_t get_u64(const nlohmann::json& obj, const char* name, const std::string& where) {
  const auto& v = field(obj, name, where);
  if (!v.is_number_unsigned()) fail("{}: field '{}' must be a non-negative integer", where, name);
  return v.get<uint64_t>();
}

Shape get_shape(const nlohmann::json& obj, const char* name, const std::string& where) {
  const auto& v = field(obj, name, where);
  if (!v.is_array()) fail("{}: field '{}' must be an array of integers", where, name);
  Shape s;
  for (const auto& d : v) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 48))
      fail("{}: field '{}' must be an array of non-negative integers", where, name);
    s.push_back(d.get<int64_t>());
  }
  // numel (and numel * 8 bytes) must fit int64: a bigger shape is damage, not a tensor.
  uint64_t numel = 1;
  for (int64_t dim : s) {
    if (dim != 0 && numel > (1ull << 59) / static_cast<uint64_t>(dim))
      fail("{}: field '{}' {} has more elements than any checkpoint can hold", where, name, shape_str(s));
    numel *= static_cast<uint64_t>(dim);
  }
  return s;
}

std::string get_str(const nlohmann::json& obj, const char* name, const std::string& where) {
  const auto& v = field(obj, name, where);
  if (!v.is_string()) fail("{}: field '{}' must be a string", where, name);
  return v.get<std::string>();
}

uint64_t parse_hex64(const std::string& s, const std::string& where) {
  if (s.size() != 16) fail("{}: field 'xxh3' must be 16 hex digits, got '{}'", where, s);
  uint64_t v = 0;
  for (char c : s) {
    int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
    if (d < 0) fail("{}: field 'xxh3' must be lowercase hex, got '{}'", where, s);
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

ManifestEntry entry_from_json(const nlohmann::json& t, const std::string& path, size_t index) {
  std::string where = fmt::format("{}: tensors[{}]", path, index);
  if (!t.is_object()) fail("{} is not an object", where);
  ManifestEntry e;
  e.key = get_str(t, "key", where);
  if (e.key.empty()) fail("{}: empty key", where);
  where = fmt::format("{}: tensor '{}'", path, e.key);
  std::string dt = get_str(t, "dtype", where);
  try {
    e.dtype = dtype_from_name(dt);
  } catch (const Error&) {
    fail("{}: unknown dtype '{}'", where, dt);
  }
  e.global_shape = get_shape(t, "global_shape", where);
  e.global_offset = get_shape(t, "global_offset", where);
  e.local_shape = get_shape(t, "local_shape", where);
  if (e.global_offset.size() != e.global_shape.size() || e.local_shape.size() != e.global_shape.size())
    fail("{}: global_shape, global_offset and local_shape must have the same rank", where);
  for (size_t d = 0; d < e.global_shape.size(); ++d) {
    if (e.global_offset[d] + e.local_shape[d] > e.global_shape[d])
      fail("{}: global_offset + local_shape exceeds global_shape in dim {}", where, d);
  }
  e.file = get_str(t, "file", where);
  if (e.file.empty() || e.file.find('/') != std::string::npos || e.file == "." || e.file == "..")
    fail("{}: file '{}' must be a plain file name inside the checkpoint directory", where, e.file);
  e.byte_offset = get_u64(t, "byte_offset", where);
  e.byte_length = get_u64(t, "byte_length", where);
  if (e.byte_offset > (1ull << 62) || e.byte_length > (1ull << 62))
    fail("{}: byte_offset/byte_length out of range", where);
  uint64_t want = static_cast<uint64_t>(shape_numel(e.local_shape)) * dtype_size(e.dtype);
  if (e.byte_length != want) {
    fail("{}: byte_length {} does not match local_shape {} of {} ({} bytes)", where, e.byte_length,
         shape_str(e.local_shape), dtype_name(e.dtype), want);
  }
  e.xxh3 = parse_hex64(get_str(t, "xxh3", where), where);
  return e;
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }
uint64_t hash_text(const std::string& s) { return XXH3_64bits(s.data(), s.size()); }

// A tensor entry's field name: "tensors[<key>@<global_offset>]" (unique in a valid manifest, and stable when
// another entry is dropped), or "tensors[<index>]" for an entry without a string key.
std::string tensor_field_name(const nlohmann::json& e, size_t index) {
  if (e.is_object()) {
    const auto k = e.find("key"), o = e.find("global_offset");
    if (k != e.end() && k->is_string() && o != e.end() && o->is_array()) {
      std::vector<std::string> dims;
      for (const auto& d : *o) dims.push_back(d.dump());
      return fmt::format("tensors[{}@{}]", k->get_ref<const std::string&>(), fmt::join(dims, ","));
    }
  }
  return fmt::format("tensors[{}]", index);
}

// The checksummed fields of a manifest (manifest.h, "Checksum"): objects split down to depth 3
// ("meta.optimizer.step"), arrays at depth <= 2 split into elements ("meta.x[1]", tensors by key and
// offset), every other value a leaf. A name seen twice keeps both hashes (comma-joined): nothing is lost.
void collect_fields(const nlohmann::json& j, const std::string& path, int depth,
                    std::map<std::string, std::string>& out) {
  auto add = [&](const std::string& name, const nlohmann::json& v) {
    std::string& h = out[name];
    h += (h.empty() ? "" : ",") + hex64(hash_text(v.dump()));
  };
  if (j.is_object() && !j.empty() && depth < 3) {
    for (const auto& [k, v] : j.items()) {
      if (depth == 0 && (k == kManifestChecksumField || k == kManifestFieldChecksumsField)) continue;
      collect_fields(v, path.empty() ? k : path + "." + k, depth + 1, out);
    }
    return;
  }
  if (j.is_array() && !j.empty() && depth > 0 && depth < 3) {
    for (size_t i = 0; i < j.size(); ++i)
      add(path == "tensors" ? tensor_field_name(j[i], i) : fmt::format("{}[{}]", path, i), j[i]);
    return;
  }
  add(path, j);
}

nlohmann::json field_checksums(const nlohmann::json& j) {
  std::map<std::string, std::string> fields;
  collect_fields(j, "", 0, fields);
  return fields;
}

// Checks manifest_xxh3 / manifest_field_xxh3 against the content; names the fields that changed.
void check_checksum(const nlohmann::json& j, const std::string& path) {
  const auto whole = j.find(kManifestChecksumField);
  const auto stored = j.find(kManifestFieldChecksumsField);
  if (whole == j.end() || stored == j.end())
    fail("{}: format_version {} requires the manifest checksum fields '{}' and '{}' (the manifest was cut or "
         "edited)", path, kManifestFormatVersion, kManifestFieldChecksumsField, kManifestChecksumField);
  if (!stored->is_object() || !whole->is_string())
    fail("{}: the manifest checksum fields are damaged ('{}' must be an object, '{}' a string)", path,
         kManifestFieldChecksumsField, kManifestChecksumField);
  const nlohmann::json now = field_checksums(j);
  std::vector<std::string> changed;
  for (const auto& [k, v] : now.items())
    if (!stored->contains(k)) changed.push_back(k + " (added)");
    else if ((*stored)[k] != v) changed.push_back(k);
  for (const auto& [k, v] : stored->items())
    if (!now.contains(k)) changed.push_back(k + " (removed)");
  if (!changed.empty()) {
    const auto shown = changed.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(changed.size(), 4));
    fail("{}: manifest checksum mismatch: {}{} changed after the save (the manifest was edited or damaged); "
         "refusing to use this checkpoint", path, fmt::join(changed.begin(), shown, ", "),
         changed.size() > 4 ? fmt::format(" and {} more fields", changed.size() - 4) : std::string());
  }
  if (whole->get<std::string>() != hex64(hash_text(stored->dump())))
    fail("{}: manifest checksum mismatch: '{}' does not match '{}' (the checksum fields were edited or damaged); "
         "refusing to use this checkpoint", path, kManifestChecksumField, kManifestFieldChecksumsField);
}

// Two entries of one file whose byte ranges overlap would read each other's bytes.
void check_no_aliasing(const Manifest& m, const std::string& path) {
  std::vector<const ManifestEntry*> es;
  for (const auto& e : m.tensors)
    if (e.byte_length > 0) es.push_back(&e);
  std::sort(es.begin(), es.end(), [](auto* a, auto* b) {
    return std::tie(a->file, a->byte_offset) < std::tie(b->file, b->byte_offset);
  });
  for (size_t i = 1; i < es.size(); ++i) {
    const ManifestEntry &a = *es[i - 1], &b = *es[i];
    if (a.file == b.file && b.byte_offset < a.byte_offset + a.byte_length)
      fail("{}: tensors '{}' (shard at {}) and '{}' (shard at {}) alias the same bytes [{}, {}) of {}", path, a.key,
           shape_str(a.global_offset), b.key, shape_str(b.global_offset), b.byte_offset,
           std::min(a.byte_offset + a.byte_length, b.byte_offset + b.byte_length), a.file);
  }
}

}  // namespace

bool ManifestEntry::is_whole() const {
  for (int64_t o : global_offset)
    if (o != 0) return false;
  return local_shape == global_shape;
}

const ManifestEntry* Manifest::find(const std::string& key) const {
  for (const auto& e : tensors)
    if (e.key == key) return &e;
  return nullptr;
}

nlohmann::json manifest_to_json(const Manifest& m) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& e : m.tensors) {
    tensors.push_back({{"key", e.key},
                       {"dtype", std::string(dtype_safetensors_name(e.dtype))},
                       {"global_shape", e.global_shape},
                       {"global_offset", e.global_offset},
                       {"local_shape", e.local_shape},
                       {"file", e.file},
                       {"byte_offset", e.byte_offset},
                       {"byte_length", e.byte_length},
                       {"xxh3", fmt::format("{:016x}", e.xxh3)}});
  }
  return {{"format", kManifestFormatName},
          {"format_version", m.format_version},
          {"iteration", m.iteration},
          {"meta", m.meta},
          {"tensors", tensors}};
}

Manifest manifest_from_json(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object()) fail("{}: manifest is not a JSON object", path);
  if (get_str(j, "format", path) != kManifestFormatName)
    fail("{}: field 'format' is not '{}'", path, kManifestFormatName);
  const auto& ver = field(j, "format_version", path);
  if (!ver.is_number_integer() || ver.get<int64_t>() < kManifestMinFormatVersion ||
      ver.get<int64_t>() > kManifestFormatVersion) {
    fail("{}: format_version {} is not supported (this build reads versions {} to {})", path, ver.dump(),
         kManifestMinFormatVersion, kManifestFormatVersion);
  }
  Manifest m;
  m.format_version = static_cast<int>(ver.get<int64_t>());
  // Before any field is used: version 3 carries the checksum; older versions are read without one (unless present).
  if (m.format_version >= 3 || j.contains(kManifestChecksumField) || j.contains(kManifestFieldChecksumsField))
    check_checksum(j, path);
  const auto& it = field(j, "iteration", path);
  if (!it.is_number_integer() || it.get<int64_t>() < 0)
    fail("{}: field 'iteration' must be a non-negative integer", path);
  m.iteration = it.get<int64_t>();
  m.meta = field(j, "meta", path);
  if (!m.meta.is_object()) fail("{}: field 'meta' must be an object", path);
  const auto& ts = field(j, "tensors", path);
  if (!ts.is_array()) fail("{}: field 'tensors' must be an array", path);
  std::set<std::pair<std::string, Shape>> seen;
  for (size_t i = 0; i < ts.size(); ++i) {
    ManifestEntry e = entry_from_json(ts[i], path, i);
    if (!seen.insert({e.key, e.global_offset}).second)
      fail("{}: tensor '{}' appears twice with global_offset {}", path, e.key, shape_str(e.global_offset));
    m.tensors.push_back(std::move(e));
  }
  validate_shard_layout(m, path);
  check_no_aliasing(m, path);
  return m;
}

void seal_manifest(nlohmann::json& j) {
  j.erase(kManifestChecksumField);
  j.erase(kManifestFieldChecksumsField);
  nlohmann::json fields = field_checksums(j);
  j[kManifestChecksumField] = hex64(hash_text(fields.dump()));
  j[kManifestFieldChecksumsField] = std::move(fields);
}

std::string manifest_text(const nlohmann::json& sealed) {
  nlohmann::json body = sealed;
  body.erase(kManifestChecksumField);
  body.erase(kManifestFieldChecksumsField);
  std::string text = body.dump(1);  // "{\n ...\n}"
  text.resize(text.size() - 2);     // drop "\n}"
  // The checksum fields last, indented like the rest.
  std::string fields = sealed.at(kManifestFieldChecksumsField).dump(1);
  std::string indented;
  for (char c : fields) {
    indented.push_back(c);
    if (c == '\n') indented.push_back(' ');
  }
  text += fmt::format(",\n \"{}\": {},\n \"{}\": {}\n}}\n", kManifestFieldChecksumsField, indented,
                      kManifestChecksumField, sealed.at(kManifestChecksumField).dump());
  return text;
}

std::string shard_entry_name(const std::string& key, const Shape& global_offset, bool whole) {
  if (whole) return key;
  return fmt::format("{}@{}", key, fmt::join(global_offset, ","));
}

void validate_shard_layout(const Manifest& m, const std::string& path) {
  std::map<std::string, std::vector<const ManifestEntry*>> by_key;
  for (const auto& e : m.tensors) by_key[e.key].push_back(&e);
  for (auto& [key, es] : by_key) {
    const ManifestEntry& a = *es[0];
    int64_t total = 0;
    for (const ManifestEntry* e : es) {
      if (e->dtype != a.dtype || e->global_shape != a.global_shape)
        fail("{}: tensor '{}': shard in {} is {} {} but shard in {} is {} {}", path, key, e->file,
             dtype_name(e->dtype), shape_str(e->global_shape), a.file, dtype_name(a.dtype),
             shape_str(a.global_shape));
      total += shape_numel(e->local_shape);  // each <= 2^59 (get_shape)
      if (total > (int64_t{1} << 62))
        fail("{}: tensor '{}': its shards hold more elements than any checkpoint can hold", path, key);
    }
    // Pairwise overlap test, with the entries sorted by offset so the inner loop stops early in dim 0.
    std::sort(es.begin(), es.end(), [](auto* x, auto* y) { return x->global_offset < y->global_offset; });
    for (size_t i = 0; i < es.size(); ++i) {
      for (size_t j = i + 1; j < es.size(); ++j) {
        const ManifestEntry &x = *es[i], &y = *es[j];
        if (!x.global_offset.empty() && y.global_offset[0] >= x.global_offset[0] + x.local_shape[0]) break;
        bool overlap = true;
        for (size_t d = 0; d < x.global_offset.size() && overlap; ++d)
          overlap = std::max(x.global_offset[d], y.global_offset[d]) <
                    std::min(x.global_offset[d] + x.local_shape[d], y.global_offset[d] + y.local_shape[d]);
        if (overlap)
          fail("{}: tensor '{}': shards overlap: offset {} shape {} in {} and offset {} shape {} in {}", path, key,
               shape_str(x.global_offset), shape_str(x.local_shape), x.file, shape_str(y.global_offset),
               shape_str(y.local_shape), y.file);
      }
    }
    if (total != shape_numel(a.global_shape))
      fail("{}: tensor '{}': its {} shards hold {} elements but the global shape {} has {} (missing shards)", path,
           key, es.size(), total, shape_str(a.global_shape), shape_numel(a.global_shape));
  }
}

Manifest read_manifest(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    fail("missing manifest {} (not a committed checkpoint?)", path);
  const std::string text = read_regular_file(path, "manifest", kManifestMaxBytes);
  return manifest_from_json(parse_json_limited(text, path, {.max_bytes = kManifestMaxBytes}), path);
}

}  // namespace mcpp::dist_checkpointing
