// cuDNN fused flash attention through the cuDNN backend API (no frontend library): the graphs that
// cudnn-frontend's CompositeSDPANode / CompositeSDPABackwardNode lower to for a causal (or full) bf16
// SDPA with softmax stats, which the runtime-fusion engines of cuDNN >= 9 recognize as one flash
// attention kernel (on Hopper: wgmma + TMA, what PyTorch's default SDPA runs on an H200). Node list,
// tensor types and UIDs are the ones cuDNN 9.19's API log records for that frontend graph.
//
// Contract (cudnn_attention.h): cudnn_attention_fwd / _bwd return false when cuDNN has no engine for the
// case (the caller then runs the mcpp kernels) and true when the work was enqueued on `s`.
//   fwd graph: S = Q K^T (fp32) -> * scale -> causal mask (GEN_INDEX rows/cols, CMP_GE, BINARY_SELECT
//     -inf) -> M = rowmax, E = exp(S - M), Z = rowsum E -> Stats = M + log Z (our lse, natural log of the
//     scaled scores) -> P = E / Z (bf16) -> O = P V.
//   bwd graph: softmax_sum = rowsum(dO * O) (a real fp32 [b, nq, s] tensor: our delta scratch),
//     S = Q K^T * scale, P = exp(mask(S - Stats)), dV = P^T dO, dP = dO V^T, dS = P (dP - softmax_sum)
//     * scale, dK = dS^T Q, dQ_acc = dS K (fp32 scratch, zeroed here), dQ = dQ_acc (identity, bf16).
//   deterministic bwd graph (cudnn-frontend's is_deterministic_algorithm on Hopper): the same, but
//     dQ = dS K straight into bf16 dQ — no fp32 accumulator, which the engine then serves with its dP
//     workspace (dS kept as bf16 [b, nq, s, s] in the plan's workspace, dQ a separate ordered product):
//     bitwise repeatable, more workspace (~b nq s^2 2 bytes), slower than the atomics.
// Attention dropout (AttnShape::drop_p > 0), as cudnn-frontend lowers set_dropout(p, seed, offset): the fwd
//   graph's P (fp32) -> * mask (an RNG node: Bernoulli(1 - p) from Philox seed / offset, device int64 [1,1,1,1]
//   tensors) -> * 1 / (1 - p) (by value) -> bf16 -> P V; Stats stay the undropped softmax's. The bwd graph
//   regenerates the mask from the same seed / offset: softmax_sum = rowsum(dO * O) (1 - p), dV = (P mask /
//   (1 - p))^T dO, dS = P (dP mask - softmax_sum) / (1 - p) * scale. cuDNN's numbers, not core/rng.h's: the
//   mask differs from the CPU's / the mcpp kernels'. A call takes cuDNN only when the forward AND both
//   backward graphs have an engine (dropout_ready), so a forward and its backward never mix the two masks.
//   Seed = the key's seed, offset = its offset (+ the device base of a CUDA-graph key), written to a device
//   scratch by a one-thread kernel at run time (launch_philox_args).
// Layout: q/k/v/dq/dk/dv through the AttnShape layout fields (split or packed qkv), o/dout [s, b, nq, d],
// lse/delta [b, nq, s]. A packed layout with GQA (nq != ng) has no uniform head stride: not supported (the
// packed op then splits and calls the split layout). The backward with GQA computes dK / dV per query head
// (bf16 virtual tensors) and sums each group's heads with a reduction node (native; cudnn-frontend's
// lowering); where cuDNN has no engine for that graph it runs the MHA graph on k/v repeated to nq heads and
// sums dk/dv per group (gqa_bwd). Non-causal graphs have no -inf tensor, and the variant pack must name
// exactly the graph's tensors.
// The default backward engines accumulate dQ with atomics: results are not bit-identical run to run;
// AttentionOptions::deterministic asks for the deterministic graph above.
// Plans are built once per (direction, shape, layout) and cached; a failed build is cached too (and
// reported on stderr when it is built). The cache is an LRU of ops::set_cudnn_plan_cache_capacity()
// entries (default 64; --variable-seq-lengths builds one plan pair per length): evicting a plan first
// waits for the device (its kernels may still be queued), and never happens while the calling stream is
// being captured into a CUDA graph (the cache then overshoots until the next uncaptured insertion). Not
// thread-safe (the op layer runs one stream per process).
#include "mcpp/kernels/cuda/cudnn_attention.h"
#include "mcpp/kernels/ops.h"

