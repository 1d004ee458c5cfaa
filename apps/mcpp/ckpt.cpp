// mcpp ckpt info|verify|convert|export|import — inspect, check and convert checkpoints
// (docs/CHECKPOINT_FORMAT.md). DIR may be given positionally or as --load DIR.
//   mcpp ckpt info   DIR [--iteration N] [--tensors]     layout, iteration, totals, one line per logical key
//                                                        (dtype, global shape, shards, bytes); --tensors: per shard
//   mcpp ckpt verify DIR [--iteration N]                 the manifest checksum, completeness against the stored
//                                                        config (training/checkpoint_completeness.h), then every
//                                                        tensor re-read: xxh3 + safetensors header entries
//   mcpp ckpt clean DIR                                  removes what dead jobs left in a save directory (staging,
//                                                        superseded, set-aside and half-deleted directories);
//                                                        refuses a directory a live job holds (retention.h)
//   mcpp ckpt convert DIR --tp T --pp P [--vp V] --output DIR2   offline reshard (training/checkpoint_convert.h)
//   mcpp ckpt export --load DIR [--iteration N] --output HFDIR
//       --format hf-gpt2|hf-llama|hf-mixtral|hf-qwen2|hf-qwen2-moe|hf-qwen3|hf-qwen3-moe|
//         hf-deepseek-v2|hf-deepseek-v3
//   mcpp ckpt import --input HFDIR --format hf-gpt2|hf-llama|hf-mixtral|hf-qwen2|hf-qwen2-moe|hf-qwen3|hf-qwen3-moe|
//         hf-deepseek-v2|hf-deepseek-v3
//       --save DIR
// --load takes a save directory (the tracker picks the iteration unless --iteration N >= 0) or an iter_N dir.
// verify prints one line per bad tensor and fails (error line, exit code 2) when any is bad.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/mcpp/cli_parse.h"
#include "apps/mcpp/command.h"
#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/checkpoint.h"
#include "mcpp/dist_checkpointing/hf_convert.h"
#include "mcpp/dist_checkpointing/retention.h"
#include "mcpp/training/checkpoint_completeness.h"
#include "mcpp/training/checkpoint_convert.h"

#include <limits>
#include <map>

