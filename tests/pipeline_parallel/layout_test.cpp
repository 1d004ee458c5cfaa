// Layer placement (src/mcpp/pipeline_parallel/layout.h): even split, Megatron's first/last uneven split,
// virtual stages (expected offsets from Megatron's get_layer_offset formulas worked by hand), the layout
// string (parser compared with Megatron's regex-based parse_str_to_list run by
// tests/oracle/pipeline/megatron_schedule.py --parse), and every error naming the flag / position.
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/pipeline_parallel/layout.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/transformer/transformer_config.h"
#include "tests/oracle/oracle_python.h"

namespace mcpp::pipeline_parallel {
namespace {

using Layers = std::vector<int64_t>;

Layers range(int64_t lo, int64_t hi) {
  Layers v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

void expect_stage(const PipelineLayout& l, int64_t r, int64_t v, const Layers& layers, bool pre, bool post) {
  const StageLayers& s = l.at(r, v);
  EXPECT_EQ(s.layers, layers) << "rank " << r << " vp " << v << "\n" << to_string(l);
  EXPECT_EQ(s.pre_process, pre) << "rank " << r << " vp " << v;
  EXPECT_EQ(s.post_process, post) << "rank " << r << " vp " << v;
}

void expect_error(const LayoutOptions& o, std::initializer_list<const char*> needles) {
  try {
    make_pipeline_layout(o);
    ADD_FAILURE() << "no error for layout '" << o.pipeline_model_parallel_layout << "'";
  } catch (const Error& e) {
    for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(PipelineLayout, EvenSplit) {
  const PipelineLayout l = make_pipeline_layout({.num_layers = 8, .pipeline_model_parallel_size = 4});
  EXPECT_EQ(l.virtual_pipeline_model_parallel_size, 1);
  for (int64_t r = 0; r < 4; ++r) expect_stage(l, r, 0, range(2 * r, 2 * r + 2), r == 0, r == 3);
  const PipelineLayout one = make_pipeline_layout({.num_layers = 3, .pipeline_model_parallel_size = 1});
  expect_stage(one, 0, 0, range(0, 3), true, true);
  expect_error({.num_layers = 7, .pipeline_model_parallel_size = 2}, {"num_layers=7", "pipeline_model_parallel_size=2"});
}

TEST(PipelineLayout, FirstLastUneven) {
  PipelineLayout l = make_pipeline_layout({.num_layers = 10,
                                           .pipeline_model_parallel_size = 4,
                                           .decoder_first_pipeline_num_layers = 1,
                                           .decoder_last_pipeline_num_layers = 3});
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, range(1, 4), false, false);
  expect_stage(l, 2, 0, range(4, 7), false, false);
  expect_stage(l, 3, 0, range(7, 10), false, true);
  l = make_pipeline_layout({.num_layers = 9, .pipeline_model_parallel_size = 3, .decoder_first_pipeline_num_layers = 1});
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, range(1, 5), false, false);
  expect_stage(l, 2, 0, range(5, 9), false, true);
  l = make_pipeline_layout({.num_layers = 6, .pipeline_model_parallel_size = 2, .decoder_last_pipeline_num_layers = 2});
  expect_stage(l, 0, 0, range(0, 4), true, false);
  expect_stage(l, 1, 0, range(4, 6), false, true);

  expect_error({.num_layers = 10,
                .pipeline_model_parallel_size = 4,
                .decoder_first_pipeline_num_layers = 1,
                .decoder_last_pipeline_num_layers = 2},
               {"7 layers left", "decoder_first_pipeline_num_layers=1", "2 remaining pipeline stages"});
  expect_error({.num_layers = 8,
                .pipeline_model_parallel_size = 2,
                .decoder_first_pipeline_num_layers = 3,
                .decoder_last_pipeline_num_layers = 3},
               {"must equal num_layers=8", "no middle stage"});
  expect_error({.num_layers = 4,
                .pipeline_model_parallel_size = 2,
                .decoder_first_pipeline_num_layers = 3,
                .decoder_last_pipeline_num_layers = 3},
               {"exceed num_layers=4"});
  expect_error({.num_layers = 4, .pipeline_model_parallel_size = 1, .decoder_first_pipeline_num_layers = 2},
               {"need pipeline_model_parallel_size > 1"});
}

// Megatron-Core's get_num_layers_to_build with account_for_embedding/loss_in_pipeline_split: L (+1) (+1)
// slots split evenly over pp * V stages, the first (last) stage building one decoder layer fewer.
TEST(PipelineLayout, EmbeddingAndLossCountAsLayers) {
  LayoutOptions o{.num_layers = 8, .pipeline_model_parallel_size = 3, .account_for_embedding_in_pipeline_split = true};
  PipelineLayout l = make_pipeline_layout(o);
  expect_stage(l, 0, 0, range(0, 2), true, false);  // 9 slots / 3: E + 2 layers, 3, 3
  expect_stage(l, 1, 0, range(2, 5), false, false);
  expect_stage(l, 2, 0, range(5, 8), false, true);
  o = {.num_layers = 8, .pipeline_model_parallel_size = 3, .account_for_loss_in_pipeline_split = true};
  l = make_pipeline_layout(o);
  expect_stage(l, 0, 0, range(0, 3), true, false);
  expect_stage(l, 1, 0, range(3, 6), false, false);
  expect_stage(l, 2, 0, range(6, 8), false, true);
  o = {.num_layers = 6,
       .pipeline_model_parallel_size = 4,
       .account_for_embedding_in_pipeline_split = true,
       .account_for_loss_in_pipeline_split = true};
  l = make_pipeline_layout(o);  // 8 slots / 4: 1, 2, 2, 1
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, range(1, 3), false, false);
  expect_stage(l, 2, 0, range(3, 5), false, false);
  expect_stage(l, 3, 0, {5}, false, true);
  // virtual stages (model order vp-major): 16 slots / (2 x 2) = 4 per stage, less one on the first and last
  for (const LayoutOptions& v : {LayoutOptions{.num_layers = 14,
                                               .pipeline_model_parallel_size = 2,
                                               .num_virtual_stages_per_pipeline_rank = 2,
                                               .account_for_embedding_in_pipeline_split = true,
                                               .account_for_loss_in_pipeline_split = true},
                                 LayoutOptions{.num_layers = 14,
                                               .pipeline_model_parallel_size = 2,
                                               .num_layers_per_virtual_pipeline_stage = 4,
                                               .account_for_embedding_in_pipeline_split = true,
                                               .account_for_loss_in_pipeline_split = true}}) {
    l = make_pipeline_layout(v);
    ASSERT_EQ(l.virtual_pipeline_model_parallel_size, 2);
    expect_stage(l, 0, 0, range(0, 3), true, false);
    expect_stage(l, 1, 0, range(3, 7), false, false);
    expect_stage(l, 0, 1, range(7, 11), false, false);
    expect_stage(l, 1, 1, range(11, 14), false, true);
  }
  // 1 slot per stage: the first stage holds the embedding alone (Megatron allows zero layers there)
  l = make_pipeline_layout({.num_layers = 3, .pipeline_model_parallel_size = 4,
                            .account_for_embedding_in_pipeline_split = true});
  expect_stage(l, 0, 0, {}, true, false);
  expect_stage(l, 3, 0, {2}, false, true);

  expect_error({.num_layers = 7,
                .pipeline_model_parallel_size = 2,
                .account_for_embedding_in_pipeline_split = true,
                .account_for_loss_in_pipeline_split = true},
               {"num_layers=7 + the embedding + the loss = 9 layer slots", "pipeline_model_parallel_size=2"});
  expect_error({.num_layers = 8,
                .pipeline_model_parallel_size = 3,
                .decoder_first_pipeline_num_layers = 2,
                .account_for_embedding_in_pipeline_split = true},
               {"cannot be combined with decoder_first_pipeline_num_layers"});
  expect_error({.num_layers = 8,
                .pipeline_model_parallel_size = 2,
                .account_for_loss_in_pipeline_split = true,
                .pipeline_model_parallel_layout = "E,t*4|t*4,L"},
               {"drop account_for_embedding_in_pipeline_split"});
  expect_error({.num_layers = 10,
                .pipeline_model_parallel_size = 2,
                .num_layers_per_virtual_pipeline_stage = 4,
                .account_for_embedding_in_pipeline_split = true,
                .account_for_loss_in_pipeline_split = true},
               {"6 layer slots per pipeline stage", "num_layers_per_virtual_pipeline_stage=4"});
}

TEST(PipelineLayout, VirtualStages) {
  // Megatron: offset = vp * (L / V) + rank * (L / pp) / V.
  PipelineLayout l =
      make_pipeline_layout({.num_layers = 8, .pipeline_model_parallel_size = 2, .num_layers_per_virtual_pipeline_stage = 2});
  EXPECT_EQ(l.virtual_pipeline_model_parallel_size, 2);
  expect_stage(l, 0, 0, {0, 1}, true, false);
  expect_stage(l, 1, 0, {2, 3}, false, false);
  expect_stage(l, 0, 1, {4, 5}, false, false);
  expect_stage(l, 1, 1, {6, 7}, false, true);
  l = make_pipeline_layout({.num_layers = 8, .pipeline_model_parallel_size = 4, .num_virtual_stages_per_pipeline_rank = 2});
  for (int64_t v = 0; v < 2; ++v) {
    for (int64_t r = 0; r < 4; ++r) expect_stage(l, r, v, {4 * v + r}, r == 0 && v == 0, r == 3 && v == 1);
  }
  // Uneven + virtual (Megatron's interleaved uneven offset: vp * total_virtual_chunks + first_chunk +
  // (rank - 1) * middle_chunk): L=12, pp=3, first=2, last=2, V=2 -> per chunk 1 | 4 | 1, 6 per vp.
  l = make_pipeline_layout({.num_layers = 12,
                            .pipeline_model_parallel_size = 3,
                            .num_virtual_stages_per_pipeline_rank = 2,
                            .decoder_first_pipeline_num_layers = 2,
                            .decoder_last_pipeline_num_layers = 2});
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, range(1, 5), false, false);
  expect_stage(l, 2, 0, {5}, false, false);
  expect_stage(l, 0, 1, {6}, false, false);
  expect_stage(l, 1, 1, range(7, 11), false, false);
  expect_stage(l, 2, 1, {11}, false, true);

