// DeviceClock (core/device_clock.h) and the device-time pipeline timeline on the GPU:
//   - marks around queued work measure the work (a chain of large GEMMs: milliseconds) and two marks with
//     nothing between them measure ~nothing, though the host enqueued all of it in microseconds; the
//     host's own wait for the work is at least the device interval;
//   - bad ids and a mark during CUDA-graph capture are named errors;
//   - `--timeline` on the CUDA trainer records device time: the trace says "clock": "device", and on the
//     one compute stream every step's actions are back to back in schedule order (each starts at or after
//     the previous one's end), with each microbatch's forward and backward once per step.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/cuda_test_util.h"
#include "mcpp/core/cuda_graph.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/training/trainer.h"
#include "training/trainer_test_util.h"

namespace mcpp::cuda_test {
namespace {

using training_test::error_of;

TEST(CudaDeviceClock, MarksMeasureTheQueuedWorkNotTheLaunches) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 4096;
  Tensor a = dev(rnd({n, n}, 1), DType::BF16), b = dev(rnd({n, n}, 2), DType::BF16);
  Tensor c = Tensor::empty({n, n}, DType::BF16, Device::CUDA);
  ops::linear_fwd(c, a, b, nullptr);  // plans and workspace outside the measured region
  cuda_synchronize();
  DeviceClock clock;
  const auto host0 = std::chrono::steady_clock::now();
  const int64_t m0 = clock.mark();
  for (int i = 0; i < 40; ++i) ops::linear_fwd(c, a, b, nullptr);  // 40 x 137 GFLOP: several ms on any GPU
  const int64_t m1 = clock.mark();
  const int64_t m2 = clock.mark();
  const double enqueue_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host0).count();
  const double work_us = clock.micros_between(m0, m1);  // waits for m1
  const double host_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - host0).count();
  EXPECT_EQ(clock.size(), 3);
  EXPECT_GT(work_us, 1000.0);
  EXPECT_LT(clock.micros_between(m1, m2), 100.0);
  EXPECT_NEAR(clock.micros_between(m1, m0), -work_us, 1.0);
  EXPECT_GE(host_us, work_us);
  std::printf("[ measured ] 40 GEMMs %lldx%lld: device %.0f us, host enqueue %.0f us\n", static_cast<long long>(n),
              static_cast<long long>(n), work_us, enqueue_us);
  EXPECT_NE(error_of([&] { clock.micros_between(0, 3); }).find("3 marks made"), std::string::npos);
  CudaGraph g;
  const std::string e = error_of([&] { g.capture([&] { clock.mark(); }); });
  EXPECT_NE(e.find("captured into a CUDA graph"), std::string::npos) << e;
}

TEST(CudaDeviceClock, TrainerTimelineIsInDeviceTime) {
  MCPP_REQUIRE_CUDA();
  const auto dir = std::filesystem::temp_directory_path() / ("mcpp_cuda_timeline_" + std::to_string(::getpid()));
  Config c = training_test::gpu_train_config(training_test::make_corpus(dir));
  c.training.bf16 = true;
  c.training.timeline = (dir / "trace.json").string();
  c.validate();
  const TrainSummary s = Trainer(c, 99, training_test::single()).train();
  ASSERT_EQ(s.losses.size(), 8u);
  nlohmann::json trace;
  std::ifstream(c.training.timeline) >> trace;
  std::filesystem::remove_all(dir);
  EXPECT_EQ(trace["otherData"]["clock"], "device");
  const int64_t micro = c.num_microbatches();
  std::map<int64_t, std::vector<nlohmann::json>> steps;
  for (const auto& e : trace["traceEvents"])
    if (e["ph"] == "X") steps[e["args"]["step"].get<int64_t>()].push_back(e);
  ASSERT_EQ(steps.size(), 8u);
  for (const auto& [step, evs] : steps) {
    int64_t fwd = 0, bwd = 0;
    double prev_end = -1.0;
    for (const auto& e : evs) {
      const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
      EXPECT_GE(dur, 0.0) << "step " << step << " " << e["name"];
      EXPECT_GE(ts, prev_end - 1.0) << "step " << step << " " << e["name"] << " starts before the previous action ends";
      prev_end = ts + dur;
      fwd += e["cat"] == "forward";
      bwd += e["cat"] == "backward";
    }
    EXPECT_EQ(fwd, micro) << "step " << step;
    EXPECT_EQ(bwd, micro) << "step " << step;
  }
}

}  // namespace
}  // namespace mcpp::cuda_test
