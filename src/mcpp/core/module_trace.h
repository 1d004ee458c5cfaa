// Module scopes: NVTX ranges per module on GPUs, and the module trace (`mcpp train --trace-modules N`, experiment
// E01) — for one training iteration the tree of module calls with their input / output shapes and dtypes and the
// kernel-interface ops each launched.
//
//   const ModuleScope m("self_attention", x);            // forward; ModuleScope::kBackward in backward
//   ... Tensor y = ...; m.out(y);                        // optional: the output's shape
// A scope always pushes an NVTX range named after the module (core/trace_range.h: a few ns without a profiler, a
// no-op in CPU builds), so an Nsight Systems profile shows the module tree. While a ModuleTraceRecording is alive
// (one at a time, on the thread that runs the model), every scope also becomes a node under the innermost open
// scope, and every op called through mcpp::ops while it is innermost is counted in it (kernels/op_profile.h's
// OpTimer calls module_trace_op: one predictable branch when not recording). Of the top-level scopes the recording
// keeps the first forward one and the first backward one (one microbatch of one chunk: the model's forward_step /
// backward_step), and drops later ones whole.
// The model marks: GPTModel (forward_step / backward_step) > embedding, decoder (TransformerBlock) > layer i
// (TransformerLayer) > self_attention > linear_qkv, core_attention, linear_proj | mlp > linear_fc1, linear_fc2 |
// moe > router, experts, shared_experts; final_layernorm; output_layer; loss.
//
// Scope observers (diagnosis: training/nan_localizer.h's per-module finite checks, training/fault_injection.h's NaN
// injection): while one is installed, every scope's out() / ret() tensor is handed to each observer in install
// order, with the open scopes' names (outermost first) and the pass. Not installed: one predictable branch per scope.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mcpp/core/tensor.h"

namespace mcpp {

struct ModuleNode {
  std::string name;
  bool backward = false;
  std::vector<std::string> inputs, outputs;             // "float32[16, 2, 32]"
  std::vector<std::pair<std::string, int64_t>> ops;     // op name and calls, in first-call order
  std::vector<std::unique_ptr<ModuleNode>> children;
};

// Records while alive (not nested). take(): the forward and backward trees (either may be null when none ran).
class ModuleTraceRecording {
 public:
  ModuleTraceRecording();
  ~ModuleTraceRecording();
  ModuleTraceRecording(const ModuleTraceRecording&) = delete;
  ModuleTraceRecording& operator=(const ModuleTraceRecording&) = delete;
  struct Trees {
    std::unique_ptr<ModuleNode> forward, backward;
  };
  Trees take();
};

namespace detail {
extern bool g_module_trace_on;  // a recording is alive (read on every op: inline)
}  // namespace detail
inline bool module_trace_recording() { return detail::g_module_trace_on; }
void module_trace_op(const char* op);  // called by the ops dispatch while recording

std::string describe(const Tensor& t);  // "float32[16, 2, 32]" ("undefined" for an empty tensor)
// The tree as indented text: "name  in: ... -> out: ...  ops: linear_fwd, gelu_fwd x2".
std::string format_module_tree(const ModuleNode& root);

// Sees each scope's output (forward: the module's output; backward: the gradient it returns). May write into the
// tensor (fault injection); must not call collectives.
class ScopeObserver {
 public:
  virtual ~ScopeObserver() = default;
  virtual void on_output(const std::vector<const char*>& scopes, bool backward, const Tensor& t) = 0;
};
// Installs / removes an observer (on the model's thread; not owned).
void add_scope_observer(ScopeObserver* o);
void remove_scope_observer(ScopeObserver* o);
// The scopes' qualified module name: the innermost dotted name ("decoder.layers.3") plus the plain names opened
// after it: [GPTModel, decoder, decoder.layers.3, mlp] -> "decoder.layers.3.mlp"; [GPTModel, loss] -> "loss".
std::string qualified_module_name(const std::vector<const char*>& scopes);

namespace detail {
extern bool g_scope_observed;  // an observer is installed (read on every scope: inline)
}  // namespace detail

// Scope timing (`mcpp train --timeline`'s per-layer rows, training/timeline.h): while a timer is installed, every
// scope's begin is reported to it with the scope's name (valid during the call only) and pass, and its end (scopes
// nest: an end closes the innermost open begin), on the model's thread. One at a time; not installed: one
// predictable branch per scope.
class ScopeTimer {
 public:
  virtual ~ScopeTimer() = default;
  virtual void on_begin(const char* name, bool backward) = 0;
  virtual void on_end() = 0;
};
void set_scope_timer(ScopeTimer* t);  // nullptr removes it

class ModuleScope {
 public:
  enum Pass { kForward, kBackward };
  ModuleScope(const char* name, const Tensor& in, Pass pass = kForward);
  ModuleScope(const std::string& name, const Tensor& in, Pass pass = kForward)
      : ModuleScope(name.c_str(), in, pass) {}
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
  void out(const Tensor& t) const {  // records the output's shape and dtype (while recording); tells observers
    if (detail::g_module_trace_on) record_out(t);
    if (observed_) notify(t);
  }
  Tensor ret(Tensor t) const {  // out(t), then t: `return m.ret(y);`
    out(t);
    return t;
  }

 private:
  void record_out(const Tensor& t) const;
  ModuleNode* node_ = nullptr;  // recording: this scope's node
  bool skipped_ = false;        // recording, but inside a dropped top-level scope
  bool observed_ = false;       // pushed onto the observers' scope stack
  bool backward_ = false;
  bool timed_ = false;  // a scope timer saw this scope begin
  void notify(const Tensor& t) const;
};

}  // namespace mcpp
