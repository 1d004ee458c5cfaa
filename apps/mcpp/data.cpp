// mcpp data — Megatron's tools/preprocess_data.py, and a look inside indexed datasets.
//
//   mcpp data preprocess --input FILE --output-prefix P [--json-keys text ...] [--append-eod]
//        [--tokenizer-type GPT2BPETokenizer --vocab-file V --merge-file M] [--workers N] [--log-interval K]
//     FILE.jsonl / FILE.json: one JSON object per line; each key's value is a string (one sequence) or
//       a list of strings (one sequence each, empty ones dropped), as Megatron's Encoder.encode.
//       Blank lines are skipped; a line that is not valid JSON is an error naming its line number.
//     FILE.txt: the fortune format, documents separated by lines holding only "%"; documents that are
//       only whitespace are skipped. The key is "text".
//     With --append-eod, a non-empty document gets <|endoftext|> at its end. Output per key:
//       {P}_{key}_document.bin / .idx (dtype uint16 for GPT-2's 50257 ids: DType.optimal_dtype),
//       written under temporary names and renamed at the end. Progress goes to stderr every
//       --log-interval documents; the last line on stdout names the prefix for --data-path.
//     --workers is accepted for Megatron command-line compatibility; we tokenize on one thread.
//   mcpp data info --data-path P [--split 969,30,1] [--seq-length N [--num-samples S] [--seed K]]
//     Prints dtype, sequence / document / token counts and the split's sequence ranges; with
//     --seq-length also each non-empty split's GPTDataset: samples and epochs (num-samples 0 = one epoch).
// Errors (missing input, bad JSON, bad files) -> mcpp::Error -> one line "error: ..." and exit code 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <cstring>
#include <vector>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/error.h"
#include "mcpp/core/json_limits.h"
#include "mcpp/datasets/gpt_dataset.h"
#include "mcpp/datasets/indexed_dataset.h"

namespace {

namespace fs = std::filesystem;

struct PreprocessFlags {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
  mcpp::cli::TokenizerFlags tok;
};

// One output dataset per key, written to temporary names until commit().
struct KeyOutput {
  std::string key, prefix;
  std::unique_ptr<mcpp::IndexedDatasetBuilder> builder;
  int64_t documents = 0;

  void commit() {
    builder->finalize(mcpp::idx_path(prefix) + ".tmp");
    for (const auto& path : {mcpp::bin_path(prefix), mcpp::idx_path(prefix)}) {
      std::error_code ec;
      fs::rename(path + ".tmp", path, ec);
      if (ec) mcpp::fail("cannot rename {}.tmp to {}: {}", path, path, ec.message());
    }
  }
};

class Preprocessor {
 public:
  Preprocessor(const PreprocessFlags& f, mcpp::GPT2Tokenizer tok) : f_(f), tok_(std::move(tok)) {
    const auto dtype = mcpp::optimal_indexed_dtype(tok_.vocab_size());
    for (const auto& key : f.json_keys) {
      KeyOutput o{key, fmt::format("{}_{}_document", f.output_prefix, key), nullptr};
      o.builder = std::make_unique<mcpp::IndexedDatasetBuilder>(mcpp::bin_path(o.prefix) + ".tmp", dtype);
      out_.push_back(std::move(o));
    }
    start_ = std::chrono::steady_clock::now();
  }
  ~Preprocessor() {  // a failed run leaves no partial outputs behind
    if (committed_) return;
    std::error_code ec;
    for (const auto& o : out_)
      for (const auto& path : {mcpp::bin_path(o.prefix), mcpp::idx_path(o.prefix)}) fs::remove(path + ".tmp", ec);
  }
  Preprocessor(const Preprocessor&) = delete;
  Preprocessor& operator=(const Preprocessor&) = delete;

  // Megatron's Encoder.encode for one key: each non-empty sentence is a sequence; EOD ends the doc.
  void add_document(KeyOutput& o, const std::vector<std::string>& sentences) {
    std::vector<int32_t> ids, lens;
    for (const auto& s : sentences) {
      std::vector<int32_t> sid = tok_.encode(s);
      if (sid.empty()) continue;
      ids.insert(ids.end(), sid.begin(), sid.end());
      lens.push_back(static_cast<int32_t>(sid.size()));
    }
    if (!ids.empty() && f_.append_eod) {
      ids.push_back(tok_.eod());
      lens.back() += 1;
    }
    o.builder->add_document(ids, lens);
    ++o.documents;
  }