#include <cudnn.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <list>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "mcpp/core/error.h"
#include "mcpp/kernels/cuda/cuda_check.h"

namespace mcpp::cuda_detail {
namespace {

struct Refused {  // a backend call that did not succeed while building: no engine for this case
  const char* what;
  cudnnStatus_t status;
};

void ck(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) throw Refused{what, st};
}

using Dims = std::array<int64_t, 4>;
Dims packed(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Owns every descriptor of one graph + plan (they stay alive with the plan).
class Graph {
 public:
  ~Graph() {
    for (auto it = owned_.rbegin(); it != owned_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d = nullptr;
    ck(cudnnBackendCreateDescriptor(t, &d), "create descriptor");
    owned_.push_back(d);
    return d;
  }
  template <typename T>
  void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           const T* v, int64_t n = 1) {
    ck(cudnnBackendSetAttribute(d, name, type, n, v), "set attribute");
  }
  cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t dt, const Dims& dim, const Dims& str,
                                  bool is_virtual = false, bool by_value = false) {
    cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    const int64_t align = 16;
    set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, &dt);
    set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, dim.data(), 4);
    set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, str.data(), 4);
    set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, &uid);
    set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, &align);
    set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, &is_virtual);
    if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, &by_value);
    ck(cudnnBackendFinalize(t), "finalize tensor");
    return t;
  }
  cudnnBackendDescriptor_t virt(int64_t uid, cudnnDataType_t dt, const Dims& dim) {
    return tensor(uid, dt, dim, packed(dim), true);
  }
  cudnnBackendDescriptor_t scalar(int64_t uid) {  // fp32 [1,1,1,1] passed by value
    return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  void pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    cudnnBackendDescriptor_t pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, &mode);
    set(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, &prec);
    if (axis >= 0) set(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, &axis);
    ck(cudnnBackendFinalize(pw), "finalize pointwise");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, &pw);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    if (b) set(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b);
    set(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    if (t) set(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &t);
    ck(cudnnBackendFinalize(op), "finalize pointwise operation");
    ops_.push_back(op);
  }
  // The causal mask as cudnn-frontend lowers it: keep = (row index >= column index) from GEN_INDEX on axes 2
  // and 3 and CMP_GE, then BINARY_SELECT(x, -inf passed by value, keep). uid: {row, col, keep, -inf, out}.
  cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t x, const Dims& dims,
                                       const std::array<int64_t, 5>& uid) {
    auto row = virt(uid[0], CUDNN_DATA_INT32, dims), col = virt(uid[1], CUDNN_DATA_INT32, dims);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, row, nullptr, CUDNN_DATA_FLOAT, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, col, nullptr, CUDNN_DATA_FLOAT, 3);
    auto keep = virt(uid[2], CUDNN_DATA_BOOLEAN, dims);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
    auto out = virt(uid[4], CUDNN_DATA_FLOAT, dims);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, scalar(uid[3]), out, keep);
    return out;
  }
  void reduction(cudnnReduceTensorOp_t red, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, &red);
    set(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &prec);
    ck(cudnnBackendFinalize(rd), "finalize reduction");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    set(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &rd);
    ck(cudnnBackendFinalize(op), "finalize reduction operation");
    ops_.push_back(op);
  }
  void matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnBackendDescriptor_t md = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t prec = CUDNN_DATA_FLOAT;
    set(md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, &prec);
    ck(cudnnBackendFinalize(md), "finalize matmul");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &a);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &b);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &c);
    set(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &md);
    ck(cudnnBackendFinalize(op), "finalize matmul operation");
    ops_.push_back(op);
  }
  // y = Bernoulli(keep) mask from Philox (seed, offset device tensors): cudnn-frontend's rng node.
  void rng(cudnnBackendDescriptor_t seed, cudnnBackendDescriptor_t offset, cudnnBackendDescriptor_t y, double keep) {
    cudnnBackendDescriptor_t rd = make(CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    set(rd, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, &dist);
    set(rd, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, &keep);
    ck(cudnnBackendFinalize(rd), "finalize rng");
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RNG_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    set(op, CUDNN_ATTR_OPERATION_RNG_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &rd);
    set(op, CUDNN_ATTR_OPERATION_RNG_SEED, CUDNN_TYPE_BACKEND_DESCRIPTOR, &seed);
    set(op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &offset);
    ck(cudnnBackendFinalize(op), "finalize rng operation");
    ops_.push_back(op);
  }
  // The dropout mask [B, H, S, S] (fp32 virtual) of the seed / offset tensors kSeed / kOffset.
  cudnnBackendDescriptor_t dropout_mask(int64_t uid, const Dims& ss, float p);
  void reshape(cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &x);
    set(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, &y);
    ck(cudnnBackendFinalize(op), "finalize reshape operation");
    ops_.push_back(op);
  }
  // Operation graph -> heuristics (mode A) -> the first engine config that finalizes into a plan.
  void build(cudnnHandle_t h) {
    cudnnBackendDescriptor_t g = make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, &h);
    set(g, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, ops_.data(),
        static_cast<int64_t>(ops_.size()));
    ck(cudnnBackendFinalize(g), "finalize operation graph");
    cudnnBackendDescriptor_t heur = make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, &g);
    set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, &mode);
    ck(cudnnBackendFinalize(heur), "finalize heuristics");
    std::vector<cudnnBackendDescriptor_t> cfgs(8);
    for (auto& c : cfgs) c = make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t n = 0;
    ck(cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                static_cast<int64_t>(cfgs.size()), &n, cfgs.data()),
       "heuristics results");
    Refused last{"no engine config from the heuristics", CUDNN_STATUS_NOT_SUPPORTED};
    for (int64_t i = 0; i < n; ++i) {
      cudnnBackendDescriptor_t p = make(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      try {
        set(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, &h);
        set(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, &cfgs[i]);
        ck(cudnnBackendFinalize(p), "finalize execution plan");
        int64_t ws = 0, got = 0;
        ck(cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got, &ws),
           "workspace size");
        plan = p;
        workspace = ws;
        return;
      } catch (const Refused& r) {
        last = r;
      }
    }
    throw last;
  }

  cudnnBackendDescriptor_t plan = nullptr;
  int64_t workspace = 0;

 private:
  std::vector<cudnnBackendDescriptor_t> owned_, ops_;
};

