// Training arguments: a TOML recipe (--config FILE) overridden by Megatron-LM-named flags.
//
// Precedence: built-in defaults < TOML file < command-line flags. The result is finalize()d and
// validate()d before it is returned (validate_for_training, which wants --data-path, is the trainer's).
//
// TOML layout — sections named after the Config structs, keys = the struct field names (snake_case,
// Megatron's flag names with '-' -> '_'), enums as Megatron's strings:
//   [model]     num_layers = 4   hidden_size = 128   normalization = "RMSNorm"   swiglu = true ...
//   [parallel]  tensor_model_parallel_size = 2 ...
//   [training]  micro_batch_size = 8   train_iters = 500 ...
//   [optimizer] lr = 1e-3   lr_decay_style = "cosine" ...
//   [data]      data_path = ["data/fortunes_text_document"]   split = "98,2,0" ...
// Unknown sections/keys and wrong types are errors naming "FILE: section.key". Flags with no TOML
// spelling (--disable-bias-linear) map to the field they set (model.add_bias_linear = false).
//
// Errors: unknown flags and malformed flag values are CLI::ParseError (CLI11); invalid values and
// combinations are mcpp::Error with one line naming the field. The CLI prints either as "error: ..."
// and exits with 2.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "mcpp/training/config.h"

namespace CLI {
class App;
}

namespace mcpp {

// args: the flags after the subcommand (argv[2:] of `mcpp train ...`).
Config parse_train_args(const std::vector<std::string>& args);

// Lower level pieces, for commands that add their own flags (generate, forward):
// registers every training flag on `app`, writing into `cfg` (only flags that are given write).
void add_train_flags(CLI::App& app, Config& cfg, std::string& config_file);
// Reads a TOML recipe into `cfg` (keys present override, others stay). Errors name the file. Returns the keys of the
// file's [training] table (parse_train_args resolves train_iters against train_samples with them).
std::set<std::string> load_toml_config(const std::string& path, Config& cfg);
// The `--config FILE` value in args (also --config=FILE), or "" when absent.
std::string find_config_flag(const std::vector<std::string>& args);

// Megatron-style listing of every field, sorted by name:
//   ------------------------ arguments ------------------------
//     hidden_size ..................................... 128
//   -------------------- end of arguments ---------------------
std::string format_args(const Config& cfg);

}  // namespace mcpp
