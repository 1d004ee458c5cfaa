#include "mcpp/transformer/spec.h"

#include "mcpp/core/error.h"

namespace mcpp {

void SubmoduleCtx::throw_wrong_type() {
  fail("a layer submodule was handed the context of another implementation (one TransformerLayerCtx per layer)");
}

}  // namespace mcpp