// UIDs (as cudnn-frontend numbers them in cuDNN 9.19's API log)
enum : int64_t {
  kQ = 0, kK = 1, kV = 2, kO = 3, kScale = 5, kOne = 7, kStats = 8, kDO = 9, kDQ = 10, kDK = 11, kDV = 12,
  kSoftmaxSum = 13, kNegInfFwd = 11, kNegInfBwd = 20, kDQAcc = 30, kDKFull = 31, kDVFull = 32,  // the last two: ours
  kSeed = 40, kOffset = 41, kDropScale = 42, kDropScaleInv = 43  // dropout (ours); virtual tensors 50..59
};

cudnnBackendDescriptor_t Graph::dropout_mask(int64_t uid, const Dims& ss, float p) {
  auto seed = tensor(kSeed, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1});
  auto offset = tensor(kOffset, CUDNN_DATA_INT64, {1, 1, 1, 1}, {1, 1, 1, 1});
  auto mask = virt(uid, CUDNN_DATA_FLOAT, ss);
  rng(seed, offset, mask, 1.0 - static_cast<double>(p));  // the same double in the fwd and bwd graphs
  return mask;
}

struct Layout {  // cuDNN [b, h, s, d] strides of our tensors
  Dims q, kt, v, vt, o, kv, stats;
};

Layout layout_of(const AttnShape& a) {
  const int64_t hpg = a.nq / a.ng, d = a.d;
  const int64_t q_head = hpg == 1 ? a.q_group : d;  // uniform head stride (checked by the caller)
  Layout l;
  l.q = {a.q_batch, q_head, a.q_row, 1};
  l.kt = {a.kv_batch, a.kv_group, 1, a.kv_row};  // K^T, V^T: [b, ng, d, s]
  l.v = {a.kv_batch, a.kv_group, a.kv_row, 1};
  l.vt = l.kt;
  l.kv = l.v;
  l.o = {a.nq * d, d, a.b * a.nq * d, 1};
  l.stats = {a.nq * a.s, a.s, 1, 1};
  return l;
}