namespace {
namespace dc = mcpp::dist_checkpointing;

int info(const std::string& load, int64_t iteration, bool tensors) {
  dc::CheckpointReader r(load, iteration);
  struct KeyInfo {
    const dc::ManifestEntry* first = nullptr;
    int64_t shards = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, KeyInfo> by_key;
  uint64_t bytes = 0, model_bytes = 0, optim_bytes = 0;
  for (const auto& e : r.manifest().tensors) {
    KeyInfo& k = by_key[e.key];
    if (!k.first) k.first = &e;
    ++k.shards;
    k.bytes += e.byte_length;
    bytes += e.byte_length;
    (e.key.rfind("optimizer.", 0) == 0 ? optim_bytes : model_bytes) += e.byte_length;
  }
  fmt::print("checkpoint  {}\niteration   {}\nformat      version {}\n", r.dir(), r.iteration(),
             r.manifest().format_version);
  if (r.meta().contains("parallel")) {
    const auto& p = r.meta()["parallel"];
    fmt::print("layout      tp={} pp={} vp={} dp={} cp={} world={} distributed_optimizer={}\n", p.value("tp", 1),
               p.value("pp", 1), p.value("vp", 1), p.value("dp", 1), p.value("cp", 1), p.value("world_size", 1),
               p.value("distributed_optimizer", false));
  } else {
    fmt::print("layout      (not recorded: single-writer checkpoint)\n");
  }
  fmt::print("totals      {} logical tensors, {} shards, {} bytes ({:.3f} MB; model {}, optimizer {})\n",
             by_key.size(), r.manifest().tensors.size(), bytes, static_cast<double>(bytes) / 1e6, model_bytes,
             optim_bytes);
  for (const auto& [k, v] : r.meta().items()) {
    if (k == "parallel" || k == "rng_per_rank" || k == "math_fields") continue;
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
  fmt::print("{:<64} {:<5} {:<16} {:>6} {:>12}\n", "key", "dtype", "global_shape", "shards", "bytes");
  for (const std::string& key : r.keys()) {  // manifest order (sorted by key)
    const KeyInfo& k = by_key.at(key);
    fmt::print("{:<64} {:<5} {:<16} {:>6} {:>12}\n", key, mcpp::dtype_safetensors_name(k.first->dtype),
               mcpp::shape_str(k.first->global_shape), k.shards, k.bytes);
  }
  if (tensors) {
    fmt::print("shards:\n");
    for (const auto& e : r.manifest().tensors) {
      fmt::print("  {:<60} {:<5} {:<16} at {:<12} {} @{} {}\n", e.key, mcpp::dtype_safetensors_name(e.dtype),
                 mcpp::shape_str(e.local_shape), mcpp::shape_str(e.global_offset), e.file, e.byte_offset,
                 dc::xxh3_hex(e.xxh3));
    }
  }
  return 0;
}

int verify(const std::string& load, int64_t iteration) {
  dc::CheckpointReader r(load, iteration);           // the manifest: checksum, layout, no aliasing
  const int64_t implied = mcpp::check_checkpoint_complete(r);  // every tensor its stored config implies
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
  const std::vector<std::string> unlisted = r.unlisted_header_entries();
  for (const std::string& u : unlisted)
    fmt::print(stderr, "BAD {}: in a data file's header but not in the manifest\n", u);
  if (!unlisted.empty())
    mcpp::fail("verify {}: {} safetensors header entries are not in the manifest (first: {})", r.dir(), unlisted.size(),
               unlisted.front());
  fmt::print("OK {}: {} tensors ({} shards), {} bytes verified; manifest {}; {}\n", r.dir(), r.keys().size(),
             r.manifest().tensors.size(), bytes,
             r.manifest().format_version >= 3 ? std::string("checksum OK")
                                              : fmt::format("version {} (no checksum)", r.manifest().format_version),
             implied > 0 ? "complete: every tensor its stored config implies is present"
                         : "completeness not checked (meta holds no config)");
  return 0;
}

int run_ckpt(const std::vector<std::string>& args) {
  CLI::App app{"mcpp ckpt: inspect, verify and convert checkpoints", "mcpp ckpt"};
  app.require_subcommand(1);
  std::string load, output, input, save, format;
  constexpr int64_t kLatest = std::numeric_limits<int64_t>::min();  // --iteration not given: the tracker's
  int64_t iteration = kLatest;
  bool tensors = false;
  std::string dir_pos;
  auto add_load = [&](CLI::App* s) {
    s->add_option("dir", dir_pos, "save directory (uses latest_checkpointed_iteration.txt) or iter_N dir");
    s->add_option("--load", load, "the same as the positional DIR");
    s->add_option("--iteration", iteration, "iteration to read from a save directory (>= 0; default: the tracker's)");
  };
  CLI::App* s_info = app.add_subcommand("info", "print iteration, config and tensors of a checkpoint");
  add_load(s_info);
  s_info->add_flag("--tensors", tensors, "list every tensor (key, dtype, shape, file, offset, xxh3)");
  CLI::App* s_verify = app.add_subcommand(
      "verify", "check the manifest checksum, completeness against the stored config, every tensor's xxh3 and header");
  add_load(s_verify);
  CLI::App* s_convert = app.add_subcommand("convert", "offline reshard to another TP / PP / virtual-stage layout");
  add_load(s_convert);
  int64_t tp = 1, pp = 1, vp = 1;
  s_convert->add_option("--tp", tp, "target tensor-model-parallel size")->required();
  s_convert->add_option("--pp", pp, "target pipeline-model-parallel size")->required();
  s_convert->add_option("--vp", vp, "target virtual pipeline stages per rank (default 1)");
  s_convert->add_option("--output", output, "save directory to write the converted checkpoint into")->required();
  const char* formats =
      "hf-gpt2 | hf-llama | hf-mixtral | hf-qwen2 | hf-qwen2-moe | hf-qwen3 | hf-qwen3-moe | hf-deepseek-v2 | hf-deepseek-v3";
  CLI::App* s_export = app.add_subcommand("export", "write a HuggingFace model dir (config.json + F32 safetensors)");
  add_load(s_export);
  s_export->add_option("--format", format, formats)->required();
  s_export->add_option("--output", output, "output directory")->required();
  CLI::App* s_import = app.add_subcommand("import", "convert a HuggingFace model dir into a checkpoint (iteration 0)");
  s_import->add_option("--input", input, "HF model directory (config.json + safetensors)")->required();
  s_import->add_option("--format", format, formats)->required();
  s_import->add_option("--save", save, "save directory for the checkpoint")->required();
  CLI::App* s_clean = app.add_subcommand("clean", "remove what dead jobs left in a save directory (not a live job's)");
  s_clean->add_option("dir", dir_pos, "save directory")->required();

  mcpp::cli::parse_args(app, args);
  if (iteration != kLatest && iteration < 0)
    mcpp::fail("ckpt: --iteration must be >= 0 (got {}); leave it out for the tracker's latest iteration", iteration);
  if (iteration == kLatest) iteration = -1;
  if (!dir_pos.empty() && !load.empty() && dir_pos != load)
    mcpp::fail("ckpt: give the checkpoint directory once (positional '{}' and --load '{}')", dir_pos, load);
  if (load.empty()) load = dir_pos;
  const bool needs_load = s_info->parsed() || s_verify->parsed() || s_convert->parsed() || s_export->parsed();
  if (needs_load && load.empty()) mcpp::fail("ckpt: the checkpoint directory (DIR or --load DIR) is required");
  if (s_info->parsed()) return info(load, iteration, tensors);
  if (s_clean->parsed()) {
    const std::vector<std::string> removed = dc::clean_save_dir(dir_pos);
    for (const std::string& p : removed) fmt::print("removed {}\n", p);
    fmt::print("cleaned {}: {} leftover path(s) removed\n", dir_pos, removed.size());
    return 0;
  }
  if (s_convert->parsed()) {
    const mcpp::ConvertResult r = mcpp::convert_checkpoint(
        {.input = load, .iteration = iteration, .tp = tp, .pp = pp, .vp = vp, .output = output});
    fmt::print("converted {} to tp={} pp={} vp={}: {} ({} ranks, {} bytes read, {} bytes written)\n", load, tp, pp,
               vp, r.dir, r.ranks, r.bytes_read, r.bytes_written);
    return 0;
  }
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

const mcpp::cli::Register reg{"ckpt", "checkpoints: info | verify | clean | convert | export (HF) | import (HF)",
                              &run_ckpt};

}  // namespace
