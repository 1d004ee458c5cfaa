// bf16 / fp16 user-defined MPI reductions (convert to fp32, combine, round back) and dtype mapping.
#include "mcpp/comm/mpi/mpi_reduce_ops.h"

#include <algorithm>

#include "mcpp/comm/mpi/mpi_check.h"
#include "mcpp/core/error.h"

namespace mcpp::comm::mpi {

namespace {

MPI_Op g_ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};

struct Bf16 {
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float f) { return f32_to_bf16(f); }
};
struct F16 {
  static float load(uint16_t v) { return f16_to_f32(v); }
  static uint16_t store(float f) { return f32_to_f16(f); }
};
struct Add { static float apply(float a, float b) { return a + b; } };
struct Mx { static float apply(float a, float b) { return std::max(a, b); } };
struct Mn { static float apply(float a, float b) { return std::min(a, b); } };

template <typename Conv, typename Fn>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = Conv::store(Fn::apply(Conv::load(a[i]), Conv::load(b[i])));
}

int op_index(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return 0;
    case ReduceOp::Max: return 1;
    case ReduceOp::Min: return 2;
  }
  return 0;
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  fail("mpi_datatype: unknown dtype");
}

MPI_Op mpi_reduce_op(DType t, ReduceOp op) {
  if (t == DType::BF16 || t == DType::F16) {
    MPI_Op o = g_ops[t == DType::BF16 ? 0 : 1][op_index(op)];
    if (o == MPI_OP_NULL) fail("MPI {} reduction ops not created: call comm::init_mpi first", dtype_name(t));
    return o;
  }
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

void create_reduce_ops() {
  if (g_ops[0][0] != MPI_OP_NULL) return;
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<Bf16, Add>, 1, &g_ops[0][0]));
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<Bf16, Mx>, 1, &g_ops[0][1]));
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<Bf16, Mn>, 1, &g_ops[0][2]));
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<F16, Add>, 1, &g_ops[1][0]));
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<F16, Mx>, 1, &g_ops[1][1]));
  MCPP_MPI_CHECK(MPI_Op_create(&half_op<F16, Mn>, 1, &g_ops[1][2]));
}

void free_reduce_ops() {
  for (auto& row : g_ops) {
    for (auto& o : row) {
      if (o != MPI_OP_NULL) MCPP_MPI_CHECK(MPI_Op_free(&o));
      o = MPI_OP_NULL;
    }
  }
}

}  // namespace mcpp::comm::mpi