std::unique_ptr<Graph> build_fwd(cudnnHandle_t h, const AttnShape& a) {
  auto g = std::make_unique<Graph>();
  const Layout l = layout_of(a);
  const int64_t B = a.b, H = a.nq, G = a.ng, S = a.s, D = a.d;
  const Dims ss{B, H, S, S}, s1{B, H, S, 1};
  auto q = g->tensor(kQ, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.q);
  auto kt = g->tensor(kK, CUDNN_DATA_BFLOAT16, {B, G, D, S}, l.kt);
  auto v = g->tensor(kV, CUDNN_DATA_BFLOAT16, {B, G, S, D}, l.v);
  auto o = g->tensor(kO, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.o);
  auto stats = g->tensor(kStats, CUDNN_DATA_FLOAT, s1, l.stats);
  auto scale = g->scalar(kScale);
  auto s0 = g->virt(4, CUDNN_DATA_FLOAT, ss);
  g->matmul(q, kt, s0);
  auto s_scaled = g->virt(6, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_MUL, s0, scale, s_scaled);
  auto s_masked = a.causal ? g->causal_mask(s_scaled, ss, {7, 9, 10, kNegInfFwd, 12}) : s_scaled;
  auto m = g->virt(14, CUDNN_DATA_FLOAT, s1);
  g->reduction(CUDNN_REDUCE_TENSOR_MAX, s_masked, m);
  auto sub = g->virt(15, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_SUB, s_masked, m, sub);
  auto e = g->virt(16, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_EXP, sub, nullptr, e);
  auto z = g->virt(17, CUDNN_DATA_FLOAT, s1);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  auto logz = g->virt(18, CUDNN_DATA_FLOAT, s1);
  g->pointwise(CUDNN_POINTWISE_LOG, z, nullptr, logz);
  g->pointwise(CUDNN_POINTWISE_ADD, m, logz, stats);
  const bool drop = a.drop_p > 0.0f;
  auto p = g->virt(13, drop ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16, ss);
  g->pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  if (drop) {  // P mask / (1 - p), rounded to bf16 for P V
    auto mask = g->dropout_mask(50, ss, a.drop_p);
    auto pm = g->virt(51, CUDNN_DATA_FLOAT, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, p, mask, pm);
    auto pd = g->virt(52, CUDNN_DATA_BFLOAT16, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, pm, g->scalar(kDropScale), pd);
    p = pd;
  }
  g->matmul(p, v, o);
  g->build(h);
  return g;
}

