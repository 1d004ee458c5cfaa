// libFuzzer target: a Megatron indexed dataset (.idx index + .bin tokens; the input is "<idx>\n--\n<bin>"):
// IndexedDataset::open validates the index against the data file, then every sequence is read back whole.
#include <cstddef>
#include <cstdint>

#include "mcpp/datasets/indexed_dataset.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = mcpp::fuzz::scratch("d");
  const auto parts = mcpp::fuzz::split(data, size, 2);
  if (!mcpp::fuzz::write_file(prefix + ".idx", parts[0]) || !mcpp::fuzz::write_file(prefix + ".bin", parts[1]))
    return 0;
  MCPP_FUZZ_CALL({
    const mcpp::IndexedDataset ds = mcpp::IndexedDataset::open(prefix);
    for (int64_t i = 0; i < ds.num_sequences() && i < 64; ++i) ds.get(i);
  });
  return 0;
}
