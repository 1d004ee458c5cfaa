// Layer placement (see layout.h). The layout-string parser keeps each character's position in the
// original string so errors can point at it.
#include "mcpp/parallel_state/parallel_config.h"
#include "mcpp/pipeline_parallel/layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "mcpp/core/error.h"
#include "mcpp/transformer/transformer_config.h"

namespace mcpp::pipeline_parallel {

namespace {

struct PosChar {
  char c;
  size_t pos;  // in the string as given
};

constexpr size_t kMaxExpanded = 1 << 20;  // guards "t*999999999"

// Reads the count after a '*' at s[i] (i = index of '*'). Returns the count and advances i past it.
int64_t read_count(const std::vector<PosChar>& s, size_t& i, const std::string& layout) {
  const size_t star = s[i].pos;
  ++i;
  if (i >= s.size() || s[i].c < '0' || s[i].c > '9') {
    fail("pipeline_model_parallel_layout \"{}\": '*' at position {} must be followed by a repeat count", layout,
         star);
  }
  int64_t n = 0;
  while (i < s.size() && s[i].c >= '0' && s[i].c <= '9') {
    n = n * 10 + (s[i].c - '0');
    if (n > static_cast<int64_t>(kMaxExpanded)) {
      fail("pipeline_model_parallel_layout \"{}\": repeat count at position {} is too large", layout, star + 1);
    }
    ++i;
  }
  return n;
}

void check_size(size_t n, const std::string& layout) {
  if (n > kMaxExpanded) fail("pipeline_model_parallel_layout \"{}\": expands to more than {} items", layout, kMaxExpanded);
}

// Megatron step 1: "(...)*n" -> the group n times (groups do not nest).
std::vector<PosChar> expand_groups(const std::vector<PosChar>& in, const std::string& layout) {
  std::vector<PosChar> out;
  size_t i = 0;
  while (i < in.size()) {
    if (in[i].c == ')') fail("pipeline_model_parallel_layout \"{}\": ')' at position {} has no matching '('", layout, in[i].pos);
    if (in[i].c != '(') {
      out.push_back(in[i++]);
      continue;
    }
    const size_t open = i;
    size_t close = i + 1;
    while (close < in.size() && in[close].c != ')') {
      if (in[close].c == '(') {
        fail("pipeline_model_parallel_layout \"{}\": nested '(' at position {} (groups do not nest)", layout,
             in[close].pos);
      }
      ++close;
    }
    if (close >= in.size()) fail("pipeline_model_parallel_layout \"{}\": '(' at position {} is never closed", layout, in[open].pos);
    if (close == open + 1) fail("pipeline_model_parallel_layout \"{}\": empty group '()' at position {}", layout, in[open].pos);
    size_t j = close + 1;
    if (j >= in.size() || in[j].c != '*') {
      fail("pipeline_model_parallel_layout \"{}\": group '(...)' at position {} must be followed by '*<count>'", layout,
           in[open].pos);
    }
    const int64_t n = read_count(in, j, layout);
    for (int64_t k = 0; k < n; ++k) {
      out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(open + 1), in.begin() + static_cast<std::ptrdiff_t>(close));
      check_size(out.size(), layout);
    }
    i = j;
  }
  return out;
}

// Megatron step 2: "x*n" -> x repeated n times (x any single character, '|' included).
std::vector<PosChar> expand_chars(const std::vector<PosChar>& in, const std::string& layout) {
  std::vector<PosChar> out;
  size_t i = 0;
  bool after_repeat = false;
  while (i < in.size()) {
    if (in[i].c != '*') {
      out.push_back(in[i++]);
      after_repeat = false;
      continue;
    }
    if (out.empty()) fail("pipeline_model_parallel_layout \"{}\": '*' at position {} has nothing to repeat", layout, in[i].pos);
    if (after_repeat) {
      fail("pipeline_model_parallel_layout \"{}\": '*' at position {} follows another repetition", layout, in[i].pos);
    }
    const PosChar x = out.back();
    out.pop_back();
    const int64_t n = read_count(in, i, layout);
    for (int64_t k = 0; k < n; ++k) out.push_back(x);
    check_size(out.size(), layout);
    after_repeat = true;
  }
  return out;
}

const char* item_name(LayoutItem it) {
  switch (it) {
    case LayoutItem::Embedding: return "E";
    case LayoutItem::Decoder: return "t";
    case LayoutItem::Loss: return "L";
    case LayoutItem::Mtp: return "m";
  }
  return "?";
}

}  // namespace