std::unique_ptr<Graph> build_bwd(cudnnHandle_t h, const AttnShape& a, bool deterministic) {
  auto g = std::make_unique<Graph>();
  const Layout l = layout_of(a);
  const int64_t B = a.b, H = a.nq, G = a.ng, S = a.s, D = a.d;
  const Dims ss{B, H, S, S}, s1{B, H, S, 1}, sst_str{H * S * S, S * S, 1, S};
  auto q = g->tensor(kQ, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.q);
  auto kt = g->tensor(kK, CUDNN_DATA_BFLOAT16, {B, G, D, S}, l.kt);
  auto vt = g->tensor(kV, CUDNN_DATA_BFLOAT16, {B, G, D, S}, l.vt);
  auto o = g->tensor(kO, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.o);
  auto dout = g->tensor(kDO, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.o);
  auto stats = g->tensor(kStats, CUDNN_DATA_FLOAT, s1, l.stats);
  auto dq = g->tensor(kDQ, CUDNN_DATA_BFLOAT16, {B, H, S, D}, l.q);
  auto dk = g->tensor(kDK, CUDNN_DATA_BFLOAT16, {B, G, S, D}, l.kv);
  auto dv = g->tensor(kDV, CUDNN_DATA_BFLOAT16, {B, G, S, D}, l.kv);
  auto softmax_sum = g->tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, s1, l.stats);
  const bool drop = a.drop_p > 0.0f;
  auto scale = g->scalar(kScale), one = g->scalar(drop ? kDropScaleInv : kOne);
  // softmax_sum = rowsum(dO * O) * 1 (dropout: * (1 - p))
  auto doo = g->tensor(4, CUDNN_DATA_FLOAT, {B, H, S, D}, {H * S * D, S * D, H * D, 1}, true);
  g->pointwise(CUDNN_POINTWISE_MUL, dout, o, doo);
  auto rs = g->virt(6, CUDNN_DATA_FLOAT, s1);
  g->reduction(CUDNN_REDUCE_TENSOR_ADD, doo, rs);
  g->pointwise(CUDNN_POINTWISE_MUL, rs, one, softmax_sum);
  // P = exp(mask(Q K^T scale - Stats))
  auto s0 = g->virt(14, CUDNN_DATA_FLOAT, ss);
  g->matmul(q, kt, s0);
  auto s_scaled = g->virt(15, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_MUL, s0, scale, s_scaled);
  auto s_sub = g->virt(16, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_SUB, s_scaled, stats, s_sub);
  auto s_masked = a.causal ? g->causal_mask(s_sub, ss, {17, 18, 19, kNegInfBwd, 21}) : s_sub;
  auto p = g->virt(22, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_EXP, s_masked, nullptr, p);
  // dV = P^T dO (dropout: (P mask / (1 - p))^T dO)
  cudnnBackendDescriptor_t mask = nullptr, drop_scale = nullptr, p_used = p;
  if (drop) {
    mask = g->dropout_mask(50, ss, a.drop_p);
    drop_scale = g->scalar(kDropScale);
    auto pm = g->virt(51, CUDNN_DATA_FLOAT, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, p, mask, pm);
    p_used = g->virt(52, CUDNN_DATA_FLOAT, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, pm, drop_scale, p_used);
  }
  auto pt = g->tensor(23, CUDNN_DATA_BFLOAT16, ss, sst_str, true);
  g->reshape(p_used, pt);
  // GQA (G < H): dK / dV per query head into bf16 virtual [B, H, S, D] tensors (packed), then summed over
  // each group's heads by a reduction node into the [B, G, S, D] outputs — cudnn-frontend's dK_fullhead /
  // dV_fullhead lowering (Q's data type there: fp32 full-head tensors gave unwritten / wrong dK, dV).
  auto group_sum = [&](int64_t uid, cudnnBackendDescriptor_t a_op, cudnnBackendDescriptor_t b_op,
                       cudnnBackendDescriptor_t out) {
    if (G == H) return g->matmul(a_op, b_op, out);
    auto full = g->virt(uid, CUDNN_DATA_BFLOAT16, {B, H, S, D});
    g->matmul(a_op, b_op, full);
    g->reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  group_sum(kDVFull, pt, dout, dv);
  // dS = P (dO V^T - softmax_sum) scale (dropout: P (dO V^T mask - softmax_sum) / (1 - p) scale)
  auto dp = g->virt(24, CUDNN_DATA_FLOAT, ss);
  g->matmul(dout, vt, dp);
  if (drop) {
    auto dpm = g->virt(53, CUDNN_DATA_FLOAT, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, dp, mask, dpm);
    dp = dpm;
  }
  auto dp_sub = g->virt(25, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_sub);
  auto ds0 = g->virt(26, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_MUL, dp_sub, p, ds0);
  if (drop) {
    auto ds1 = g->virt(54, CUDNN_DATA_FLOAT, ss);
    g->pointwise(CUDNN_POINTWISE_MUL, ds0, drop_scale, ds1);
    ds0 = ds1;
  }
  auto ds = g->virt(27, CUDNN_DATA_FLOAT, ss);
  g->pointwise(CUDNN_POINTWISE_MUL, ds0, scale, ds);
  // dK = dS^T Q
  auto dst = g->tensor(28, CUDNN_DATA_BFLOAT16, ss, sst_str, true);
  g->reshape(ds, dst);
  group_sum(kDKFull, dst, q, dk);
  // dQ = dS K (default: an fp32 accumulator, then bf16; deterministic: straight into bf16 dQ)
  if (deterministic) {
    // K's own strides on the reshaped view (as cudnn-frontend sets them): this engine reads K through
    // them (packed strides there gave a wrong dQ on the H200), bf16 like K.
    auto k_rows = g->tensor(29, CUDNN_DATA_BFLOAT16, {B, G, S, D}, l.kv, true);
    g->reshape(kt, k_rows);
    g->matmul(ds, k_rows, dq);
  } else {
    auto k_rows = g->virt(29, CUDNN_DATA_FLOAT, {B, G, S, D});
    g->reshape(kt, k_rows);
    auto dq_acc = g->tensor(kDQAcc, CUDNN_DATA_FLOAT, {B, H, S, D}, packed({B, H, S, D}));
    g->matmul(ds, k_rows, dq_acc);
    g->pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, nullptr, dq);
  }
  g->build(h);
  return g;
}

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, float>;  // (bwd, deterministic bwd, shape..., layout..., dropout p)

struct CachedPlan {
  std::unique_ptr<Graph> graph;  // nullptr: no engine for this key
  std::list<Key>::iterator lru;  // its place in State::lru
};

struct State {
  cudnnHandle_t handle = nullptr;
  bool handle_failed = false;
  std::map<Key, CachedPlan> plans;
  std::list<Key> lru;  // most recently used first
  int64_t capacity = ops::kDefaultCudnnPlanCacheCapacity;
  std::atomic<int64_t> fwd_calls{0}, bwd_calls{0}, bwd_gqa_calls{0}, bwd_gqa_repeat_calls{0};  // cudnn counts
  std::atomic<int64_t> plans_built{0}, plans_evicted{0};
};

