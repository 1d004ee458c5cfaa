// --check-data-consistency: the microbatch hashes and the world's verdict (contract in data_consistency.h).
#include "mcpp/training/data_consistency.h"

#include <xxhash.h>

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mcpp/core/error.h"
#include "mcpp/parallel_state/parallel_context.h"

namespace mcpp {
namespace {

constexpr int kHeader = 6;  // rank, tp / cp / pp / dp group ids, micro batch size
constexpr int kPerMicrobatch = 3;

void hash_bytes(XXH3_state_t* st, const Tensor& t) {
  if (!t.defined()) return;
  MCPP_CHECK(t.is_cpu(), "--check-data-consistency: the batch is hashed on the host (got a {} tensor)", t.str());
  XXH3_64bits_update(st, t.raw(), t.nbytes());
}

// The members of each group id of one kind (tp / cp / pp / dp), in global-rank order.
std::map<int, std::vector<const RankDataRecord*>> groups_of(const std::vector<const RankDataRecord*>& ranks,
                                                            int RankDataRecord::*id) {
  std::map<int, std::vector<const RankDataRecord*>> out;
  for (const RankDataRecord* r : ranks) out[r->*id].push_back(r);
  return out;
}

std::string ranks_of(const std::vector<const RankDataRecord*>& members) {
  std::vector<int> v;
  for (const RankDataRecord* m : members) v.push_back(m->rank);
  return fmt::format("[{}]", fmt::join(v, ", "));
}

// TP / CP / PP peers: identical hashes, microbatch by microbatch. "" or the diagnosis.
std::string check_peers(int64_t iteration, const char* kind, const std::vector<const RankDataRecord*>& members) {
  const RankDataRecord& ref = *members.front();
  for (const RankDataRecord* m : members)
    if (m->microbatches.size() != ref.microbatches.size())
      return fmt::format("--check-data-consistency: iteration {}: the {} group {} disagrees on the number of "
                         "microbatches: global rank {} trained {}, global rank {} trained {}",
                         iteration, kind, ranks_of(members), ref.rank, ref.microbatches.size(), m->rank,
                         m->microbatches.size());
  for (size_t mb = 0; mb < ref.microbatches.size(); ++mb) {
    std::map<uint64_t, size_t> count;  // hash -> members holding it
    for (const RankDataRecord* m : members) ++count[m->microbatches[mb].hash];
    if (count.size() == 1) continue;
    const auto majority = std::max_element(count.begin(), count.end(),
                                           [](const auto& a, const auto& b) { return a.second < b.second; });
    const bool strict = majority->second * 2 > members.size();  // else (e.g. 2 members) no side can be blamed
    std::vector<int> differ;
    std::string hashes;
    for (const RankDataRecord* m : members) {
      const MicrobatchDigest& d = m->microbatches[mb];
      if (!strict || d.hash != majority->first) differ.push_back(m->rank);
      hashes += fmt::format("{}rank {}: {:016x} (samples {}..{})", hashes.empty() ? "" : ", ", m->rank, d.hash,
                            d.first_sample, d.first_sample + m->micro_batch_size - 1);
    }
    return fmt::format("--check-data-consistency: iteration {}: the {} group {} disagrees on microbatch {}: {} ({}); "
                       "the {} peers of one sample must train on the same tokens, labels, loss mask and position ids",
                       iteration, kind, ranks_of(members), mb,
                       strict ? fmt::format("global rank(s) [{}] differ from the other members", fmt::join(differ, ", "))
                              : fmt::format("global ranks [{}] hold different batches (no majority to blame)",
                                            fmt::join(differ, ", ")),
                       hashes, kind);
  }
  return "";
}

// DP ranks: disjoint sample intervals, no byte-identical microbatches of different samples.
std::string check_dp(int64_t iteration, const std::vector<const RankDataRecord*>& members) {
  for (size_t i = 0; i < members.size(); ++i)
    for (size_t j = i + 1; j < members.size(); ++j) {
      const RankDataRecord &a = *members[i], &b = *members[j];
      for (size_t x = 0; x < a.microbatches.size(); ++x)
        for (size_t y = 0; y < b.microbatches.size(); ++y) {
          const MicrobatchDigest &p = a.microbatches[x], &q = b.microbatches[y];
          const bool overlap = p.first_sample < q.first_sample + b.micro_batch_size &&
                               q.first_sample < p.first_sample + a.micro_batch_size;
          if (overlap)
            return fmt::format("--check-data-consistency: iteration {}: the dp group {} is not disjoint: global rank "
                               "{} microbatch {} (samples {}..{}) and global rank {} microbatch {} (samples {}..{}) "
                               "overlap; data-parallel ranks must see disjoint samples",
                               iteration, ranks_of(members), a.rank, x, p.first_sample,
                               p.first_sample + a.micro_batch_size - 1, b.rank, y, q.first_sample,
                               q.first_sample + b.micro_batch_size - 1);
          if (p.hash == q.hash && p.dataset_index != q.dataset_index)
            return fmt::format("--check-data-consistency: iteration {}: the dp group {} trains identical batches: "
                               "global rank {} microbatch {} (samples {}..) and global rank {} microbatch {} (samples "
                               "{}..) hash to {:016x}; data-parallel ranks must see disjoint samples",
                               iteration, ranks_of(members), a.rank, x, p.first_sample, b.rank, y, q.first_sample,
                               p.hash);
        }
    }
  return "";
}

}  // namespace

uint64_t microbatch_hash(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                         const Tensor& position_ids) {
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  for (const Tensor* t : {&tokens, &labels, &loss_mask, &position_ids}) hash_bytes(st, *t);
  const uint64_t h = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return h;
}

std::string data_consistency_verdict(int64_t iteration, const std::vector<RankDataRecord>& ranks) {
  std::vector<const RankDataRecord*> sorted;
  for (const RankDataRecord& r : ranks) sorted.push_back(&r);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
  const std::pair<const char*, int RankDataRecord::*> peer_kinds[] = {
      {"tp", &RankDataRecord::tp_group}, {"cp", &RankDataRecord::cp_group}, {"pp", &RankDataRecord::pp_group}};
  for (const auto& [kind, id] : peer_kinds)
    for (const auto& [g, members] : groups_of(sorted, id))
      if (members.size() > 1)
        if (std::string v = check_peers(iteration, kind, members); !v.empty()) return v;
  for (const auto& [g, members] : groups_of(sorted, &RankDataRecord::dp_group))
    if (members.size() > 1)
      if (std::string v = check_dp(iteration, members); !v.empty()) return v;
  return "";
}

void check_data_consistency(const parallel_state::ParallelContext& pc, int64_t iteration, int64_t micro_batch_size,
                            std::vector<MicrobatchDigest> microbatches) {
  // (in sample order: a schedule builds its microbatches in first-use order, the same on every stage)
  std::sort(microbatches.begin(), microbatches.end(),
            [](const MicrobatchDigest& a, const MicrobatchDigest& b) { return a.first_sample < b.first_sample; });
  // Every rank trains the same number of microbatches per step (the config's); the record's length is fixed by it.
  const auto n = static_cast<int64_t>(microbatches.size());
  const int64_t len = kHeader + kPerMicrobatch * n;
  Tensor mine = Tensor::empty({len}, DType::I64);
  int64_t* p = mine.data<int64_t>();
  auto id = [&](const comm::CommPtr& g) { return g ? g->global_ranks().front() : pc.rank(); };  // a group's name
  p[0] = pc.rank();
  p[1] = id(pc.tp());
  p[2] = id(pc.cp());
  p[3] = id(pc.pp());
  p[4] = id(pc.dp());
  p[5] = micro_batch_size;
  for (int64_t m = 0; m < n; ++m) {
    const MicrobatchDigest& d = microbatches[static_cast<size_t>(m)];
    p[kHeader + kPerMicrobatch * m] = static_cast<int64_t>(d.hash);
    p[kHeader + kPerMicrobatch * m + 1] = d.first_sample;
    p[kHeader + kPerMicrobatch * m + 2] = d.dataset_index;
  }
  comm::Communicator& world = pc.world()->host();
  Tensor all = Tensor::empty({len * world.size()}, DType::I64);
  world.all_gather(all, mine).wait();
  std::vector<RankDataRecord> records(static_cast<size_t>(world.size()));
  for (int r = 0; r < world.size(); ++r) {
    const int64_t* q = all.data<int64_t>() + len * r;
    RankDataRecord& rec = records[static_cast<size_t>(r)];
    rec.rank = static_cast<int>(q[0]);
    rec.tp_group = static_cast<int>(q[1]);
    rec.cp_group = static_cast<int>(q[2]);
    rec.pp_group = static_cast<int>(q[3]);
    rec.dp_group = static_cast<int>(q[4]);
    rec.micro_batch_size = q[5];
    for (int64_t m = 0; m < n; ++m)
      rec.microbatches.push_back({.hash = static_cast<uint64_t>(q[kHeader + kPerMicrobatch * m]),
                                  .first_sample = q[kHeader + kPerMicrobatch * m + 1],
                                  .dataset_index = q[kHeader + kPerMicrobatch * m + 2]});
  }
  if (std::string v = data_consistency_verdict(iteration, records); !v.empty()) throw Error(v);
}

}  // namespace mcpp
