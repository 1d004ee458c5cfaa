// The `mcpp data` subcommands that live in their own files (apps/mcpp/data.cpp dispatches):
//   preprocess (apps/mcpp/data_preprocess.cpp): Megatron's tools/preprocess_data.py with --workers threads.
#pragma once
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "apps/mcpp/tokenizer_flags.h"

namespace mcpp::cli {

struct PreprocessFlags {
  std::string input, output_prefix;
  std::vector<std::string> json_keys{"text"};
  bool append_eod = false;
  int workers = 1;
  int64_t log_interval = 1000;
  TokenizerFlags tok;
};

void add_preprocess_flags(CLI::App& pre, PreprocessFlags& f);
int run_preprocess(const PreprocessFlags& f);

}  // namespace mcpp::cli
