// mcpp data preprocess — Megatron's tools/preprocess_data.py (the `data` dispatcher is apps/mcpp/data.cpp).
//
//   mcpp data preprocess --input FILE --output-prefix P [--json-keys text ...] [--append-eod]
//        [tokenizer flags: apps/mcpp/tokenizer_flags.h] [--workers N] [--log-interval K]
//     FILE.jsonl / FILE.json: one JSON object per line; each key's value is a string (one sequence) or a list of
//       strings (one sequence each, empty ones dropped), as Megatron's Encoder.encode. Blank lines are skipped; a
//       line that is not valid JSON is an error naming its line number.
//     FILE.txt: the fortune format, documents separated by lines holding only "%"; documents that are only
//       whitespace are skipped. The key is "text".
//     With --append-eod, a non-empty document gets the tokenizer's EOD at its end. Output per key:
//       {P}_{key}_document.bin / .idx (dtype: Megatron's DType.optimal_dtype of the vocabulary size), written
//       under temporary names and renamed at the end. Progress goes to stderr every --log-interval documents;
//       the last line on stdout names the prefix for --data-path.
//     --workers N: N threads tokenize batches of documents (4 MB or 1024 documents) while the main thread reads the next batch and
//       writes the previous one in input order, so the output is byte-identical for every N. A failing document
//       (bad JSON, a key missing, text a tokenizer refuses) is reported as the first in input order.
// Errors -> mcpp::Error -> one line "error: ..." and exit code 2; a failed run leaves no outputs behind.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/mcpp/data_commands.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/datasets/indexed_dataset.h"

namespace mcpp::cli {
namespace {

namespace fs = std::filesystem;
constexpr size_t kBatchBytes = 4 << 20;  // a batch ends at this many bytes or kBatchDocs documents
constexpr size_t kBatchDocs = 1024;

// One output dataset per key, written to temporary names until commit().
struct KeyOutput {
  std::string key, prefix;
  std::unique_ptr<IndexedDatasetBuilder> builder;
  int64_t documents = 0;

