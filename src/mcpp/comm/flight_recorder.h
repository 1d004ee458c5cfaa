// FlightRecorder: an always-on, fixed-size ring of the communication calls this rank issued, shared by
// every Communicator of the rank (the world communicator and all groups made from it).
//
// Contract:
//   - Communicator records an entry *before* the backend call (state "queued"), marks it "started" once
//     the backend accepted it (the non-blocking MPI call was posted), and "done" when its Work completes
//     (Work::wait, or Work::test returning true). A call that throws before it is posted (bad arguments,
//     a --check-collectives mismatch) is marked "failed", so the watchdog never waits on it.
//   - The ring keeps the newest `capacity` entries (default 2048); older ones are overwritten.
//     ensure_capacity(n) grows it (never shrinks), keeping every entry it holds (the pipeline timeline
//     grows it so that a training step's calls are all still there when the step ends).
//   - Thread safety: every method takes the recorder's mutex; the watchdog thread reads (pending(),
//     dump_json()) while the training thread records.
//   - Device timing (the pipeline timeline on CUDA, training/timeline.h): while a DeviceClock is attached
//     (set_device_clock), a backend that runs its ops on a stream of its own (NCCL's comm stream) marks each
//     op's start and end there and stores the two mark ids in the entry (set_device_marks; -1 otherwise).
//     The clock must outlive its attachment (detach with nullptr); the marks are not in the dump.
//   - Sequence numbers are per group and counted by the Communicator: `seq` numbers the group's
//     collectives 1, 2, 3, ... (identical on every member when the program is correct); batch_p2p calls
//     number separately in `p2p_seq`, since pipeline stages legitimately issue different p2p counts.
//   - Training coordinates (hang forensics, `mcpp debug hang`): set_context() stamps every entry recorded after it
//     with the trainer's iteration, the schedule's microbatch, pipeline stage and virtual chunk (-1: unknown / outside
//     a schedule action). The trainer sets the iteration at each step; the pipeline schedule the rest per action.
//   - Payload checksums (--flight-recorder-checksums; set_checksums(true) on every rank): each entry also carries
//     payload_checksum, the XXH3 of the bytes this rank sends (a collective's input, taken before the call, an
//     all_reduce's too; a batch_p2p's sends), and, for the ops whose result must be bitwise identical on every member
//     (all_reduce, all_gather, broadcast), result_checksum, the XXH3 of the result when the Work completes. Hashing
//     reads the tensors on the host: on CUDA each checksum is a device-to-host copy that synchronizes (a debugging
//     mode; refused under CUDA graphs). `mcpp debug hang` names the first call whose result checksums differ.
//
// Dump JSON schema (rank_<r>.json, written by dump_json / the watchdog):
// {
//   "version": 1,
//   "rank": <int, global rank of the writer>,
//   "world_size": <int>,
//   "capacity": <int, ring size>,
//   "total_recorded": <int, entries ever recorded; > capacity means the oldest were overwritten>,
//   "reason": <string, why the dump was written, e.g. "timeout" or "abort requested by rank 2">,
//   "dump_wall_time_us": <int, microseconds since the Unix epoch>,
//   "host_stacks": [ {"thread": "main", "captured": <bool>, "frames": [<backtrace_symbols line>...]} ],  // optional:
//                                        // SIGUSR1 and watchdog dumps (comm/host_stack.h)
//   "entries": [                         // oldest first
//     { "id": <int, global recording index on this rank, starts at 0>,
//       "group": <string, group name: "world", "tp", ...>,
//       "group_ranks": [<int>...],       // member global ranks in group order
//       "seq": <int, per-group collective number, 1-based; 0 for batch_p2p>,
//       "p2p_seq": <int, per-group batch_p2p number, 1-based; 0 for collectives>,
//       "op": <string: all_reduce | all_gather | reduce_scatter | broadcast | all_to_all | batch_p2p | barrier>,
//       "reduce_op": <string: sum | avg | max | min, or "" when the op does not reduce>,
//       "dtype": <string: float32 | bfloat16 | float16 | int32 | int64 ("" for barrier)>,
//       "count": <int, elements this rank contributes (input numel; sum of sends for p2p)>,
//       "peers": [<int>...],             // batch_p2p only: peer global ranks; [] otherwise
//       "state": <string: queued | started | done | failed>,
//       "start_steady_ns": <int, steady clock at recording>, "end_steady_ns": <int, 0 until done/failed>,
//       "start_wall_us": <int, wall clock at recording>,     "end_wall_us": <int, 0 until done/failed>,
//       "iteration": <int>, "microbatch": <int>, "pp_stage": <int>, "vp_chunk": <int>,    // set_context; -1 unknown
//       "payload_checksum": <string, 16 hex digits, "" when not recorded>,
//       "result_checksum": <string, 16 hex digits, "" when not recorded or not yet done> }
//   ]
// }
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mcpp {
class DeviceClock;
class Tensor;
}