State& state() {
  static State st;
  return st;
}

// Evicts the least recently used plans beyond the capacity, after the device has drained (a queued kernel
// may belong to an evicted plan). Not while `s` is capturing: a synchronization would break the capture.
void evict_beyond_capacity(State& st, cudaStream_t s) {
  if (static_cast<int64_t>(st.plans.size()) <= st.capacity) return;
  if (s) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    MCPP_CUDA_CHECK(cudaStreamIsCapturing(s, &cap));
    if (cap != cudaStreamCaptureStatusNone) return;
  }
  MCPP_CUDA_CHECK(cudaDeviceSynchronize());
  while (static_cast<int64_t>(st.plans.size()) > st.capacity) {
    st.plans.erase(st.lru.back());
    st.lru.pop_back();
    ++st.plans_evicted;
  }
}

// The cached plan for (direction, shape, layout), built on first use; nullptr when cuDNN refuses it.
// deterministic: the backward's deterministic graph (ignored for the forward, which has no atomics).
Graph* plan_for(bool bwd, bool deterministic, const AttnShape& a, cudaStream_t s) {
  State& st = state();
  if (st.handle_failed) return nullptr;
  if (!st.handle && cudnnCreate(&st.handle) != CUDNN_STATUS_SUCCESS) {
    st.handle_failed = true;
    std::fprintf(stderr, "[mcpp] cuDNN unavailable (cudnnCreate failed): attention runs on the mcpp kernels\n");
    return nullptr;
  }
  deterministic = bwd && deterministic;
  const Key key{bwd,      deterministic, a.s,       a.b,        a.nq,       a.ng,        a.d,     a.causal,
                a.q_row,  a.q_batch,     a.q_group, a.kv_row,   a.kv_batch, a.kv_group, a.drop_p};
  auto it = st.plans.find(key);
  if (it != st.plans.end()) {
    st.lru.splice(st.lru.begin(), st.lru, it->second.lru);  // now the most recently used
    return it->second.graph.get();
  }
  std::unique_ptr<Graph> g;
  try {
    g = bwd ? build_bwd(st.handle, a, deterministic) : build_fwd(st.handle, a);
  } catch (const Refused& r) {
    char msg[512] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    std::fprintf(stderr,
                 "[mcpp] cuDNN fused attention %s has no engine for s=%lld b=%lld nq=%lld ng=%lld d=%lld "
                 "causal=%d dropout=%g (%s: %s%s%s): %s\n",
                 bwd ? (deterministic ? "deterministic backward" : "backward") : "forward",
                 static_cast<long long>(a.s), static_cast<long long>(a.b),
                 static_cast<long long>(a.nq), static_cast<long long>(a.ng), static_cast<long long>(a.d),
                 a.causal ? 1 : 0, static_cast<double>(a.drop_p), r.what, cudnnGetErrorString(r.status),
                 msg[0] ? "; " : "", msg,
                 bwd && a.nq != a.ng ? "the MHA graph on repeated k/v instead" : "using the mcpp flash kernels");
    g.reset();
  }
  ++st.plans_built;
  st.lru.push_front(key);
  it = st.plans.emplace(key, CachedPlan{std::move(g), st.lru.begin()}).first;
  Graph* plan = it->second.graph.get();
  evict_beyond_capacity(st, s);  // never the new plan: it is the most recently used, and capacity >= 1
  return plan;
}

void execute(Graph& g, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs, cudaStream_t s) {
  State& st = state();
  void* ws = nullptr;
  if (g.workspace > 0) MCPP_CUDA_CHECK(cudaMallocAsync(&ws, static_cast<size_t>(g.workspace), s));
  cudnnBackendDescriptor_t vp = nullptr;
  auto raise = [&](const char* what, cudnnStatus_t e) {
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (ws) cudaFreeAsync(ws, s);
    char msg[512] = {0};
    cudnnGetLastErrorString(msg, sizeof msg);
    mcpp::fail("cuDNN fused attention: {} failed: {}{}{}", what, cudnnGetErrorString(e), msg[0] ? "; " : "", msg);
  };
  cudnnStatus_t e = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
  if (e != CUDNN_STATUS_SUCCESS) raise("variant pack", e);
  const int64_t n = static_cast<int64_t>(uids.size());
  if ((e = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids.data())) ||
      (e = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data())) ||
      (e = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws)) ||
      (e = cudnnBackendFinalize(vp)))
    raise("variant pack", e);
  if ((e = cudnnSetStream(st.handle, s)) || (e = cudnnBackendExecute(st.handle, g.plan, vp))) raise("execute", e);
  cudnnBackendDestroyDescriptor(vp);
  if (ws) MCPP_CUDA_CHECK(cudaFreeAsync(ws, s));
}