const StageLayers& PipelineLayout::at(int64_t pp_rank, int64_t vp_stage) const {
  if (pp_rank < 0 || pp_rank >= pipeline_model_parallel_size || vp_stage < 0 ||
      vp_stage >= virtual_pipeline_model_parallel_size) {
    fail("pipeline layout: (pp_rank {}, vp_stage {}) is outside pipeline_model_parallel_size={} x virtual stages={}",
         pp_rank, vp_stage, pipeline_model_parallel_size, virtual_pipeline_model_parallel_size);
  }
  return stages[static_cast<size_t>(pp_rank)][static_cast<size_t>(vp_stage)];
}

std::vector<std::vector<LayoutItem>> parse_pipeline_layout(const std::string& layout) {
  std::vector<PosChar> chars;
  for (size_t i = 0; i < layout.size(); ++i) {
    if (layout[i] != ',') chars.push_back({layout[i], i});  // commas are cosmetic
  }
  chars = expand_chars(expand_groups(chars, layout), layout);
  std::vector<std::vector<LayoutItem>> stages(1);
  for (const PosChar& pc : chars) {
    switch (pc.c) {
      case '|': stages.emplace_back(); break;
      case 'E': stages.back().push_back(LayoutItem::Embedding); break;
      case 'L': stages.back().push_back(LayoutItem::Loss); break;
      case 't': stages.back().push_back(LayoutItem::Decoder); break;
      case 'm': stages.back().push_back(LayoutItem::Mtp); break;
      default:
        fail("pipeline_model_parallel_layout \"{}\": invalid layer character '{}' at position {} (known: E "
             "embedding, L loss, t transformer layer, m MTP; '|' separates stages, '*n' repeats, ',' is ignored)",
             layout, pc.c, pc.pos);
    }
  }
  return stages;
}

