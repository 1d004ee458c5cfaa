// FlightRecorder implementation: ring buffer indexed by id % capacity, JSON dump (schema in the header).
#include "mcpp/comm/flight_recorder.h"

#include <algorithm>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <xxhash.h>

#include <fmt/format.h>

#include "mcpp/core/error.h"
#include "mcpp/core/tensor.h"

namespace mcpp::comm {

const char* entry_state_name(EntryState s) {
  switch (s) {
    case EntryState::Queued: return "queued";
    case EntryState::Started: return "started";
    case EntryState::Done: return "done";
    case EntryState::Failed: return "failed";
  }
  return "?";
}

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t wall_now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string tensor_checksum(const Tensor& t) {
  if (!t.defined()) return "";
  const Tensor host = t.is_cpu() ? t : t.to(Device::CPU);
  return fmt::format("{:016x}", XXH3_64bits(host.raw(), host.nbytes()));
}

void FlightRecorder::set_checksums(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  checksums_ = on;
}

bool FlightRecorder::checksums() const {
  std::lock_guard<std::mutex> lock(mu_);
  return checksums_;
}

void FlightRecorder::set_result_checksum(uint64_t id, std::string checksum) {
  std::lock_guard<std::mutex> lock(mu_);
  if (RecordEntry* e = find_locked(id)) e->result_checksum = std::move(checksum);
}

FlightRecorder::FlightRecorder(int rank, int world_size, size_t capacity)
    : rank_(rank), world_size_(world_size), capacity_(capacity) {
  if (capacity == 0) fail("FlightRecorder: capacity must be >= 1 (got 0)");
  ring_.resize(capacity);
}

void FlightRecorder::ensure_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity <= capacity_) return;
  std::vector<RecordEntry> grown(capacity);
  for (uint64_t id = first_kept_; id < next_id_; ++id) grown[id % capacity] = std::move(ring_[id % capacity_]);
  ring_ = std::move(grown);
  capacity_ = capacity;
}

uint64_t FlightRecorder::record(RecordEntry e) {
  std::lock_guard<std::mutex> lock(mu_);
  e.id = next_id_++;
  e.state = EntryState::Queued;
  e.start_steady_ns = steady_now_ns();
  e.start_wall_us = wall_now_us();
  e.end_steady_ns = e.end_wall_us = 0;
  e.context = context_;
  ring_[e.id % capacity_] = std::move(e);
  if (next_id_ - first_kept_ > capacity_) first_kept_ = next_id_ - capacity_;  // the oldest was overwritten
  return next_id_ - 1;
}

void FlightRecorder::set_context(const CallContext& c) {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = c;
}

CallContext FlightRecorder::context() const {
  std::lock_guard<std::mutex> lock(mu_);
  return context_;
}

void FlightRecorder::set_device_clock(DeviceClock* clock) {
  std::lock_guard<std::mutex> lock(mu_);
  device_clock_ = clock;
}

DeviceClock* FlightRecorder::device_clock() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_clock_;
}

void FlightRecorder::set_device_marks(uint64_t id, int64_t start, int64_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  if (RecordEntry* e = find_locked(id)) e->device_start = start, e->device_end = end;
}

RecordEntry* FlightRecorder::find_locked(uint64_t id) {
  if (id < first_kept_ || id >= next_id_) return nullptr;  // overwritten or never recorded
  return &ring_[id % capacity_];
}

void FlightRecorder::mark_started(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (RecordEntry* e = find_locked(id); e && e->state == EntryState::Queued) e->state = EntryState::Started;
}

void FlightRecorder::finish_locked(uint64_t id, EntryState s) {
  RecordEntry* e = find_locked(id);
  if (!e || e->state == EntryState::Done || e->state == EntryState::Failed) return;
  e->state = s;
  e->end_steady_ns = steady_now_ns();
  e->end_wall_us = wall_now_us();
}

void FlightRecorder::mark_done(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  finish_locked(id, EntryState::Done);
}

void FlightRecorder::mark_failed(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  finish_locked(id, EntryState::Failed);
}

std::vector<RecordEntry> FlightRecorder::entries(uint64_t from_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RecordEntry> out;
  const uint64_t first = std::max(first_kept_, from_id);
  if (first >= next_id_) return out;
  out.reserve(static_cast<size_t>(next_id_ - first));
  for (uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

std::vector<RecordEntry> FlightRecorder::pending() const {  // copies only the pending few (the watchdog's poll)
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RecordEntry> out;
  for (uint64_t id = first_kept_; id < next_id_; ++id) {
    const RecordEntry& e = ring_[id % capacity_];
    if (e.state == EntryState::Queued || e.state == EntryState::Started) out.push_back(e);
  }
  return out;
}

size_t FlightRecorder::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

uint64_t FlightRecorder::total_recorded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_;
}

nlohmann::json entry_to_json(const RecordEntry& e) {
  return nlohmann::json{{"id", e.id},
                        {"group", e.group},
                        {"group_ranks", e.group_ranks},
                        {"seq", e.seq},
                        {"p2p_seq", e.p2p_seq},
                        {"op", e.op},
                        {"reduce_op", e.reduce_op},
                        {"dtype", e.dtype},
                        {"count", e.count},
                        {"peers", e.peers},
                        {"state", entry_state_name(e.state)},
                        {"start_steady_ns", e.start_steady_ns},
                        {"end_steady_ns", e.end_steady_ns},
                        {"start_wall_us", e.start_wall_us},
                        {"end_wall_us", e.end_wall_us},
                        {"iteration", e.context.iteration},
                        {"microbatch", e.context.microbatch},
                        {"pp_stage", e.context.pp_stage},
                        {"vp_chunk", e.context.vp_chunk},
                        {"payload_checksum", e.payload_checksum},
                        {"result_checksum", e.result_checksum}};
}

nlohmann::json FlightRecorder::dump_json(const std::string& reason) const {
  auto list = entries();
  nlohmann::json j{{"version", 1},
                   {"rank", rank_},
                   {"world_size", world_size_},
                   {"capacity", capacity()},
                   {"total_recorded", total_recorded()},
                   {"reason", reason},
                   {"dump_wall_time_us", wall_now_us()}};
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& e : list) arr.push_back(entry_to_json(e));
  j["entries"] = std::move(arr);
  return j;
}

void FlightRecorder::dump_to_file(const std::string& path, const std::string& reason) const {
  dump_to_file(path, reason, nlohmann::json::object());
}

void FlightRecorder::dump_to_file(const std::string& path, const std::string& reason,
                                  const nlohmann::json& extra) const {
  nlohmann::json j = dump_json(reason);
  for (const auto& [k, v] : extra.items()) j[k] = v;
  std::string text = j.dump(1);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail("flight recorder: cannot write dump file '{}' (rank {})", tmp, rank_);
    f << text << '\n';
    f.flush();
    if (!f) fail("flight recorder: write failed for '{}' (rank {})", tmp, rank_);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("flight recorder: cannot rename '{}' to '{}' (rank {}): {}", tmp, path, rank_, ec.message());
}

}  // namespace mcpp::comm