bool layout_ok(const AttnShape& a) {
  // cuDNN addresses heads with one stride: split layouts always, the packed qkv only without GQA.
  return a.nq == a.ng || a.q_group == (a.nq / a.ng) * a.d;
}

// The MHA problem over k/v repeated to nq heads (gqa_bwd): head h = group h, q / dq where they were.
AttnShape repeated_kv(const AttnShape& a) {
  AttnShape m = a;
  m.ng = a.nq;
  m.q_group = a.d;  // head h at h * d: (h / r) * (r d) + (h % r) d in a's split layout
  m.kv_row = a.b * a.nq * a.d, m.kv_batch = a.nq * a.d, m.kv_group = a.d;
  return m;
}

// With dropout a call runs on cuDNN only if the forward and both backward graphs (default and deterministic;
// for GQA the native or the repeated-k/v one) have an engine: the same answer for a forward and its
// backward, so both use cuDNN's mask or both the mcpp kernels'. Without dropout: always true.
bool dropout_ready(const AttnShape& a, cudaStream_t s) {
  if (a.drop_p == 0.0f) return true;
  if (!plan_for(false, false, a, s)) return false;
  for (bool det : {false, true})
    if (!plan_for(true, det, a, s) && (a.nq == a.ng || !plan_for(true, det, repeated_kv(a), s))) return false;
  return true;
}

// Device [seed, offset] for the graph's RNG node (stream-ordered scratch, freed by the caller), or nullptr
// without dropout.
int64_t* philox_args(const AttnShape& a, cudaStream_t s) {
  if (a.drop_p == 0.0f) return nullptr;
  void* p = nullptr;
  MCPP_CUDA_CHECK(cudaMallocAsync(&p, 2 * sizeof(int64_t), s));
  launch_philox_args(static_cast<int64_t*>(p), a.drop_seed, a.drop_offset, a.drop_base, s);
  return static_cast<int64_t*>(p);
}

}  // namespace

namespace {
// GQA backward: this graph's dK = dS^T Q / dV = P^T dO would need a reduction over the group's heads
// (cuDNN refuses a matmul whose output has fewer heads than its inputs), so the MHA backward runs on k/v
// repeated to nq heads (contiguous scratch) into per-head dk/dv scratch, which launch_gqa_reduce_dkv sums
// per group (fp32, one bf16 rounding of the r = nq / ng per-head bf16 grads) into dk/dv. Extra traffic:
// 4 [s, b, nq, d] bf16 scratch tensors, small next to the attention itself.
bool gqa_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k, const void* v,
             const void* o, const float* lse, float* delta, const AttnShape& a, bool deterministic, cudaStream_t s) {
  const AttnShape m = repeated_kv(a);
  if (!plan_for(true, deterministic, m, s)) return false;
  const size_t bytes = sizeof(uint16_t) * static_cast<size_t>(a.s * a.b * a.nq * a.d);
  void* scratch = nullptr;  // k_exp, v_exp, dk_exp, dv_exp
  MCPP_CUDA_CHECK(cudaMallocAsync(&scratch, 4 * bytes, s));
  char* p = static_cast<char*>(scratch);
  void *ke = p, *ve = p + bytes, *dke = p + 2 * bytes, *dve = p + 3 * bytes;
  launch_gqa_expand_kv(ke, ve, k, v, a, s);
  const bool ran = cudnn_attention_bwd(dq, dke, dve, dout, q, ke, ve, o, lse, delta, m, deterministic, s);
  if (ran) launch_gqa_reduce_dkv(dk, dv, dke, dve, a, s);
  MCPP_CUDA_CHECK(cudaFreeAsync(scratch, s));
  return ran;
}
}  // namespace