  void commit() {
    builder->finalize(idx_path(prefix) + ".tmp");
    for (const auto& path : {bin_path(prefix), idx_path(prefix)}) {
      std::error_code ec;
      fs::rename(path + ".tmp", path, ec);
      if (ec) fail("cannot rename {}.tmp to {}: {}", path, path, ec.message());
    }
  }
};

struct RawDoc {
  std::string text;
  int64_t line = 0;  // JSONL: the line number (errors name it)
};

// A tokenized document: per key, the ids and sequence lengths (Megatron's Encoder.encode), or an error.
struct DocResult {
  std::vector<std::vector<int32_t>> ids, lens;  // [keys]
  std::string error;
};

std::vector<std::string> sentences_of(const nlohmann::json& v, const std::string& input, int64_t line,
                                      const std::string& key) {
  if (v.is_string()) return {v.get<std::string>()};
  if (v.is_array()) {
    std::vector<std::string> out;
    for (const auto& s : v) {
      if (!s.is_string()) fail("{}:{}: key \"{}\" holds a list with a non-string entry", input, line, key);
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  fail("{}:{}: key \"{}\" is {}, expected a string or a list of strings", input, line, key, v.type_name());
}

class Preprocessor {
 public:
  Preprocessor(const PreprocessFlags& f, std::unique_ptr<MegatronTokenizer> tok, bool jsonl)
      : f_(f), tok_(std::move(tok)), jsonl_(jsonl) {
    const auto dtype = optimal_indexed_dtype(tok_->vocab_size());
    for (const auto& key : f.json_keys) {
      KeyOutput o{key, fmt::format("{}_{}_document", f.output_prefix, key), nullptr};
      o.builder = std::make_unique<IndexedDatasetBuilder>(bin_path(o.prefix) + ".tmp", dtype);
      out_.push_back(std::move(o));
    }
    start_ = std::chrono::steady_clock::now();
  }
  ~Preprocessor() {  // a failed run leaves no partial outputs behind
    if (committed_) return;
    std::error_code ec;
    for (const auto& o : out_)
      for (const auto& path : {bin_path(o.prefix), idx_path(o.prefix)}) fs::remove(path + ".tmp", ec);
  }
  Preprocessor(const Preprocessor&) = delete;
  Preprocessor& operator=(const Preprocessor&) = delete;

  // Tokenizes `batch` on --workers threads; results in input order.
  std::vector<DocResult> encode_batch(const std::vector<RawDoc>& batch) const {
    std::vector<DocResult> res(batch.size());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t k; (k = next.fetch_add(1)) < batch.size();) {
        try {
          encode(batch[k], res[k]);
        } catch (const std::exception& e) {
          res[k].error = e.what();
        }
      }
    };
    std::vector<std::thread> threads;
    for (int w = 1; w < f_.workers; ++w) threads.emplace_back(work);
    work();
    for (auto& t : threads) t.join();
    return res;
  }

  void write(const std::vector<RawDoc>& batch, const std::vector<DocResult>& res) {
    for (size_t k = 0; k < batch.size(); ++k) {
      if (!res[k].error.empty()) fail("{}", res[k].error);
      for (size_t o = 0; o < out_.size(); ++o) {
        out_[o].builder->add_document(res[k].ids[o], res[k].lens[o]);
        ++out_[o].documents;
      }
      processed(batch[k].text.size() + (jsonl_ ? 1 : 0));
    }
  }

  void finish() {
    for (auto& o : out_) o.commit();
    committed_ = true;
    const double s = elapsed();
    for (const auto& o : out_)
      fmt::print("{}: {} documents, {} sequences, {} tokens ({}), {:.2f} MB of input in {:.2f} s ({:.2f} MB/s, "
                 "{} workers)\n",
                 o.prefix, o.documents, o.builder->num_sequences(), o.builder->num_tokens(),
                 indexed_dtype_name(optimal_indexed_dtype(tok_->vocab_size())), bytes_ / 1e6, s,
                 bytes_ / s / 1024 / 1024, f_.workers);
    for (const auto& o : out_) fmt::print("use --data-path {}\n", o.prefix);
  }

 private:
  // Megatron's Encoder.encode for each key: each non-empty sentence is a sequence; EOD ends the document.
  void encode(const RawDoc& d, DocResult& r) const {
    r.ids.assign(out_.size(), {});
    r.lens.assign(out_.size(), {});
    if (!jsonl_) return encode_key(d.text, 0, r);
    // Depth-bounded: one line of a corpus cannot drive a recursive walk.
    const nlohmann::json j = parse_json_limited(d.text, fmt::format("{}:{}: the line", f_.input, d.line));
    if (!j.is_object()) fail("{}:{}: expected a JSON object per line", f_.input, d.line);
    for (size_t o = 0; o < out_.size(); ++o) {
      auto it = j.find(out_[o].key);
      if (it == j.end()) fail("{}:{}: no key \"{}\" (--json-keys)", f_.input, d.line, out_[o].key);
      for (const auto& s : sentences_of(*it, f_.input, d.line, out_[o].key)) {
        try {
          encode_key(s, o, r);
        } catch (const Error& e) {
          fail("{}:{}: {}", f_.input, d.line, e.what());
        }
      }
    }
    if (f_.append_eod)
      for (size_t o = 0; o < out_.size(); ++o)
        if (!r.ids[o].empty()) {
          r.ids[o].push_back(tok_->eod());
          r.lens[o].back() += 1;
        }
  }
  void encode_key(const std::string& s, size_t o, DocResult& r) const {
    std::vector<int32_t> sid = tok_->tokenize(s);
    if (sid.empty()) return;
    r.ids[o].insert(r.ids[o].end(), sid.begin(), sid.end());
    r.lens[o].push_back(static_cast<int32_t>(sid.size()));
    if (!jsonl_ && f_.append_eod) {
      r.ids[o].push_back(tok_->eod());
      r.lens[o].back() += 1;
    }
  }
  void processed(size_t bytes) {
    bytes_ += static_cast<double>(bytes);
    ++docs_;
    if (f_.log_interval > 0 && docs_ % f_.log_interval == 0) {
      const double s = elapsed();
      fmt::print(stderr, "Processed {} documents ({:.2f} docs/s, {:.2f} MB/s).\n", docs_, docs_ / s,
                 bytes_ / s / 1024 / 1024);
    }
  }
  double elapsed() const {
    return std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }

  const PreprocessFlags& f_;
  std::unique_ptr<MegatronTokenizer> tok_;
  bool jsonl_;
  std::vector<KeyOutput> out_;
  std::chrono::steady_clock::time_point start_;
  int64_t docs_ = 0;
  double bytes_ = 0;
  bool committed_ = false;
};

// Reads the next batch of documents (~kBatchBytes); empty at the end of the input.
class Reader {
 public:
  Reader(std::ifstream& in, bool jsonl) : in_(in), jsonl_(jsonl) {}
  std::vector<RawDoc> next() {
    std::vector<RawDoc> batch;
    size_t bytes = 0;
    std::string line;
    while (bytes < kBatchBytes && batch.size() < kBatchDocs && std::getline(in_, line)) {
      ++lineno_;
      if (jsonl_) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        bytes += line.size();
        batch.push_back({std::move(line), lineno_});
      } else if (line == "%" || line == "%\r") {
        flush(batch, bytes);
      } else {
        doc_ += line;
        doc_ += '\n';
      }
    }
    if (!jsonl_ && !in_) flush(batch, bytes);  // the last document
    return batch;
  }