namespace mcpp::comm {

enum class EntryState { Queued, Started, Done, Failed };
const char* entry_state_name(EntryState s);

// Where in training a call is issued (set_context).
struct CallContext {
  int64_t iteration = -1, microbatch = -1, pp_stage = -1, vp_chunk = -1;
};

struct RecordEntry {
  uint64_t id = 0;
  CallContext context;
  std::string group;
  std::vector<int> group_ranks;
  uint64_t seq = 0;
  uint64_t p2p_seq = 0;
  std::string op;
  std::string reduce_op;
  std::string dtype;
  int64_t count = 0;
  std::vector<int> peers;
  EntryState state = EntryState::Queued;
  int64_t start_steady_ns = 0, end_steady_ns = 0;
  int64_t start_wall_us = 0, end_wall_us = 0;
  int64_t device_start = -1, device_end = -1;  // DeviceClock marks on the backend's stream (-1: none)
  std::string payload_checksum, result_checksum;  // see "Payload checksums" ("" when not recorded)
};

class FlightRecorder {
 public:
  static constexpr size_t kDefaultCapacity = 2048;
  // rank / world_size: the owner's global coordinates, written into dumps. capacity >= 1.
  FlightRecorder(int rank, int world_size, size_t capacity = kDefaultCapacity);

  void ensure_capacity(size_t capacity);
  // Stores `e` (its id, state and timestamps are assigned here) and returns its id.
  uint64_t record(RecordEntry e);
  void mark_started(uint64_t id);
  void mark_done(uint64_t id);
  void mark_failed(uint64_t id);
  // Payload checksums (the contract's): on / off for every communicator sharing this recorder.
  void set_checksums(bool on);
  bool checksums() const;
  void set_result_checksum(uint64_t id, std::string checksum);
  // Device timing (see the contract): the attached clock (nullptr: none) and an entry's two marks.
  void set_device_clock(DeviceClock* clock);
  DeviceClock* device_clock() const;
  void set_device_marks(uint64_t id, int64_t start, int64_t end);
  // The coordinates stamped on entries recorded from now on (the contract's "Training coordinates").
  void set_context(const CallContext& c);
  CallContext context() const;

  // Entries still queued or started, oldest first (the watchdog's view).
  std::vector<RecordEntry> pending() const;
  // The retained entries with id >= from_id (default: all), oldest first.
  std::vector<RecordEntry> entries(uint64_t from_id = 0) const;
  uint64_t total_recorded() const;
  size_t capacity() const;
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  nlohmann::json dump_json(const std::string& reason) const;
  // Writes dump_json to `path` atomically (temporary file + rename); throws mcpp::Error naming the path.
  void dump_to_file(const std::string& path, const std::string& reason) const;
  // The same with `extra`'s keys added to the dump's top level (the watchdog's and SIGUSR1's "host_stacks").
  void dump_to_file(const std::string& path, const std::string& reason, const nlohmann::json& extra) const;

 private:
  RecordEntry* find_locked(uint64_t id);
  void finish_locked(uint64_t id, EntryState s);

  int rank_, world_size_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::vector<RecordEntry> ring_;  // capacity_ slots; entry id at ring_[id % capacity_]
  uint64_t next_id_ = 0;
  uint64_t first_kept_ = 0;  // the oldest id still in the ring
  DeviceClock* device_clock_ = nullptr;
  CallContext context_;
  bool checksums_ = false;
};

nlohmann::json entry_to_json(const RecordEntry& e);
int64_t steady_now_ns();
int64_t wall_now_us();
// XXH3 of a contiguous tensor's bytes (a device tensor is copied to the host first), as 16 hex digits.
std::string tensor_checksum(const Tensor& t);

}  // namespace mcpp::comm
