// Watchdog: turns a stuck collective into a named error on every rank (DESIGN.md decision 3).
//
// Contract:
//   - One background thread per process, watching the process's FlightRecorder (shared by all groups).
//     Every poll_seconds it checks (a) whether the oldest queued/started entry has been pending longer
//     than timeout_seconds, and (b) whether the run's abort marker <dump_dir>/flight_recorder/abort_<run>
//     exists (some other rank timed out).
//   - Every dump also holds the main thread's host stack when comm/host_stack.h's capture is installed (the CLI does).
//   - (a) first rank to create the marker (O_EXCL) is the *leader*: it dumps its ring to
//     <dump_dir>/flight_recorder/rank_<r>.json (schema: flight_recorder.h), waits up to grace_seconds for
//     every world rank's dump, compares them (analyze_dumps: a member of the stuck group whose last seq for
//     that group is below the stuck seq never entered it), prints ONE line on stderr
//       "error: distributed timeout: <op> (group '<g>' ranks [...], seq <s>, <dtype>, <n> elements) did not
//        complete within <t> s on rank <r>; ranks that never entered it: [...]; ... dumps: <dir>"
//     and calls on_abort(exit_code, line).
//   - (b) every other rank (inside a collective or not) dumps its ring, then waits up to
//     grace_seconds + follower_extra_seconds for the leader to end the job, then calls on_abort itself.
//   - The callback does the ending: the CLI passes comm::mpi_abort_action() (MPI_Abort, so mpiexec kills
//     every rank and exits non-zero); tests may pass a recorder of the call. Library code never exits.
//     After the callback returns the thread stops watching.
//   - The constructor is collective over `world`: rank 0 picks a run id and broadcasts it (one
//     "broadcast" entry in the recorder), so abort markers of earlier runs in the same dump_dir are
//     ignored. The destructor stops and joins the thread; destroy the Watchdog before finalize_mpi().
//   - Timeout: --distributed-timeout-minutes; env MCPP_DISTRIBUTED_TIMEOUT_SECONDS overrides it (tests).
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "mcpp/comm/communicator.h"
#include "mcpp/comm/flight_recorder.h"

namespace mcpp::comm {

struct WatchdogOptions {
  double timeout_seconds = 600.0;
  std::string dump_dir = {};  // dumps go to <dump_dir>/flight_recorder/ (created)
  double poll_seconds = 0.1;
  double grace_seconds = 5.0;           // leader: how long to wait for the other ranks' dumps
  double follower_extra_seconds = 5.0;  // follower: extra wait for the leader before aborting itself
  int exit_code = 3;
  std::function<void(int exit_code, const std::string& message)> on_abort = {};  // required
};

// --distributed-timeout-minutes in seconds; MCPP_DISTRIBUTED_TIMEOUT_SECONDS (a positive number) overrides.
// A non-positive result or a malformed env value is an mcpp::Error naming the flag / variable.
double distributed_timeout_seconds(double minutes);

// What the leader concludes from the dumps.
struct StuckReport {
  std::vector<int> never_entered;        // members whose last seq for the group is < the stuck seq
  std::vector<int> missing_dumps;        // members whose dump did not arrive within the grace period
  std::vector<std::string> other_ops;    // "rank R issued <op>" for members whose entry at seq differs
  std::string describe_stuck;            // "<op> (group 'g' ranks [...], seq s, dtype, n elements)"
};
// `dumps` maps global rank -> parsed dump JSON. Pure; used by the watchdog and tested directly.
StuckReport analyze_dumps(const RecordEntry& stuck, const std::map<int, nlohmann::json>& dumps);
std::string describe_entry(const RecordEntry& e);

class Watchdog {
 public:
  Watchdog(const CommPtr& world, WatchdogOptions opts);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  const std::string& dump_path() const { return dump_path_; }     // this rank's rank_<r>.json
  const std::string& marker_path() const { return marker_path_; }
  bool fired() const { return fired_.load(); }

 private:
  void loop();
  void lead(const RecordEntry& stuck);
  void follow();
  bool sleep_or_stop(double seconds);

  std::shared_ptr<FlightRecorder> rec_;
  int rank_, world_size_;
  WatchdogOptions opts_;
  std::string dir_, dump_path_, marker_path_;
  std::atomic<bool> fired_{false};
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
};

}  // namespace mcpp::comm
