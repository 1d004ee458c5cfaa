// The HF key mapping (hf_rules.h) driven by the model's own tensor list, for every format: each tensor of a model the
// format writes has a rule and HF names no other tensor has; the export writes exactly those names (plus the format's
// documented copies), and its import gives back exactly the model's keys, in the model's order; a parameter without
// a rule is one error line naming it.
#include "mcpp/dist_checkpointing/hf_rules.h"

#include <gtest/gtest.h>

#include <set>

#include "core/core_test_util.h"
#include "dist_checkpointing/hf_test_util.h"
#include "mcpp/dist_checkpointing/hf_deepseek.h"

namespace mcpp::dist_checkpointing {
namespace {
using namespace testing;
using mcpp::testing::error_of;

const HfFormat kFormats[] = {HfFormat::Gpt2,     HfFormat::Llama,    HfFormat::Qwen2,      HfFormat::Qwen3,
                             HfFormat::Mixtral,  HfFormat::Qwen2Moe, HfFormat::Qwen3Moe,   HfFormat::DeepseekV2,
                             HfFormat::DeepseekV3};

bool is_deepseek(HfFormat f) { return f == HfFormat::DeepseekV2 || f == HfFormat::DeepseekV3; }

ModelDims dims_of(const Config& c, HfFormat f) {
  return is_deepseek(f) ? deepseek_dims_from_config(c.to_json(), "test").m : model_dims_from_config(c.to_json(), "test");
}

TEST(HfRules, AParameterWithoutARuleIsANamedError) {
  for (const HfFormat f : kFormats) {
    const Config c = hf_family_config(f);
    auto tensors = model_tensors_from_config(c.to_json());
    tensors.insert(tensors.begin() + 3, {"decoder.layers.3.foo", Shape{4}});
    EXPECT_EQ(error_of([&] { hf_pieces(tensors, f, hf_layout(dims_of(c, f))); }),
              fmt::format("no HF name for parameter 'decoder.layers.3.foo' ({})", hf_format_name(f)));
  }
}

TEST(HfRules, ExportWritesTheModelsTensorsAndImportGivesThemBack) {
  for (const HfFormat f : kFormats) {
    SCOPED_TRACE(hf_format_name(f));
    const Config c = hf_family_config(f);
    const ModelDims d = dims_of(c, f);
    const auto tensors = model_tensors_from_config(c.to_json());
    std::set<std::string> mapped;  // every HF name of the model's tensors, each from one tensor only
    for (const HfPiece& p : hf_pieces(tensors, f, hf_layout(d)))
      for (const auto& [name, shape] : p.hf) EXPECT_TRUE(mapped.insert(name).second) << name << " twice";
    if (is_deepseek(f))  // the MTP depths' copies of the embedding and the output head
      for (const auto& [copy, of] : deepseek_copies(deepseek_dims_from_config(c.to_json(), "test")))
        mapped.insert(copy);
    TempDir dir;
    save_checkpoint(dir / "ck", random_checkpoint(c.to_json(), tensors, d.vocab, 1, 3));
    export_hf(CheckpointReader(dir / "ck"), f, dir / "hf");
    std::set<std::string> written;
    for (const auto& e : read_safetensors_header(dir / "hf/model.safetensors").entries) written.insert(e.name);
    EXPECT_EQ(written, mapped);
    const CheckpointContents back = import_hf(dir / "hf", f);
    ASSERT_EQ(back.tensors.size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) EXPECT_EQ(back.tensors[i].key, tensors[i].first);
  }
}

}  // namespace
}  // namespace mcpp::dist_checkpointing