 private:
  void flush(std::vector<RawDoc>& batch, size_t& bytes) {
    if (doc_.find_first_not_of(" \t\r\n") != std::string::npos) {
      bytes += doc_.size();
      batch.push_back({std::move(doc_), lineno_});
    }
    doc_.clear();
  }
  std::ifstream& in_;
  bool jsonl_;
  int64_t lineno_ = 0;
  std::string doc_;
};

}  // namespace

int run_preprocess(const PreprocessFlags& f) {
  const std::string ext = fs::path(f.input).extension().string();
  const bool jsonl = ext == ".jsonl" || ext == ".json";
  if (!jsonl && ext != ".txt")
    fail("--input {}: unknown extension '{}' (expected .jsonl/.json, or .txt with %-separated documents)", f.input, ext);
  if (!jsonl && (f.json_keys.size() != 1 || f.json_keys[0] != "text"))
    fail("--json-keys applies to JSON input; a .txt input has the single key \"text\"");
  if (f.json_keys.empty()) fail("--json-keys: at least one key");
  if (f.workers < 1) fail("--workers {} must be >= 1", f.workers);
  std::ifstream in(f.input, std::ios::binary);
  if (!in) fail("cannot open --input {}: {}", f.input, std::strerror(errno));
  if (fs::is_directory(f.input)) fail("--input {} is a directory", f.input);
  Preprocessor p(f, mcpp::build_tokenizer(f.tok), jsonl);
  Reader reader(in, jsonl);
  std::vector<RawDoc> batch = reader.next();
  while (!batch.empty()) {
    // tokenize this batch on the workers while the next one is read
    auto pending = std::async(std::launch::async, [&p, &batch] { return p.encode_batch(batch); });
    std::vector<RawDoc> next = reader.next();
    std::vector<DocResult> res = pending.get();
    p.write(batch, res);
    batch.swap(next);
  }
  if (in.bad()) fail("reading --input {} failed", f.input);
  p.finish();
  return 0;
}

void add_preprocess_flags(CLI::App& pre, PreprocessFlags& f) {
  pre.add_option("--input", f.input, "input .jsonl/.json (one object per line) or .txt (%-separated)")->required();
  pre.add_option("--output-prefix", f.output_prefix, "output prefix")->required();
  pre.add_option("--json-keys", f.json_keys, "JSON keys to extract")->capture_default_str();
  pre.add_flag("--append-eod", f.append_eod, "append the tokenizer's end-of-document id to every document");
  pre.add_option("--workers", f.workers, "tokenizer threads (output identical for every N)")->capture_default_str();
  pre.add_option("--log-interval", f.log_interval, "progress every N documents")->capture_default_str();
  add_tokenizer_flags(pre, f.tok);
}

}  // namespace mcpp::cli
