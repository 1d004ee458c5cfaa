// Module scopes: NVTX ranges and the module-trace recording (module_trace.h).
#include "mcpp/core/module_trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>

#include "mcpp/core/error.h"
#include "mcpp/core/trace_range.h"

namespace mcpp {
namespace detail {
bool g_module_trace_on = false;
bool g_scope_observed = false;
ScopeTimer* g_scope_timer = nullptr;
}  // namespace detail

void set_scope_timer(ScopeTimer* t) { detail::g_scope_timer = t; }
namespace {

struct Observers {
  std::vector<ScopeObserver*> list;
  std::vector<const char*> stack;  // the open scopes' names while observed, outermost first
};
Observers& observers() {
  static Observers o;  // the model's thread
  return o;
}

struct Recorder {
  bool on = false;
  std::vector<ModuleNode*> stack;       // the open scopes' nodes, innermost last
  std::unique_ptr<ModuleNode> forward;  // the first top-level forward scope's tree
  std::unique_ptr<ModuleNode> backward;
  int64_t skip_depth = 0;  // > 0: inside a dropped top-level scope
};
Recorder& recorder() {
  static Recorder r;  // one recording at a time, on the model's thread
  return r;
}

void format_node(const ModuleNode& n, int depth, std::string& out) {
  std::string line = std::string(2 * static_cast<size_t>(depth), ' ') + n.name + (n.backward ? " (backward)" : "");
  if (!n.inputs.empty()) line += "  in: " + fmt::format("{}", fmt::join(n.inputs, ", "));
  if (!n.outputs.empty()) line += " -> out: " + fmt::format("{}", fmt::join(n.outputs, ", "));
  if (!n.ops.empty()) {
    line += "  ops:";
    for (size_t i = 0; i < n.ops.size(); ++i)
      line += fmt::format("{} {}{}", i ? "," : "", n.ops[i].first,
                          n.ops[i].second > 1 ? fmt::format(" x{}", n.ops[i].second) : "");
  }
  out += line + "\n";
  for (const auto& c : n.children) format_node(*c, depth + 1, out);
}

}  // namespace

ModuleTraceRecording::ModuleTraceRecording() {
  Recorder& r = recorder();
  MCPP_CHECK(!r.on, "ModuleTraceRecording: a recording is already running");
  r = Recorder{};
  r.on = true;
  detail::g_module_trace_on = true;
}

ModuleTraceRecording::~ModuleTraceRecording() {
  recorder().on = false;
  detail::g_module_trace_on = false;
}

ModuleTraceRecording::Trees ModuleTraceRecording::take() {
  Recorder& r = recorder();
  return {std::move(r.forward), std::move(r.backward)};
}

void module_trace_op(const char* op) {
  Recorder& r = recorder();
  if (!r.on || r.skip_depth > 0 || r.stack.empty()) return;
  auto& ops = r.stack.back()->ops;
  for (auto& [name, calls] : ops)
    if (name == op) {
      ++calls;
      return;
    }
  ops.emplace_back(op, 1);
}

std::string describe(const Tensor& t) {
  if (!t.defined()) return "undefined";
  return fmt::format("{}[{}]", dtype_name(t.dtype()), fmt::join(t.shape(), ", "));
}

std::string format_module_tree(const ModuleNode& root) {
  std::string out;
  format_node(root, 0, out);
  return out;
}

void add_scope_observer(ScopeObserver* o) {
  observers().list.push_back(o);
  detail::g_scope_observed = true;
}

void remove_scope_observer(ScopeObserver* o) {
  auto& l = observers().list;
  std::erase(l, o);
  detail::g_scope_observed = !l.empty();
  if (l.empty()) observers().stack.clear();
}

std::string qualified_module_name(const std::vector<const char*>& scopes) {
  size_t base = scopes.size();  // the innermost dotted name
  for (size_t i = scopes.size(); i-- > 0;)
    if (std::string_view(scopes[i]).find('.') != std::string_view::npos) {
      base = i;
      break;
    }
  if (base == scopes.size()) return scopes.empty() ? std::string() : std::string(scopes.back());
  std::string name = scopes[base];
  for (size_t i = base + 1; i < scopes.size(); ++i) name += std::string(".") + scopes[i];
  return name;
}

void ModuleScope::notify(const Tensor& t) const {
  const Observers& o = observers();
  for (ScopeObserver* obs : o.list) obs->on_output(o.stack, backward_, t);
}

ModuleScope::ModuleScope(const char* name, const Tensor& in, Pass pass) {
  trace_range_push(name);
  if (detail::g_scope_timer) {
    timed_ = true;
    detail::g_scope_timer->on_begin(name, pass == kBackward);
  }
  if (detail::g_scope_observed) {
    observers().stack.push_back(name);
    observed_ = true;
    backward_ = pass == kBackward;
  }
  if (!detail::g_module_trace_on) return;
  Recorder& r = recorder();
  if (r.skip_depth > 0) {
    ++r.skip_depth;
    skipped_ = true;
    return;
  }
  auto node = std::make_unique<ModuleNode>();
  node->name = name;
  node->backward = pass == kBackward;
  if (in.defined()) node->inputs.push_back(describe(in));
  node_ = node.get();
  if (r.stack.empty()) {  // a top-level scope: the first of its pass is kept, later ones dropped whole
    std::unique_ptr<ModuleNode>& slot = pass == kBackward ? r.backward : r.forward;
    if (slot) {
      node_ = nullptr;
      skipped_ = true;
      r.skip_depth = 1;
      return;
    }
    slot = std::move(node);
  } else {
    r.stack.back()->children.push_back(std::move(node));
  }
  r.stack.push_back(node_);
}

ModuleScope::~ModuleScope() {
  trace_range_pop();
  if (timed_ && detail::g_scope_timer) detail::g_scope_timer->on_end();
  if (observed_ && !observers().stack.empty()) observers().stack.pop_back();
  if (!skipped_ && !node_) return;  // not recording
  Recorder& r = recorder();
  if (skipped_) {
    if (r.skip_depth > 0) --r.skip_depth;
    return;
  }
  if (node_ && r.on && !r.stack.empty() && r.stack.back() == node_) r.stack.pop_back();
}

void ModuleScope::record_out(const Tensor& t) const {
  if (node_ && recorder().on) node_->outputs.push_back(describe(t));
}

}  // namespace mcpp
