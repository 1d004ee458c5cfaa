// mcpp ckpt info|verify|export|import — inspect, check and convert checkpoints (docs/CHECKPOINT_FORMAT.md).
//   mcpp ckpt info   --load DIR [--iteration N] [--tensors]
//   mcpp ckpt verify --load DIR [--iteration N]          re-reads every tensor, checks xxh3 + headers
//   mcpp ckpt export --load DIR [--iteration N] --format hf-gpt2|hf-llama --output HFDIR
//   mcpp ckpt import --input HFDIR --format hf-gpt2|hf-llama --save DIR
// --load takes a save directory (the tracker picks the iteration unless --iteration) or an iter_N dir.
// verify prints one line per bad tensor and fails (error line, exit code 2) when any is bad.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/hf_convert.h"

namespace {
namespace dc = mcpp::dist_checkpointing;

int info(const std::string& load, int64_t iteration, bool tensors) {
  dc::CheckpointReader r(load, iteration);
  uint64_t bytes = 0;
  for (const auto& e : r.manifest().tensors) bytes += e.byte_length;
  fmt::print("checkpoint  {}\niteration   {}\ntensors     {} ({:.3f} MB)\n", r.dir(), r.iteration(),
             r.manifest().tensors.size(), static_cast<double>(bytes) / 1e6);
  for (const auto& [k, v] : r.meta().items()) {
    if (k == "config" && v.is_object() && v.contains("model")) {
      const auto& m = v["model"];
      fmt::print("config      layers={} hidden={} heads={} groups={} ffn={} vocab={} (padded {}) {} {}{}\n",
                 m.value("num_layers", 0), m.value("hidden_size", 0), m.value("num_attention_heads", 0),
                 m.value("num_query_groups", 0), m.value("ffn_hidden_size", 0), m.value("vocab_size", 0),
                 m.value("padded_vocab_size", 0), m.value("normalization", "?"),
                 m.value("position_embedding_type", "?"), m.value("swiglu", false) ? " swiglu" : "");
    } else {
      std::string s = v.dump();
      fmt::print("meta.{:<7} {}\n", k, s.size() > 100 ? s.substr(0, 97) + "..." : s);
    }
  }
  if (tensors) {
    for (const auto& e : r.manifest().tensors) {
      fmt::print("  {:<60} {:<5} {:<16} {} @{} {}\n", e.key, mcpp::dtype_safetensors_name(e.dtype),
                 mcpp::shape_str(e.global_shape), e.file, e.byte_offset, dc::xxh3_hex(e.xxh3));
    }
  }
  return 0;
}

int verify(const std::string& load, int64_t iteration) {
  dc::CheckpointReader r(load, iteration);
  std::vector<std::string> bad;
  uint64_t bytes = 0;
  for (const auto& e : r.manifest().tensors) {
    try {
      r.verify(e.key);
      bytes += e.byte_length;
    } catch (const mcpp::Error& err) {
      fmt::print(stderr, "BAD {}: {}\n", e.key, err.what());
      bad.push_back(e.key);
    }
  }
  if (!bad.empty()) {
    mcpp::fail("verify {}: {} of {} tensors failed (first: '{}')", r.dir(), bad.size(),
               r.manifest().tensors.size(), bad.front());
  }
  fmt::print("OK {}: {} tensors, {} bytes verified\n", r.dir(), r.manifest().tensors.size(), bytes);
  return 0;
}

int run_ckpt(const std::vector<std::string>& args) {
  CLI::App app{"mcpp ckpt: inspect, verify and convert checkpoints", "mcpp ckpt"};
  app.require_subcommand(1);
  std::string load, output, input, save, format;
  int64_t iteration = -1;
  bool tensors = false;
  auto add_load = [&](CLI::App* s) {
    s->add_option("--load", load, "save directory (uses latest_checkpointed_iteration.txt) or iter_N dir")
        ->required();
    s->add_option("--iteration", iteration, "iteration to read from a save directory");
  };
  CLI::App* s_info = app.add_subcommand("info", "print iteration, config and tensors of a checkpoint");
  add_load(s_info);
  s_info->add_flag("--tensors", tensors, "list every tensor (key, dtype, shape, file, offset, xxh3)");
  CLI::App* s_verify = app.add_subcommand("verify", "re-read every tensor and check its xxh3 and header");
  add_load(s_verify);
  CLI::App* s_export = app.add_subcommand("export", "write a HuggingFace model dir (config.json + F32 safetensors)");
  add_load(s_export);
  s_export->add_option("--format", format, "hf-gpt2 | hf-llama")->required();
  s_export->add_option("--output", output, "output directory")->required();
  CLI::App* s_import = app.add_subcommand("import", "convert a HuggingFace model dir into a checkpoint (iteration 0)");
  s_import->add_option("--input", input, "HF model directory (config.json + safetensors)")->required();
  s_import->add_option("--format", format, "hf-gpt2 | hf-llama")->required();
  s_import->add_option("--save", save, "save directory for the checkpoint")->required();

  std::vector<std::string> rev(args.rbegin(), args.rend());  // CLI11 parses a reversed vector
  try {
    app.parse(rev);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  }
  if (s_info->parsed()) return info(load, iteration, tensors);
  if (s_verify->parsed()) return verify(load, iteration);
  if (s_export->parsed()) {
    dc::HfFormat f = dc::parse_hf_format(format);
    dc::CheckpointReader r(load, iteration);
    dc::export_hf(r, f, output);
    fmt::print("exported {} (iteration {}) as {} to {}\n", r.dir(), r.iteration(), format, output);
    return 0;
  }
  dc::HfFormat f = dc::parse_hf_format(format);
  dc::CheckpointContents c = dc::import_hf(input, f);
  std::string dir = dc::save_checkpoint(save, c);
  fmt::print("imported {} ({}, {} tensors) to {}\n", input, format, c.tensors.size(), dir);
  return 0;
}

const mcpp::cli::Register reg{"ckpt", "checkpoints: info | verify | export (HF) | import (HF)", &run_ckpt};

}  // namespace
