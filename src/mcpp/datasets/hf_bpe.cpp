// tokenizer.json's BPE model; the contract is in hf_bpe.h.
#include "mcpp/datasets/hf_bpe.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <mutex>
#include <queue>

#include "mcpp/core/error.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"

namespace mcpp::hf {
namespace {

constexpr size_t kShards = 16;
constexpr size_t kShardMaxEntries = 1 << 16;  // words a shard; cleared when full to bound memory
constexpr size_t kMaxCachedWordBytes = 128;   // longer words (whole Metaspace texts) are not cached

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Word::merge_all's queue entry: the lowest rank first, then the leftmost position.
struct Merge {
  int32_t pos, rank, new_id;
  bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

struct Symbol {
  int32_t id;
  int32_t prev, next;  // linked list over the word's symbols (-1: none)
  bool removed;
};

}  // namespace

struct BpeModel::Cache {
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  std::array<Shard, kShards> shards;
};

BpeModel::BpeModel(const nlohmann::json& m, const std::string& where) : cache_(std::make_unique<Cache>()) {
  auto str_or_empty = [&](const char* key) -> std::string {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return {};
    if (!it->is_string()) fail("{}: model.{} must be a string or null", where, key);
    return it->get<std::string>();
  };
  auto flag = [&](const char* key) {
    auto it = m.find(key);
    if (it == m.end() || it->is_null()) return false;
    if (!it->is_boolean()) fail("{}: model.{} must be true or false", where, key);
    return it->get<bool>();
  };
  if (m.contains("dropout") && !m["dropout"].is_null() && m["dropout"].get<double>() != 0.0)
    fail("{}: model.dropout (BPE dropout) is a training-time option and is not supported", where);
  prefix_ = str_or_empty("continuing_subword_prefix");
  suffix_ = str_or_empty("end_of_word_suffix");
  fuse_unk_ = flag("fuse_unk");
  byte_fallback_ = flag("byte_fallback");
  ignore_merges_ = flag("ignore_merges");

  const auto vit = m.find("vocab");
  if (vit == m.end() || !vit->is_object() || vit->empty())
    fail("{}: model.vocab must be a non-empty object {{token: id}}", where);
  int64_t max_id = -1;
  for (const auto& [tok, v] : vit->items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
      fail("{}: model.vocab: the id of '{}' must be a non-negative integer", where, tok);
    max_id = std::max(max_id, v.get<int64_t>());
  }
  id_to_token_.assign(static_cast<size_t>(max_id + 1), {});
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  vocab_.reserve(vit->size());
  for (const auto& [tok, v] : vit->items()) {
    const auto id = v.get<int32_t>();
    if (has_id_[static_cast<size_t>(id)])
      fail("{}: model.vocab: id {} is given to both '{}' and '{}'", where, id, id_to_token_[static_cast<size_t>(id)], tok);
    has_id_[static_cast<size_t>(id)] = true;
    id_to_token_[static_cast<size_t>(id)] = tok;
    vocab_.emplace(tok, id);
    int32_t cp;
    if (!tok.empty() && static_cast<size_t>(gpt2::decode_utf8(tok, 0, cp)) == tok.size() && cp >= 0)
      char_ids_.emplace(cp, id);
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) byte_ids_[static_cast<size_t>(b)] = token_to_id(fmt::format("<0x{:02X}>", b));
  if (const std::string unk = str_or_empty("unk_token"); !unk.empty()) {
    unk_id_ = token_to_id(unk);
    if (unk_id_ < 0) fail("{}: model.unk_token '{}' is not in model.vocab", where, unk);
  }

  const auto mit = m.find("merges");
  if (mit == m.end() || !mit->is_array()) fail("{}: model.merges must be a list", where);
  merges_.reserve(mit->size());
  int32_t rank = 0;
  for (const auto& e : *mit) {
    std::string a, b;
    if (e.is_string()) {
      const auto& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) fail("{}: model.merges[{}] '{}' is not 'a b'", where, rank, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", where, rank);
    }
    const int32_t ia = token_to_id(a), ib = token_to_id(b);
    const std::string merged = a + (b.size() >= prefix_.size() ? b.substr(prefix_.size()) : std::string());
    const int32_t ir = token_to_id(merged);
    if (ia < 0 || ib < 0 || ir < 0)
      fail("{}: model.merges[{}] ('{}' '{}'): '{}' is not in model.vocab", where, rank, a, b,
           ia < 0 ? a : ib < 0 ? b : merged);
    merges_[pair_key(ia, ib)] = {rank++, ir};
  }
}

BpeModel::~BpeModel() = default;

int32_t BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  return it == vocab_.end() ? -1 : it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[static_cast<size_t>(id)]) return nullptr;
  return &id_to_token_[static_cast<size_t>(id)];
}

