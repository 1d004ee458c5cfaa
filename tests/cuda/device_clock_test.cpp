// DeviceClock (core/device_clock.h) and the device-time pipeline timeline on the GPU:
//   - marks around queued work measure the work (a chain of large GEMMs: milliseconds) and two marks with
//     nothing between them measure ~nothing, though the host enqueued all of it in microseconds; the
//     host's own wait for the work is at least the device interval;
//   - bad ids and a mark during CUDA-graph capture are named errors; retired marks recycle their events,
//     and the timeline recorder retires each step it has read (a bounded number of live events);
//   - `--timeline` on the CUDA trainer records device time: the trace says "clock": "device", and on the
//     one compute stream every step's actions are back to back in schedule order (each starts at or after
//     the previous one's end), with each microbatch's forward and backward once per step.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cuda/cuda_test_util.h"
#include "mcpp/core/cuda_graph.h"
#include "mcpp/comm/local/local_communicator.h"
#include "mcpp/core/device_clock.h"
#include "mcpp/training/timeline.h"
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

// retire_before: retired ids are named errors, their events serve the next marks (live() stays small),
// retiring is monotonic and cannot pass the marks made.
TEST(CudaDeviceClock, RetiredMarksRecycleTheirEvents) {
  MCPP_REQUIRE_CUDA();
  DeviceClock clock;
  for (int i = 0; i < 10; ++i) clock.mark();
  clock.retire_before(5);
  EXPECT_EQ(clock.live(), 5);
  EXPECT_EQ(clock.size(), 10);
  EXPECT_NE(error_of([&] { clock.micros_between(4, 6); }).find("mark 4 is retired"), std::string::npos);
  EXPECT_GE(clock.micros_between(5, 9), 0.0);
  clock.retire_before(3);  // no-op
  EXPECT_EQ(clock.live(), 5);
  EXPECT_NE(error_of([&] { clock.retire_before(11); }).find("only 10 marks made"), std::string::npos);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(clock.mark(), 10 + i);
  clock.retire_before(15);
  EXPECT_EQ(clock.live(), 0);
  const int64_t a = clock.mark(), b = clock.mark();
  EXPECT_NEAR(clock.micros_between(a, b), 0.0, 100.0);
}

// The recorder reads each step's device times two steps later and retires its marks: over 30 steps of
// 3 actions (2 marks each, around a GEMM) only a few steps' events stay alive, and the trace's intervals
// are in order on the one stream with each action's duration the GEMM's.
TEST(CudaDeviceClock, TimelineRecorderRetiresReadSteps) {
  MCPP_REQUIRE_CUDA();
  const int64_t n = 1024;
  Tensor a = dev(rnd({n, n}, 1), DType::BF16), b = dev(rnd({n, n}, 2), DType::BF16);
  Tensor c = Tensor::empty({n, n}, DType::BF16, Device::CUDA);
  ops::linear_fwd(c, a, b, nullptr);
  comm::CommPtr world = comm::make_local_world();
  timeline::TimelineRecorder rec(0, 0, /*device_time=*/true);
  rec.start(*world);
  DeviceClock& clock = *rec.device_clock();
  int64_t max_live = 0;
  for (int step = 0; step < 30; ++step) {
    std::vector<pipeline_parallel::ActionTiming>* out = rec.begin_step();
    max_live = std::max(max_live, clock.live());
    for (int64_t m = 0; m < 3; ++m) {
      pipeline_parallel::ActionTiming t;
      t.action = pipeline_parallel::Action::forward(m, 0);
      t.device_start = clock.mark();
      ops::linear_fwd(c, a, b, nullptr);
      t.device_end = clock.mark();
      out->push_back(t);
    }
  }
  EXPECT_LE(max_live, 3 * 6 + 1);  // at most the last three steps' marks (+ the origin before the first read)
  const nlohmann::json evs = rec.events();
  ASSERT_EQ(evs.size(), 90u);
  double prev_end = 0.0;
  for (const auto& e : evs) {
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    EXPECT_GT(dur, 1.0) << e;
    EXPECT_GE(ts, prev_end - 1.0) << e;
    prev_end = ts + dur;
  }
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
  int64_t collectives = 0;  // the single rank's local communicator has no comm stream: no device-timed calls
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["tid"] == 2) {
      ++collectives;
      continue;
    }
    steps[e["args"]["step"].get<int64_t>()].push_back(e);
  }
  EXPECT_EQ(collectives, 0);
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