namespace {

PipelineLayout from_layout_string(const LayoutOptions& opt, int64_t requested_v) {
  const std::string& s = opt.pipeline_model_parallel_layout;
  const int64_t pp = opt.pipeline_model_parallel_size;
  const auto parsed = parse_pipeline_layout(s);
  const int64_t n = static_cast<int64_t>(parsed.size());
  if (n % pp != 0) {
    fail("pipeline_model_parallel_layout \"{}\" has {} stages, not a multiple of pipeline_model_parallel_size={}", s,
         n, pp);
  }
  const int64_t V = n / pp;
  if (requested_v > 0 && requested_v != V) {
    fail("pipeline_model_parallel_layout \"{}\" gives {} virtual stages per rank ({} stages / pipeline size {}) but "
         "the virtual-stage option asks for {}",
         s, V, n, pp, requested_v);
  }
  if (opt.decoder_first_pipeline_num_layers >= 0 || opt.decoder_last_pipeline_num_layers >= 0) {
    fail("pipeline_model_parallel_layout cannot be combined with decoder_first_pipeline_num_layers / "
         "decoder_last_pipeline_num_layers");
  }
  if (opt.account_for_embedding_in_pipeline_split || opt.account_for_loss_in_pipeline_split) {
    fail("pipeline_model_parallel_layout places the embedding and the loss itself ('E', 'L'): drop "
         "account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split");
  }
  // Model order: stage k = (vp k / pp, rank k % pp).
  std::vector<LayoutItem> flat;
  for (const auto& st : parsed) flat.insert(flat.end(), st.begin(), st.end());
  if (flat.empty() || flat.front() != LayoutItem::Embedding) {
    fail("pipeline_model_parallel_layout \"{}\": the first layer must be the embedding 'E', got {}", s,
         flat.empty() ? "nothing" : item_name(flat.front()));
  }
  if (flat.back() != LayoutItem::Loss) {
    fail("pipeline_model_parallel_layout \"{}\": the last layer must be the loss 'L', got '{}'", s, item_name(flat.back()));
  }
  const auto count = [&](LayoutItem it) { return std::count(flat.begin(), flat.end(), it); };
  if (count(LayoutItem::Embedding) != 1) fail("pipeline_model_parallel_layout \"{}\": 'E' must appear exactly once", s);
  if (count(LayoutItem::Loss) != 1) fail("pipeline_model_parallel_layout \"{}\": 'L' must appear exactly once", s);
  if (count(LayoutItem::Mtp) != opt.mtp_num_layers)
    fail("pipeline_model_parallel_layout \"{}\" has {} MTP layers 'm' but mtp_num_layers={}", s,
         count(LayoutItem::Mtp), opt.mtp_num_layers);
  const auto first_mtp = std::find(flat.begin(), flat.end(), LayoutItem::Mtp);
  if (std::find(first_mtp, flat.end(), LayoutItem::Decoder) != flat.end())
    fail("pipeline_model_parallel_layout \"{}\": the MTP layers 'm' must follow every transformer layer 't'", s);
  for (const auto& st : parsed)
    if (std::count(st.begin(), st.end(), LayoutItem::Mtp) > 0 &&
        std::count(st.begin(), st.end(), LayoutItem::Loss) == 0)
      fail("pipeline_model_parallel_layout \"{}\": the MTP layers 'm' must sit in the stage of the loss 'L' (MTP on "
           "an earlier stage is not implemented)", s);
  if (count(LayoutItem::Decoder) != opt.num_layers) {
    fail("pipeline_model_parallel_layout \"{}\" has {} transformer layers 't' but num_layers={}", s,
         count(LayoutItem::Decoder), opt.num_layers);
  }
  if (V > 1 && pp == 1) {
    fail("pipeline_model_parallel_layout \"{}\": {} virtual stages need pipeline_model_parallel_size > 1", s, V);
  }
  PipelineLayout out;
  out.pipeline_model_parallel_size = pp;
  out.virtual_pipeline_model_parallel_size = V;
  out.stages.assign(static_cast<size_t>(pp), std::vector<StageLayers>(static_cast<size_t>(V)));
  int64_t layer = 0;
  for (int64_t k = 0; k < n; ++k) {
    StageLayers& st = out.stages[static_cast<size_t>(k % pp)][static_cast<size_t>(k / pp)];
    for (LayoutItem it : parsed[static_cast<size_t>(k)]) {
      if (it == LayoutItem::Embedding) st.pre_process = true;
      if (it == LayoutItem::Loss) st.post_process = true;
      if (it == LayoutItem::Decoder) st.layers.push_back(layer++);
    }
  }
  return out;
}

// Layers per rank from the even / first-last rules.
std::vector<int64_t> layers_per_rank(const LayoutOptions& opt) {
  const int64_t pp = opt.pipeline_model_parallel_size, L = opt.num_layers;
  const int64_t first = opt.decoder_first_pipeline_num_layers, last = opt.decoder_last_pipeline_num_layers;
  std::vector<int64_t> counts(static_cast<size_t>(pp), 0);
  if (first < 0 && last < 0) {
    if (L % pp != 0) {
      fail("num_layers={} is not divisible by pipeline_model_parallel_size={} (use "
           "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers or "
           "--pipeline-model-parallel-layout for an uneven split)",
           L, pp);
    }
    std::fill(counts.begin(), counts.end(), L / pp);
    return counts;
  }
  if (pp < 2) {
    fail("decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers need pipeline_model_parallel_size > 1, "
         "got {}",
         pp);
  }
  if (first > L || last > L) {
    fail("decoder_first_pipeline_num_layers={} / decoder_last_pipeline_num_layers={} exceed num_layers={}", first,
         last, L);
  }
  int64_t rest = L, middle = pp;
  if (first >= 0) rest -= first, --middle;
  if (last >= 0) rest -= last, --middle;
  if (rest < 0) {
    fail("decoder_first_pipeline_num_layers={} + decoder_last_pipeline_num_layers={} exceed num_layers={}", first,
         last, L);
  }
  if (middle == 0 && rest != 0) {
    fail("decoder_first_pipeline_num_layers={} + decoder_last_pipeline_num_layers={} must equal num_layers={} when "
         "pipeline_model_parallel_size={} leaves no middle stage",
         first, last, L, pp);
  }
  if (middle > 0 && rest % middle != 0) {
    fail("the {} layers left after decoder_first_pipeline_num_layers={} / decoder_last_pipeline_num_layers={} do "
         "not split evenly over the {} remaining pipeline stages (num_layers={}, pipeline_model_parallel_size={})",
         rest, first, last, middle, L, pp);
  }
  const int64_t per = middle > 0 ? rest / middle : 0;
  std::fill(counts.begin(), counts.end(), per);
  if (first >= 0) counts.front() = first;
  if (last >= 0) counts.back() = last;
  return counts;
}

// Layers per (rank, virtual stage) [pp][V] when the embedding and/or the loss count as layers (rule 3).
std::vector<std::vector<int64_t>> accounted_counts(const LayoutOptions& opt, int64_t* v_out) {
  const int64_t pp = opt.pipeline_model_parallel_size, L = opt.num_layers;
  const int64_t e = opt.account_for_embedding_in_pipeline_split ? 1 : 0;
  const int64_t l = opt.account_for_loss_in_pipeline_split ? 1 : 0;
  const std::string what = fmt::format("num_layers={}{}{} = {} layer slots", L, e ? " + the embedding" : "",
                                       l ? " + the loss" : "", L + e + l);
  if (opt.decoder_first_pipeline_num_layers >= 0 || opt.decoder_last_pipeline_num_layers >= 0) {
    fail("account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split cannot be combined with "
         "decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers");
  }
  if ((L + e + l) % pp != 0)
    fail("{} (account_for_*_in_pipeline_split) are not divisible by pipeline_model_parallel_size={}", what, pp);
  int64_t V = opt.num_virtual_stages_per_pipeline_rank > 0 ? opt.num_virtual_stages_per_pipeline_rank : 1;
  if (opt.num_layers_per_virtual_pipeline_stage > 0) {
    const int64_t per_rank = (L + e + l) / pp;
    if (per_rank % opt.num_layers_per_virtual_pipeline_stage != 0) {
      fail("the {} layer slots per pipeline stage ({}) are not divisible by num_layers_per_virtual_pipeline_stage={}",
           per_rank, what, opt.num_layers_per_virtual_pipeline_stage);
    }
    V = per_rank / opt.num_layers_per_virtual_pipeline_stage;
  }
  if (V > 1 && pp == 1) fail("virtual pipeline stages ({}) need pipeline_model_parallel_size > 1", V);
  if ((L + e + l) % (pp * V) != 0) {
    fail("{} (account_for_*_in_pipeline_split) are not divisible by pipeline_model_parallel_size={} x {} virtual "
         "stages",
         what, pp, V);
  }
  const int64_t per_stage = (L + e + l) / (pp * V);
  if (per_stage - e < 0 || per_stage - l < 0 || (pp * V == 1 && per_stage - e - l < 0))
    fail("{} leave a pipeline stage fewer than zero decoder layers (pipeline_model_parallel_size={})", what, pp);
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(pp),
                                           std::vector<int64_t>(static_cast<size_t>(V), per_stage));
  counts.front().front() -= e;
  counts.back().back() -= l;
  *v_out = V;
  return counts;
}

}  // namespace