  expect_error({.num_layers = 8, .pipeline_model_parallel_size = 2, .num_layers_per_virtual_pipeline_stage = 3},
               {"num_layers_per_virtual_pipeline_stage=3", "4 layers per pipeline stage"});
  expect_error({.num_layers = 11,
                .pipeline_model_parallel_size = 3,
                .num_virtual_stages_per_pipeline_rank = 2,
                .decoder_first_pipeline_num_layers = 1,
                .decoder_last_pipeline_num_layers = 2},
               {"pipeline rank 0 holds 1 layers", "2 virtual stages"});
  expect_error({.num_layers = 4, .pipeline_model_parallel_size = 1, .num_virtual_stages_per_pipeline_rank = 2},
               {"need pipeline_model_parallel_size > 1"});
  expect_error({.num_layers = 8,
                .pipeline_model_parallel_size = 2,
                .num_layers_per_virtual_pipeline_stage = 2,
                .num_virtual_stages_per_pipeline_rank = 2},
               {"set only one"});
}

TEST(PipelineLayout, LayoutString) {
  PipelineLayout l = make_pipeline_layout(
      {.num_layers = 8, .pipeline_model_parallel_size = 4, .pipeline_model_parallel_layout = "E|t*3|t*3|t*2,L"});
  expect_stage(l, 0, 0, {}, true, false);
  expect_stage(l, 1, 0, {0, 1, 2}, false, false);
  expect_stage(l, 2, 0, {3, 4, 5}, false, false);
  expect_stage(l, 3, 0, {6, 7}, false, true);
  // pp * V entries: entry k is (vp k / pp, rank k % pp).
  l = make_pipeline_layout({.num_layers = 6, .pipeline_model_parallel_size = 2, .pipeline_model_parallel_layout = "Et|tt|tt|tL"});
  EXPECT_EQ(l.virtual_pipeline_model_parallel_size, 2);
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, {1, 2}, false, false);
  expect_stage(l, 0, 1, {3, 4}, false, false);
  expect_stage(l, 1, 1, {5}, false, true);
  // MTP depths with the loss: placed as if absent (the last stage builds them with the output layer)
  l = make_pipeline_layout({.num_layers = 3,
                            .pipeline_model_parallel_size = 2,
                            .pipeline_model_parallel_layout = "Et|t,t,m*2,L",
                            .mtp_num_layers = 2});
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, {1, 2}, false, true);
  // Groups repeat across '|'.
  l = make_pipeline_layout(
      {.num_layers = 4, .pipeline_model_parallel_size = 3, .pipeline_model_parallel_layout = "E(t|)*2,ttL"});
  expect_stage(l, 0, 0, {0}, true, false);
  expect_stage(l, 1, 0, {1}, false, false);
  expect_stage(l, 2, 0, {2, 3}, false, true);
  // A matching virtual-stage option is accepted, a different one is an error.
  EXPECT_NO_THROW(make_pipeline_layout({.num_layers = 6,
                                        .pipeline_model_parallel_size = 2,
                                        .num_virtual_stages_per_pipeline_rank = 2,
                                        .pipeline_model_parallel_layout = "Et|tt|tt|tL"}));
}