  void processed(size_t bytes) {
    bytes_ += bytes;
    ++docs_;
    if (f_.log_interval > 0 && docs_ % f_.log_interval == 0) {
      const double s = elapsed();
      fmt::print(stderr, "Processed {} documents ({:.2f} docs/s, {:.2f} MB/s).\n", docs_, docs_ / s,
                 bytes_ / s / 1024 / 1024);
    }
  }

  void finish() {
    for (auto& o : out_) o.commit();
    committed_ = true;
    const double s = elapsed();
    for (const auto& o : out_)
      fmt::print("{}: {} documents, {} sequences, {} tokens ({}), {:.2f} MB of input in {:.2f} s ({:.2f} MB/s)\n",
                 o.prefix, o.documents, o.builder->num_sequences(), o.builder->num_tokens(),
                 mcpp::indexed_dtype_name(mcpp::optimal_indexed_dtype(tok_.vocab_size())), bytes_ / 1e6, s,
                 bytes_ / s / 1024 / 1024);
    for (const auto& o : out_) fmt::print("use --data-path {}\n", o.prefix);
  }

  std::vector<KeyOutput>& outputs() { return out_; }

 private:
  double elapsed() const {
    return std::max(1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  const PreprocessFlags& f_;
  mcpp::GPT2Tokenizer tok_;
  std::vector<KeyOutput> out_;
  std::chrono::steady_clock::time_point start_;
  int64_t docs_ = 0;
  double bytes_ = 0;
  bool committed_ = false;
};

std::vector<std::string> sentences_of(const nlohmann::json& v, const std::string& input, int64_t line,
                                      const std::string& key) {
  if (v.is_string()) return {v.get<std::string>()};
  if (v.is_array()) {
    std::vector<std::string> out;
    for (const auto& s : v) {
      if (!s.is_string()) mcpp::fail("{}:{}: key \"{}\" holds a list with a non-string entry", input, line, key);
      out.push_back(s.get<std::string>());
    }
    return out;
  }
  mcpp::fail("{}:{}: key \"{}\" is {}, expected a string or a list of strings", input, line, key, v.type_name());
}

void read_jsonl(std::ifstream& in, const PreprocessFlags& f, Preprocessor& p) {
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // Depth-bounded: one line of a corpus cannot drive a recursive walk.
    const nlohmann::json j = mcpp::parse_json_limited(line, fmt::format("{}:{}: the line", f.input, lineno));
    if (!j.is_object()) mcpp::fail("{}:{}: expected a JSON object per line", f.input, lineno);
    for (auto& o : p.outputs()) {
      auto it = j.find(o.key);
      if (it == j.end()) mcpp::fail("{}:{}: no key \"{}\" (--json-keys)", f.input, lineno, o.key);
      p.add_document(o, sentences_of(*it, f.input, lineno, o.key));
    }
    p.processed(line.size() + 1);
  }
}

void read_fortunes(std::ifstream& in, Preprocessor& p) {
  std::string line, doc;
  auto flush = [&] {
    if (doc.find_first_not_of(" \t\r\n") != std::string::npos) {
      p.add_document(p.outputs()[0], {doc});
      p.processed(doc.size());
    }
    doc.clear();
  };
  while (std::getline(in, line)) {
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      doc += line;
      doc += '\n';
    }
  }
  flush();
}

int run_preprocess(const PreprocessFlags& f) {
  const std::string ext = fs::path(f.input).extension().string();
  const bool jsonl = ext == ".jsonl" || ext == ".json";
  if (!jsonl && ext != ".txt")
    mcpp::fail("--input {}: unknown extension '{}' (expected .jsonl/.json, or .txt with %-separated documents)",
               f.input, ext);
  if (!jsonl && (f.json_keys.size() != 1 || f.json_keys[0] != "text"))
    mcpp::fail("--json-keys applies to JSON input; a .txt input has the single key \"text\"");
  if (f.json_keys.empty()) mcpp::fail("--json-keys: at least one key");
  if (f.workers < 1) mcpp::fail("--workers {} must be >= 1", f.workers);
  std::ifstream in(f.input, std::ios::binary);
  if (!in) mcpp::fail("cannot open --input {}: {}", f.input, std::strerror(errno));
  if (fs::is_directory(f.input)) mcpp::fail("--input {} is a directory", f.input);
  Preprocessor p(f, mcpp::cli::build_tokenizer(f.tok));
  if (jsonl)
    read_jsonl(in, f, p);
  else
    read_fortunes(in, p);
  if (in.bad()) mcpp::fail("reading --input {} failed", f.input);
  p.finish();
  return 0;
}

struct InfoFlags {
  std::string prefix, split = "969,30,1";
  int64_t seq_length = 0, num_samples = 0;
  uint32_t seed = 1234;
};

int run_info(const InfoFlags& f) {
  const std::string& prefix = f.prefix;
  const std::string& split = f.split;
  mcpp::IndexedDataset ds = mcpp::IndexedDataset::open(prefix);
  fmt::print("{}: dtype {}, {} sequences, {} documents, {} tokens\n", prefix, mcpp::indexed_dtype_name(ds.dtype()),
             ds.num_sequences(), ds.num_documents(), ds.num_tokens());
  const auto b = mcpp::split_indices(split, ds.num_sequences());
  for (int k = 0; k < 3; ++k) {
    int64_t tokens = 0;
    for (int64_t q = b[k]; q < b[k + 1]; ++q) tokens += ds.sequence_length(q);
    std::string line = fmt::format("  {:<5} sequences [{}, {}), {} tokens", mcpp::split_name(k), b[k], b[k + 1], tokens);
    if (f.seq_length > 0 && b[k + 1] > b[k]) {
      auto shared = std::make_shared<const mcpp::IndexedDataset>(mcpp::IndexedDataset::open(prefix));
      mcpp::GPTDataset g(shared, {.prefix = prefix, .split = split, .split_index = k, .seq_length = f.seq_length,
                                  .num_samples = f.num_samples, .seed = f.seed});
      line += fmt::format(": {} samples of {}+1 tokens over {} epoch(s)", g.size(), f.seq_length, g.num_epochs());
    }
    fmt::print("{}\n", line);
  }
  return 0;
}

int run_data(const std::vector<std::string>& args) {
  CLI::App app{"mcpp data: build and inspect Megatron indexed datasets", "mcpp data"};
  app.require_subcommand(1);
  PreprocessFlags f;
  CLI::App* pre = app.add_subcommand("preprocess", "tokenize .jsonl/.txt into {prefix}_{key}_document.bin/.idx");
  pre->add_option("--input", f.input, "input .jsonl/.json (one object per line) or .txt (%-separated)")->required();
  pre->add_option("--output-prefix", f.output_prefix, "output prefix")->required();
  pre->add_option("--json-keys", f.json_keys, "JSON keys to extract")->capture_default_str();
  pre->add_flag("--append-eod", f.append_eod, "append <|endoftext|> to every document");
  pre->add_option("--workers", f.workers, "accepted for Megatron compatibility (one thread is used)");
  pre->add_option("--log-interval", f.log_interval, "progress every N documents")->capture_default_str();
  mcpp::cli::add_tokenizer_flags(*pre, f.tok);
  InfoFlags inf;
  CLI::App* info = app.add_subcommand("info", "counts and split ranges of an indexed dataset");
  info->add_option("--data-path", inf.prefix, "dataset prefix (without .bin/.idx)")->required();
  info->add_option("--split", inf.split, "Megatron --split")->capture_default_str();
  info->add_option("--seq-length", inf.seq_length, "also build each split's GPTDataset at this length");
  info->add_option("--num-samples", inf.num_samples, "samples per split for --seq-length (0 = one epoch)");
  info->add_option("--seed", inf.seed, "shuffle seed for --seq-length")->capture_default_str();
  mcpp::cli::parse_args(app, args);  // `data preprocess --help`: the subcommand's help, "mcpp data preprocess"
  if (pre->parsed()) return run_preprocess(f);
  return run_info(inf);
}

const mcpp::cli::Register reg{"data", "Megatron indexed datasets: preprocess (tokenize text), info", &run_data};

}  // namespace