bool cudnn_attention_fwd(void* o, float* lse, const void* q, const void* k, const void* v, const AttnShape& a,
                         cudaStream_t s) {
  if (!layout_ok(a) || !dropout_ready(a, s)) return false;
  Graph* g = plan_for(false, false, a, s);
  if (!g) return false;
  float scale = a.scale, ninf = -INFINITY, drop_scale = 1.0f / (1.0f - a.drop_p);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), o, lse, &scale};
  if (a.causal) uids.push_back(kNegInfFwd), ptrs.push_back(&ninf);  // the pack must name exactly the graph's tensors
  int64_t* philox = philox_args(a, s);
  if (philox) {
    uids.insert(uids.end(), {kSeed, kOffset, kDropScale});
    ptrs.insert(ptrs.end(), {philox, philox + 1, &drop_scale});
  }
  execute(*g, uids, ptrs, s);
  if (philox) MCPP_CUDA_CHECK(cudaFreeAsync(philox, s));
  ++state().fwd_calls;
  return true;
}

bool cudnn_attention_bwd(void* dq, void* dk, void* dv, const void* dout, const void* q, const void* k,
                         const void* v, const void* o, const float* lse, float* delta, const AttnShape& a,
                         bool deterministic, cudaStream_t s) {
  if (!layout_ok(a) || !dropout_ready(a, s)) return false;
  Graph* g = plan_for(true, deterministic, a, s);
  if (!g && a.nq != a.ng) {  // no engine for the native GQA graph: the MHA graph on repeated k/v (counts bwd)
    if (!gqa_bwd(dq, dk, dv, dout, q, k, v, o, lse, delta, a, deterministic, s)) return false;
    ++state().bwd_gqa_calls, ++state().bwd_gqa_repeat_calls;
    return true;
  }
  if (!g) return false;
  if (a.nq != a.ng) ++state().bwd_gqa_calls;
  const bool drop = a.drop_p > 0.0f;
  float scale = a.scale, one = drop ? 1.0f - a.drop_p : 1.0f, ninf = -INFINITY, drop_scale = 1.0f / (1.0f - a.drop_p);
  std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kScale, drop ? kDropScaleInv : kOne, kSoftmaxSum, kDQ, kDK,
                            kDV};
  std::vector<void*> ptrs{const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(o),
                          const_cast<void*>(dout), const_cast<float*>(lse), &scale, &one, delta, dq, dk, dv};
  int64_t* philox = philox_args(a, s);
  if (philox) {
    uids.insert(uids.end(), {kSeed, kOffset, kDropScale});
    ptrs.insert(ptrs.end(), {philox, philox + 1, &drop_scale});
  }
  void* dq_acc = nullptr;  // the default graph's fp32 dQ accumulator (zeroed: the engine adds into it)
  if (!deterministic) {
    const size_t acc_bytes = sizeof(float) * static_cast<size_t>(a.b * a.nq * a.s * a.d);
    MCPP_CUDA_CHECK(cudaMallocAsync(&dq_acc, acc_bytes, s));
    MCPP_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, acc_bytes, s));
    uids.push_back(kDQAcc), ptrs.push_back(dq_acc);
  }
  if (a.causal) uids.push_back(kNegInfBwd), ptrs.push_back(&ninf);
  execute(*g, uids, ptrs, s);
  if (dq_acc) MCPP_CUDA_CHECK(cudaFreeAsync(dq_acc, s));
  if (philox) MCPP_CUDA_CHECK(cudaFreeAsync(philox, s));
  ++state().bwd_calls;
  return true;
}

}  // namespace mcpp::cuda_detail

namespace mcpp::ops {
CudnnAttentionCounts cuda_cudnn_attention_counts() {
  const auto& st = cuda_detail::state();
  return {.fwd = st.fwd_calls.load(),
          .bwd = st.bwd_calls.load(),
          .bwd_gqa = st.bwd_gqa_calls.load(),
          .bwd_gqa_repeat = st.bwd_gqa_repeat_calls.load(),
          .plans_cached = static_cast<int64_t>(st.plans.size()),
          .plans_built = st.plans_built.load(),
          .plans_evicted = st.plans_evicted.load()};
}

int64_t set_cudnn_plan_cache_capacity(int64_t capacity) {
  MCPP_CHECK(capacity >= 1, "set_cudnn_plan_cache_capacity: capacity must be >= 1, got {}", capacity);
  auto& st = cuda_detail::state();
  const int64_t old = st.capacity;
  st.capacity = capacity;
  cuda_detail::evict_beyond_capacity(st, nullptr);
  return old;
}
}  // namespace mcpp::ops

namespace mcpp {
int cudnn_version() { return static_cast<int>(cudnnGetVersion()); }  // core/device_memory.h: the loaded library's
}  // namespace mcpp