TEST(PipelineLayout, FromConfig) {
  TransformerConfig model;
  model.num_layers = 8;
  ParallelConfig par;
  par.pipeline_model_parallel_size = 2;
  par.num_layers_per_virtual_pipeline_stage = 2;
  const LayoutOptions o = layout_options(model, par);
  EXPECT_EQ(o.num_layers, 8);
  EXPECT_EQ(o.decoder_first_pipeline_num_layers, -1);
  EXPECT_EQ(make_pipeline_layout(o).virtual_pipeline_model_parallel_size, 2);
  par.num_layers_per_virtual_pipeline_stage = 0;
  par.pipeline_model_parallel_layout = "E|t*3|t*3|t*2,L";
  par.pipeline_model_parallel_size = 4;
  EXPECT_EQ(make_pipeline_layout(layout_options(model, par)).at(3, 0).layers, (Layers{6, 7}));
  par.pipeline_model_parallel_layout.clear();
  par.pipeline_model_parallel_size = 3;
  par.account_for_loss_in_pipeline_split = true;
  EXPECT_TRUE(par.custom_pipeline_layout()) << "8 layers over 3 stages: the layout checks the counts";
  EXPECT_EQ(make_pipeline_layout(layout_options(model, par)).at(2, 0).layers, (Layers{6, 7}));
}

