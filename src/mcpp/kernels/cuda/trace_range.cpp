// NVTX implementation of core/trace_range.h (nvtx3 is header-only: no library to link).
#include "mcpp/core/trace_range.h"

#include <nvtx3/nvToolsExt.h>

namespace mcpp {

void trace_range_push(const char* name) { nvtxRangePushA(name); }
void trace_range_pop() { nvtxRangePop(); }

}  // namespace mcpp