int32_t BpeModel::char_id(std::string_view ch, bool first, bool last) const {
  const bool affixed = (!first && !prefix_.empty()) || (last && !suffix_.empty());
  if (!affixed) {
    int32_t cp;
    gpt2::decode_utf8(ch, 0, cp);
    auto it = char_ids_.find(cp);
    return it == char_ids_.end() ? -1 : it->second;
  }
  std::string s = first ? std::string() : prefix_;
  s += ch;
  if (last) s += suffix_;
  return token_to_id(s);
}

void BpeModel::merge_word(std::string_view w, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  sym.reserve(w.size());
  auto add = [&](int32_t id) {
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back({id, n - 1, -1, false});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
  };
  int32_t pending_unk = -1;  // an unknown run waiting to be added (fuse_unk)
  for (size_t i = 0; i < w.size();) {
    int32_t cp;
    const auto len = static_cast<size_t>(gpt2::decode_utf8(w, i, cp));
    const std::string_view ch = w.substr(i, len);
    const int32_t id = char_id(ch, i == 0, i + len == w.size());
    i += len;
    if (id >= 0) {
      if (pending_unk >= 0) add(pending_unk), pending_unk = -1;
      add(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {  // as `tokenizers`: a pending unknown is not flushed before the bytes
        for (char c : ch) add(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) add(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) add(pending_unk);

  // Word::merge_all
  std::priority_queue<Merge> queue;
  for (size_t k = 0; k + 1 < sym.size(); ++k) {
    auto it = merges_.find(pair_key(sym[k].id, sym[k + 1].id));
    if (it != merges_.end()) queue.push({static_cast<int32_t>(k), it->second.first, it->second.second});
  }
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& cur = sym[static_cast<size_t>(top.pos)];
    if (cur.removed || cur.next < 0) continue;
    const int32_t next_pos = cur.next;
    const Symbol right = sym[static_cast<size_t>(next_pos)];
    auto it = merges_.find(pair_key(cur.id, right.id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;  // an expired entry
    cur.id = top.new_id;
    cur.next = right.next;
    sym[static_cast<size_t>(next_pos)].removed = true;
    if (right.next >= 0) sym[static_cast<size_t>(right.next)].prev = top.pos;
    if (cur.prev >= 0) {
      auto p = merges_.find(pair_key(sym[static_cast<size_t>(cur.prev)].id, cur.id));
      if (p != merges_.end()) queue.push({cur.prev, p->second.first, p->second.second});
    }
    if (cur.next >= 0) {
      auto p = merges_.find(pair_key(cur.id, sym[static_cast<size_t>(cur.next)].id));
      if (p != merges_.end()) queue.push({top.pos, p->second.first, p->second.second});
    }
  }
  for (const Symbol& s : sym)
    if (!s.removed) out.push_back(s.id);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (int32_t id = token_to_id(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    merge_word(word, out);
    return;
  }
  Cache::Shard& shard = cache_->shards[std::hash<std::string_view>{}(word) % kShards];
  std::string key(word);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.words.find(key);
    if (it != shard.words.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  merge_word(word, out);
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.words.size() >= kShardMaxEntries) shard.words.clear();
  shard.words.emplace(std::move(key), std::vector<int32_t>(out.begin() + static_cast<std::ptrdiff_t>(start), out.end()));
}

}  // namespace mcpp::hf
