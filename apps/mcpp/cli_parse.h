// parse_token_ids(text, limit, bad): the whitespace-separated token ids of `text` (`mcpp forward --tokens`,
// `generate --prompt-ids`, `tokenize --decode`); a word that is not an integer in [0, limit) goes to
// bad(word, value), value empty when the word is no integer at all; `bad` must fail().
// parse_args(app, args): CLI11 parsing of a subcommand's flags (args = argv[2:]) with `--help` / `-h` printing
// the help of the (sub)command asked about and ending the command with exit code 0 (CLI::Success, which
// main() turns into 0). Every command parses through it, so no `--help` is silent.
#pragma once
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace mcpp::cli {

template <class Bad>
std::vector<int32_t> parse_token_ids(const std::string& text, int64_t limit, Bad&& bad) {
  std::istringstream words(text);
  std::vector<int32_t> ids;
  for (std::string word; words >> word;) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size()) bad(word, std::optional<long long>{});
    if (v < 0 || v >= limit) bad(word, std::optional<long long>{v});
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

inline void parse_args(CLI::App& app, const std::vector<std::string>& args) {
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());  // delegates to the subcommand that was asked (`ckpt verify --help`)
    throw CLI::Success();
  } catch (const CLI::CallForAllHelp&) {
    fmt::print("{}", app.help("", CLI::AppFormatMode::All));
    throw CLI::Success();
  }
}

}  // namespace mcpp::cli
