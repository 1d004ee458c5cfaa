// mcpp tokenize — a tokenizer on stdin (Megatron's tokenizer flags, apps/mcpp/tokenizer_flags.h).
//   mcpp tokenize [--tokenizer-type T --tokenizer-model M | --vocab-file V --merge-file M] [--append-eod]
//     reads all of stdin, prints the token ids (MegatronTokenizer::tokenize: what preprocess stores for a document,
//     e.g. with Llama's BOS) space-separated on one line.
//   mcpp tokenize --decode
//     reads whitespace-separated token ids from stdin, writes their text (detokenize; no newline added).
// Errors (bad files, bad ids, unsupported tokenizer type) -> mcpp::Error -> "error: ..." and exit 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "apps/mcpp/tokenizer_flags.h"
#include "mcpp/core/error.h"

namespace {

std::string read_stdin() {
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), stdin)) > 0) data.append(buf, n);
  if (std::ferror(stdin)) mcpp::fail("tokenize: cannot read stdin");
  return data;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  return mcpp::cli::parse_token_ids(text, int64_t{INT32_MAX} + 1, [](const std::string& word, auto) {
    mcpp::fail("tokenize --decode: '{}' is not a token id (expected non-negative integers)", word);
  });
}

int run_tokenize(const std::vector<std::string>& args) {
  CLI::App app{"mcpp tokenize: token ids of stdin (or text of ids with --decode)", "mcpp tokenize"};
  mcpp::cli::TokenizerFlags flags;
  mcpp::cli::add_tokenizer_flags(app, flags);
  bool append_eod = false, decode = false;
  app.add_flag("--append-eod", append_eod, "append the end-of-document id (GPT-2: <|endoftext|> = 50256)");
  app.add_flag("--decode", decode, "read token ids from stdin and print their text");
  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  }
  if (decode && append_eod) mcpp::fail("tokenize: --append-eod and --decode exclude each other");
  const auto tok = mcpp::build_tokenizer(flags);
  std::string in = read_stdin();
  if (decode) {
    std::string text = tok->detokenize(parse_ids(in));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::vector<int32_t> ids = tok->tokenize(in);
  if (append_eod) ids.push_back(tok->eod());
  fmt::memory_buffer out;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out.push_back(' ');
    fmt::format_to(std::back_inserter(out), "{}", ids[i]);
  }
  out.push_back('\n');
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

const mcpp::cli::Register reg{"tokenize", "token ids of stdin (--decode: text of ids); GPT-2, HF, SentencePiece",
                              &run_tokenize};

}  // namespace
