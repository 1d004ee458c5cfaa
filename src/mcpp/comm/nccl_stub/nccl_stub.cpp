// Linked in a build without NCCL (no CUDA toolkit, or nccl.h / libnccl not found): the NCCL bootstrap
// reports it clearly instead of failing to link. The real backend is comm/nccl/.
#include "mcpp/comm/nccl/nccl_communicator.h"
#include "mcpp/core/error.h"

namespace mcpp::comm {

CommPtr init_nccl(const CommPtr&, int, const NcclInitOptions&) {
  fail("this mcpp was built without NCCL: multi-GPU training needs nccl.h and libnccl at build time "
       "(see docs/NCCL.md); use --device cpu for CPU ranks");
}

int nccl_version() { return 0; }

}  // namespace mcpp::comm