PipelineLayout make_pipeline_layout(const LayoutOptions& opt) {
  const int64_t pp = opt.pipeline_model_parallel_size;
  if (pp < 1) fail("pipeline_model_parallel_size must be >= 1, got {}", pp);
  if (opt.num_layers < 1) fail("num_layers must be >= 1, got {}", opt.num_layers);
  if (opt.num_layers_per_virtual_pipeline_stage < 0 || opt.num_virtual_stages_per_pipeline_rank < 0) {
    fail("num_layers_per_virtual_pipeline_stage ({}) and num_virtual_stages_per_pipeline_rank ({}) must be >= 0",
         opt.num_layers_per_virtual_pipeline_stage, opt.num_virtual_stages_per_pipeline_rank);
  }
  if (opt.num_layers_per_virtual_pipeline_stage > 0 && opt.num_virtual_stages_per_pipeline_rank > 0) {
    fail("set only one of num_layers_per_virtual_pipeline_stage ({}) and num_virtual_stages_per_pipeline_rank ({})",
         opt.num_layers_per_virtual_pipeline_stage, opt.num_virtual_stages_per_pipeline_rank);
  }
  const bool uneven = opt.decoder_first_pipeline_num_layers >= 0 || opt.decoder_last_pipeline_num_layers >= 0;
  if (!opt.pipeline_model_parallel_layout.empty()) {
    int64_t v = opt.num_virtual_stages_per_pipeline_rank;
    if (opt.num_layers_per_virtual_pipeline_stage > 0) {
      fail("pipeline_model_parallel_layout sets the virtual stages itself; drop num_layers_per_virtual_pipeline_stage");
    }
    return from_layout_string(opt, v);
  }
  if (opt.account_for_embedding_in_pipeline_split || opt.account_for_loss_in_pipeline_split) {
    int64_t V = 1;
    const std::vector<std::vector<int64_t>> counts = accounted_counts(opt, &V);
    PipelineLayout out;
    out.pipeline_model_parallel_size = pp;
    out.virtual_pipeline_model_parallel_size = V;
    out.stages.assign(static_cast<size_t>(pp), std::vector<StageLayers>(static_cast<size_t>(V)));
    int64_t layer = 0;
    for (int64_t v = 0; v < V; ++v)
      for (int64_t r = 0; r < pp; ++r)
        for (int64_t i = 0; i < counts[static_cast<size_t>(r)][static_cast<size_t>(v)]; ++i)
          out.stages[static_cast<size_t>(r)][static_cast<size_t>(v)].layers.push_back(layer++);
    out.stages.front().front().pre_process = true;
    out.stages.back().back().post_process = true;
    return out;
  }
  const std::vector<int64_t> counts = layers_per_rank(opt);
  int64_t V = 1;
  if (opt.num_virtual_stages_per_pipeline_rank > 0) V = opt.num_virtual_stages_per_pipeline_rank;
  if (opt.num_layers_per_virtual_pipeline_stage > 0) {
    if (uneven) {
      fail("num_layers_per_virtual_pipeline_stage cannot be combined with decoder_first/last_pipeline_num_layers; "
           "use num_virtual_stages_per_pipeline_rank");
    }
    const int64_t per_rank = counts.front();
    if (per_rank % opt.num_layers_per_virtual_pipeline_stage != 0) {
      fail("the {} layers per pipeline stage (num_layers={} / pipeline_model_parallel_size={}) are not divisible by "
           "num_layers_per_virtual_pipeline_stage={}",
           per_rank, opt.num_layers, pp, opt.num_layers_per_virtual_pipeline_stage);
    }
    V = per_rank / opt.num_layers_per_virtual_pipeline_stage;
  }
  if (V > 1 && pp == 1) fail("virtual pipeline stages ({}) need pipeline_model_parallel_size > 1", V);
  for (int64_t r = 0; r < pp; ++r) {
    if (counts[static_cast<size_t>(r)] % V != 0) {
      fail("pipeline rank {} holds {} layers, not divisible by its {} virtual stages (num_layers={}, "
           "pipeline_model_parallel_size={}, decoder_first_pipeline_num_layers={}, "
           "decoder_last_pipeline_num_layers={})",
           r, counts[static_cast<size_t>(r)], V, opt.num_layers, pp, opt.decoder_first_pipeline_num_layers,
           opt.decoder_last_pipeline_num_layers);
    }
  }
  PipelineLayout out;
  out.pipeline_model_parallel_size = pp;
  out.virtual_pipeline_model_parallel_size = V;
  out.stages.assign(static_cast<size_t>(pp), std::vector<StageLayers>(static_cast<size_t>(V)));
  int64_t layer = 0;
  for (int64_t v = 0; v < V; ++v) {
    for (int64_t r = 0; r < pp; ++r) {
      StageLayers& st = out.stages[static_cast<size_t>(r)][static_cast<size_t>(v)];
      for (int64_t i = 0; i < counts[static_cast<size_t>(r)] / V; ++i) st.layers.push_back(layer++);
    }
  }
  out.stages.front().front().pre_process = true;
  out.stages.back().back().post_process = true;
  return out;
}