std::string oracle_parse(const std::string& layout) {
  const std::string cmd = mcpp::test::oracle_python() + MCPP_SOURCE_DIR +
                          "/tests/oracle/pipeline/megatron_schedule.py --parse '" + layout + "'";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(f), 0) << layout;
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

TEST(PipelineLayout, ParserMatchesMegatronRegexParser) {
  const char* cases[] = {"E|t*3|t*3|t*2,L", "Ettt|(tt|)*29,m|L", "Et|tt|tt|tL", "E(t|)*2t,L", "(|t)*2,E",
                         "E,t*10|t*0|L",    "E|*3tL",            "Et*12|t|(t*2|)*3L"};
  for (const char* c : cases) {
    std::string mine;
    const auto stages = parse_pipeline_layout(c);
    for (size_t i = 0; i < stages.size(); ++i) {
      if (i) mine += '|';
      for (LayoutItem it : stages[i]) {
        mine += it == LayoutItem::Embedding ? 'E' : it == LayoutItem::Loss ? 'L' : it == LayoutItem::Decoder ? 't' : 'm';
      }
    }
    EXPECT_EQ(mine, oracle_parse(c)) << c;
  }
}

void expect_layout_error(const std::string& layout, int64_t pp, int64_t num_layers,
                         std::initializer_list<const char*> needles) {
  expect_error({.num_layers = num_layers, .pipeline_model_parallel_size = pp, .pipeline_model_parallel_layout = layout},
               needles);
}

