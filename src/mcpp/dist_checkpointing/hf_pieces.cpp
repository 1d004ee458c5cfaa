// The engine of the HF key mapping: our tensors matched against a format's rules, and each piece's transform both
// ways; see hf_rules.h.
#include <unordered_map>

#include "mcpp/core/error.h"
#include "mcpp/dist_checkpointing/hf_rules.h"
#include "mcpp/dist_checkpointing/hf_tensor_ops.h"
#include "mcpp/models/gpt/gpt_model_tensors.h"

namespace mcpp::dist_checkpointing {
using namespace hf_detail;

namespace {

// A key with its decimal segments replaced by '#' ("decoder.layers.#.mlp.experts.local_experts.#.linear_fc1.weight")
// and their values, in order; a pattern's {x} segments count as decimal ones (names: their letters).
struct Normalized {
  std::string shape;
  std::vector<int64_t> values;
  std::string names;  // a pattern's placeholder letters, in order
};

Normalized normalize(const std::string& key, bool pattern) {
  Normalized n;
  size_t start = 0;
  while (start <= key.size()) {
    size_t end = key.find('.', start);
    if (end == std::string::npos) end = key.size();
    const std::string seg = key.substr(start, end - start);
    const bool digits = !seg.empty() && seg.size() <= 18 && seg.find_first_not_of("0123456789") == std::string::npos;
    const bool placeholder = pattern && seg.size() == 3 && seg.front() == '{' && seg.back() == '}';
    if (!n.shape.empty()) n.shape += '.';
    if (placeholder) {
      n.shape += '#';
      n.names += seg[1];
    } else if (digits && !pattern) {
      n.shape += '#';
      n.values.push_back(std::stoll(seg));
    } else {
      n.shape += seg;
    }
    start = end + 1;
  }
  return n;
}

// An HF pattern with {i} {e} {k} {m} filled in.
std::string fill(const std::string& pattern, const std::map<char, int64_t>& vars) {
  std::string out;
  for (size_t p = 0; p < pattern.size(); ++p) {
    if (pattern[p] == '{' && p + 2 < pattern.size() && pattern[p + 2] == '}') {
      const auto it = vars.find(pattern[p + 1]);
      MCPP_CHECK(it != vars.end(), "HF rule '{}': placeholder {{{}}} not bound by our key", pattern, pattern[p + 1]);
      out += std::to_string(it->second);
      p += 2;
      continue;
    }
    out += pattern[p];
  }
  return out;
}

Shape with_rows(Shape s, int64_t rows) {
  s.at(0) = rows;
  return s;
}

// The HF tensors' shapes for ours of `shape`.
std::vector<Shape> hf_shapes(HfOp op, const Shape& shape, size_t n, const HfLayout& l, const std::string& key) {
  auto need = [&](bool ok, const char* what) {
    if (!ok) fail("HF mapping of '{}' {}: {} does not fit", key, shape_str(shape), what);
  };
  need(!shape.empty(), "a tensor of at least one dim");
  const int64_t rows = shape[0], q = l.heads * l.head_dim, kv = l.groups * l.head_dim;
  switch (op) {
    case HfOp::Same: return {shape};
    case HfOp::Vocab: need(l.vocab <= rows, "the vocabulary"); return {with_rows(shape, l.vocab)};
    case HfOp::Transpose:
    case HfOp::QkvCatT: need(shape.size() == 2, "a transpose"); return {{shape[1], shape[0]}};
    case HfOp::QkvCat: return {shape};
    case HfOp::Rows: need(rows % static_cast<int64_t>(n) == 0, "equal row blocks");
      return std::vector<Shape>(n, with_rows(shape, rows / static_cast<int64_t>(n)));
    case HfOp::Qkv: need(rows == q + 2 * kv, "the query groups");
      return {with_rows(shape, q), with_rows(shape, kv), with_rows(shape, kv)};
  }
  return {};
}

// GPT-2's fused [q; k; v] rows -> Megatron's grouped rows.
Tensor merge_cat(const Tensor& cat, const HfLayout& l) {
  const int64_t q = l.heads * l.head_dim, kv = l.groups * l.head_dim;
  return merge_qkv(slice_rows(cat, 0, q), slice_rows(cat, q, kv), slice_rows(cat, q + kv, kv), l.heads, l.groups,
                   l.head_dim);
}

}  // namespace

HfLayout hf_layout(const ModelDims& d) {
  return {.num_layers = d.num_layers, .vocab = d.vocab, .heads = d.heads, .groups = d.groups,
          .head_dim = d.head_dim, .experts = d.experts};
}

std::vector<HfPiece> hf_pieces(const std::vector<std::pair<std::string, Shape>>& ours, HfFormat f,
                               const HfLayout& l) {
  std::unordered_map<std::string, std::pair<const HfRule*, std::string>> by_shape;  // -> rule, placeholder names
  for (const HfRule& r : hf_rules(f)) {
    Normalized n = normalize(r.ours, true);
    MCPP_CHECK(by_shape.emplace(n.shape, std::make_pair(&r, n.names)).second, "{}: two rules for '{}'",
               hf_format_name(f), r.ours);
  }
  std::vector<HfPiece> out;
  out.reserve(ours.size());
  for (const auto& [key, shape] : ours) {
    const Normalized n = normalize(key, false);
    const auto it = by_shape.find(n.shape);
    if (it == by_shape.end()) fail("no HF name for parameter '{}' ({})", key, hf_format_name(f));
    const HfRule& rule = *it->second.first;
    const std::string& names = it->second.second;
    std::map<char, int64_t> vars;
    for (size_t v = 0; v < names.size(); ++v) vars[names[v]] = n.values.at(v);
    if (vars.count('k')) vars['m'] = l.num_layers + vars['k'];
    HfPiece p;
    p.ours = key, p.shape = shape, p.op = rule.op;
    const std::vector<Shape> shapes = hf_shapes(rule.op, shape, rule.hf.size(), l, key);
    MCPP_CHECK(shapes.size() == rule.hf.size(), "{}: rule for '{}' has {} HF names, its transform {}",
               hf_format_name(f), rule.ours, rule.hf.size(), shapes.size());
    for (size_t h = 0; h < rule.hf.size(); ++h) p.hf.emplace_back(fill(rule.hf[h], vars), shapes[h]);
    if (!rule.fused.empty()) {
      p.fused = fill(rule.fused, vars);
      p.expert = vars.count('e') ? vars['e'] : -1;
      p.fused_shape = shape;
      if (p.expert >= 0) p.fused_shape.insert(p.fused_shape.begin(), l.experts);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::pair<std::string, Shape>> model_tensors_from_config(const nlohmann::json& config) {
  TransformerConfig c;
  config::read_json(TransformerConfig::fields(), c, config.at("model"));
  return gpt_model_tensors(c);
}

void export_pieces(const CheckpointReader& r, const std::vector<HfPiece>& pieces, const HfLayout& l,
                   std::vector<SafetensorsItem>& items) {
  for (const HfPiece& p : pieces) {
    Tensor t = r.read(p.ours);
    if (t.shape() != p.shape)
      fail("{}: tensor '{}' has shape {} but the config implies {}", r.dir(), p.ours, shape_str(t.shape()),
           shape_str(p.shape));
    if (t.dtype() != DType::F32) t = t.to(DType::F32);
    auto put = [&](size_t h, Tensor x) { items.push_back({p.hf.at(h).first, std::move(x)}); };
    switch (p.op) {
      case HfOp::Same: put(0, t); break;
      case HfOp::Vocab: put(0, slice_rows(t, 0, l.vocab)); break;  // [V, ...]
      case HfOp::Transpose: put(0, transpose2d(t)); break;         // Conv1D [in, out]
      case HfOp::Rows: {
        int64_t row = 0;
        for (size_t h = 0; h < p.hf.size(); ++h) {
          const int64_t n = p.hf[h].second[0];
          put(h, slice_rows(t, row, n));
          row += n;
        }
        break;
      }
      case HfOp::Qkv: {
        auto [q, k, v] = split_qkv(t, l.heads, l.groups, l.head_dim);  // [nq d, ...], [ng d, ...], [ng d, ...]
        put(0, q), put(1, k), put(2, v);
        break;
      }
      case HfOp::QkvCat:
      case HfOp::QkvCatT: {
        auto [q, k, v] = split_qkv(t, l.heads, l.groups, l.head_dim);
        Tensor cat = cat_rows({q, k, v});  // [(nq + 2 ng) d, ...] = [q; k; v]
        put(0, p.op == HfOp::QkvCat ? cat : transpose2d(cat));
        break;
      }
    }
  }
}

std::vector<NamedTensor> import_pieces(HfTensors& hf, const std::vector<HfPiece>& pieces, const HfLayout& l,
                                       const std::string& drop_prefix) {
  auto name = [&](const std::string& n) {
    return !drop_prefix.empty() && n.rfind(drop_prefix, 0) == 0 ? n.substr(drop_prefix.size()) : n;
  };
  std::map<std::string, Tensor> fused;  // transformers 5's tensors, read once
  std::vector<NamedTensor> out;
  out.reserve(pieces.size());
  for (const HfPiece& p : pieces) {
    if (!p.fused.empty() && hf.has(p.fused)) {
      auto it = fused.find(p.fused);
      if (it == fused.end()) it = fused.emplace(p.fused, hf.get(p.fused, p.fused_shape)).first;
      out.push_back({p.ours, p.expert < 0 ? it->second : slice_rows(it->second, p.expert, 1).view(p.shape)});
      continue;
    }
    std::vector<Tensor> parts;
    for (const auto& [n, shape] : p.hf) parts.push_back(hf.get(name(n), shape));
    Tensor t;
    switch (p.op) {
      case HfOp::Same: t = parts[0]; break;
      case HfOp::Vocab: t = pad_rows(parts[0], p.shape[0]); break;  // zero padding rows
      case HfOp::Transpose: t = transpose2d(parts[0]); break;
      case HfOp::Rows: t = cat_rows(parts); break;
      case HfOp::Qkv: t = merge_qkv(parts[0], parts[1], parts[2], l.heads, l.groups, l.head_dim); break;
      case HfOp::QkvCat: t = merge_cat(parts[0], l); break;
      case HfOp::QkvCatT: t = merge_cat(transpose2d(parts[0]), l); break;
    }
    out.push_back({p.ours, t});
  }
  return out;
}

}  // namespace mcpp::dist_checkpointing