LayoutOptions layout_options(const TransformerConfig& model, const ParallelConfig& parallel) {
  LayoutOptions o;
  o.num_layers = model.num_layers;
  o.pipeline_model_parallel_size = parallel.pipeline_model_parallel_size;
  o.num_layers_per_virtual_pipeline_stage = parallel.num_layers_per_virtual_pipeline_stage;
  o.pipeline_model_parallel_layout = parallel.pipeline_model_parallel_layout;
  o.decoder_first_pipeline_num_layers = parallel.decoder_first_pipeline_num_layers;
  o.decoder_last_pipeline_num_layers = parallel.decoder_last_pipeline_num_layers;
  o.account_for_embedding_in_pipeline_split = parallel.account_for_embedding_in_pipeline_split;
  o.account_for_loss_in_pipeline_split = parallel.account_for_loss_in_pipeline_split;
  o.mtp_num_layers = model.mtp_num_layers;
  return o;
}

std::string to_string(const PipelineLayout& layout) {
  std::string out;
  for (int64_t r = 0; r < layout.pipeline_model_parallel_size; ++r) {
    for (int64_t v = 0; v < layout.virtual_pipeline_model_parallel_size; ++v) {
      const StageLayers& st = layout.at(r, v);
      out += fmt::format("rank {} vp {}:", r, v);
      if (st.pre_process) out += " E";
      for (int64_t l : st.layers) out += fmt::format(" t{}", l);
      if (st.post_process) out += " L";
      out += '\n';
    }
  }
  return out;
}

}  // namespace mcpp::pipeline_parallel