TEST(PipelineLayout, LayoutStringErrors) {
  expect_layout_error("E|t*3|x|L", 4, 3, {"invalid layer character 'x' at position 6"});
  expect_layout_error("E|(t|t", 2, 2, {"'(' at position 2 is never closed"});
  expect_layout_error("E|t*|L", 3, 1, {"'*' at position 3 must be followed by a repeat count"});
  expect_layout_error("*2E|L", 2, 1, {"'*' at position 0 has nothing to repeat"});
  expect_layout_error("E|t)|L", 3, 1, {"')' at position 3 has no matching '('"});
  expect_layout_error("E|((t)*2)*2|L", 3, 4, {"nested '(' at position 3"});
  expect_layout_error("E|()*2|L", 3, 1, {"empty group '()' at position 2"});
  expect_layout_error("E|(t)|L", 3, 1, {"group '(...)' at position 2 must be followed by '*<count>'"});
  expect_layout_error("E|t*2*3|L", 3, 6, {"'*' at position 5 follows another repetition"});
  expect_layout_error("t|E|tL", 3, 2, {"first layer must be the embedding"});
  expect_layout_error("E|t|Lt", 3, 2, {"last layer must be the loss"});
  expect_layout_error("EE|tL", 2, 1, {"'E' must appear exactly once"});
  expect_layout_error("E|tL|L", 3, 1, {"'L' must appear exactly once"});
  // MTP depths 'm': as many as mtp_num_layers, in the stage of 'L'
  expect_layout_error("E|tm|tL", 3, 2, {"has 1 MTP layers 'm' but mtp_num_layers=0"});
  expect_error({.num_layers = 2, .pipeline_model_parallel_size = 3, .pipeline_model_parallel_layout = "E|ttm|L",
                .mtp_num_layers = 1},
               {"the MTP layers 'm' must sit in the stage of the loss 'L'"});
  expect_error({.num_layers = 2, .pipeline_model_parallel_size = 2, .pipeline_model_parallel_layout = "Et|tmL",
                .mtp_num_layers = 2},
               {"has 1 MTP layers 'm' but mtp_num_layers=2"});
  expect_error({.num_layers = 2, .pipeline_model_parallel_size = 2, .pipeline_model_parallel_layout = "Et|mtmL",
                .mtp_num_layers = 2},
               {"the MTP layers 'm' must follow every transformer layer 't'"});
  expect_layout_error("Et|tL", 2, 3, {"has 2 transformer layers 't' but num_layers=3"});
  expect_layout_error("E|t*3|t*3|t*2,L", 3, 8, {"has 4 stages, not a multiple of pipeline_model_parallel_size=3"});
  expect_layout_error("Et|t*999999999L", 2, 2, {"too large"});
  expect_error({.num_layers = 6,
                .pipeline_model_parallel_size = 2,
                .num_virtual_stages_per_pipeline_rank = 3,
                .pipeline_model_parallel_layout = "Et|tt|tt|tL"},
               {"gives 2 virtual stages", "asks for 3"});
  expect_error({.num_layers = 2,
                .pipeline_model_parallel_size = 2,
                .decoder_first_pipeline_num_layers = 1,
                .pipeline_model_parallel_layout = "Et|tL"},
               {"cannot be combined"});
}

}  // namespace
}  // namespace mcpp::pipeline_parallel
