// Hang forensics over the ranks' flight-recorder dumps (hang_analysis.h).
#include "mcpp/tools/hang_analysis.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <cxxabi.h>

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "mcpp/core/error.h"

namespace mcpp::tools {
namespace {

struct Call {
  int rank = 0;
  std::string group;
  std::vector<int> group_ranks;
  int64_t seq = 0, p2p_seq = 0, count = 0;
  std::string op, dtype, state;
  std::vector<int> peers;
  int64_t start_wall_us = 0;
  int64_t iteration = -1, microbatch = -1, pp_stage = -1, vp_chunk = -1;
  std::string payload_checksum, result_checksum;  // --flight-recorder-checksums ("" when not recorded)
  bool pending() const { return state == "queued" || state == "started"; }
};

Call parse_call(int rank, const nlohmann::json& e) {
  Call c;
  c.rank = rank;
  c.group = e.at("group").get<std::string>();
  c.group_ranks = e.at("group_ranks").get<std::vector<int>>();
  c.seq = e.at("seq").get<int64_t>();
  c.p2p_seq = e.at("p2p_seq").get<int64_t>();
  c.count = e.at("count").get<int64_t>();
  c.op = e.at("op").get<std::string>();
  c.dtype = e.at("dtype").get<std::string>();
  c.state = e.at("state").get<std::string>();
  c.peers = e.at("peers").get<std::vector<int>>();
  c.start_wall_us = e.at("start_wall_us").get<int64_t>();
  c.iteration = e.value("iteration", int64_t{-1});
  c.microbatch = e.value("microbatch", int64_t{-1});
  c.pp_stage = e.value("pp_stage", int64_t{-1});
  c.vp_chunk = e.value("vp_chunk", int64_t{-1});
  c.payload_checksum = e.value("payload_checksum", std::string());
  c.result_checksum = e.value("result_checksum", std::string());
  return c;
}

// "all_reduce seq 7 of group 'dp' [0, 2] (float32 x 12; iteration 3, microbatch 1, stage 0, chunk 0)"
std::string describe(const Call& c) {
  std::string where;
  if (c.iteration >= 0) where += fmt::format("iteration {}", c.iteration);
  if (c.microbatch >= 0) where += fmt::format(", microbatch {}", c.microbatch);
  if (c.pp_stage >= 0) where += fmt::format(", stage {}", c.pp_stage);
  if (c.vp_chunk >= 0) where += fmt::format(", chunk {}", c.vp_chunk);
  const std::string num = c.op == "batch_p2p" ? fmt::format("p2p_seq {} with peers [{}]", c.p2p_seq, fmt::join(c.peers, ", "))
                                              : fmt::format("seq {}", c.seq);
  return fmt::format("{} {} of group '{}' [{}] ({} x {}{}{})", c.op, num, c.group, fmt::join(c.group_ranks, ", "),
                     c.dtype.empty() ? "-" : c.dtype, c.count, where.empty() ? "" : "; ", where);
}

std::string group_key(const Call& c) { return fmt::format("{} [{}]", c.group, fmt::join(c.group_ranks, ",")); }

nlohmann::json call_json(const Call& c) {
  return {{"rank", c.rank},   {"group", c.group},         {"group_ranks", c.group_ranks}, {"op", c.op},
          {"seq", c.seq},     {"p2p_seq", c.p2p_seq},     {"dtype", c.dtype},             {"count", c.count},
          {"state", c.state}, {"iteration", c.iteration}, {"microbatch", c.microbatch},  {"pp_stage", c.pp_stage},
          {"vp_chunk", c.vp_chunk}, {"describe", describe(c)}};
}

// --flight-recorder-checksums: the earliest (group, seq) whose members all recorded a result checksum (all_reduce,
// all_gather, broadcast: results every member must hold bitwise) and disagree. The members outside the largest
// agreeing set are named; with no strict majority (e.g. 2 members) all of them.
void report_result_mismatch(const std::map<std::string, std::map<int64_t, std::vector<const Call*>>>& colls,
                            const std::map<std::string, std::vector<int>>& members, HangReport& rep) {
  const std::vector<const Call*>* first = nullptr;
  int64_t first_time = std::numeric_limits<int64_t>::max();
  bool any = false;
  for (const auto& [g, seqs] : colls)
    for (const auto& [seq, cs] : seqs) {
      if (cs.size() != members.at(g).size()) continue;
      if (!std::all_of(cs.begin(), cs.end(), [](const Call* c) { return !c->result_checksum.empty(); })) continue;
      any = true;
      const bool agree = std::all_of(cs.begin(), cs.end(),
                                     [&](const Call* c) { return c->result_checksum == cs.front()->result_checksum; });
      if (!agree && cs.front()->start_wall_us < first_time) first = &cs, first_time = cs.front()->start_wall_us;
    }
  if (!any) return;  // no checksums in the dumps
  if (!first) {
    rep.text += "result checksums: every all_reduce / all_gather / broadcast in the dumps agrees across its group\n";
    rep.json["result_mismatch"] = nullptr;
    return;
  }
  std::map<std::string, std::vector<int>> by_sum;
  for (const Call* c : *first) by_sum[c->result_checksum].push_back(c->rank);
  const auto majority = std::max_element(by_sum.begin(), by_sum.end(),
                                         [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
  const bool strict = majority->second.size() * 2 > first->size();
  std::vector<int> differ;
  for (const Call* c : *first)
    if (!strict || c->result_checksum != majority->first) differ.push_back(c->rank);
  std::sort(differ.begin(), differ.end());
  std::string sums;
  nlohmann::json js = nlohmann::json::object();
  for (const Call* c : *first) {
    sums += fmt::format("{}rank {} {}", sums.empty() ? "" : ", ", c->rank, c->result_checksum);
    js[std::to_string(c->rank)] = c->result_checksum;
  }
  rep.text += fmt::format("first result mismatch (--flight-recorder-checksums): {}: result checksums {}; {}\n",
                          describe(*first->front()), sums,
                          strict ? fmt::format("ranks [{}] differ from the other members (a silent data corruption "
                                               "on them or their link)", fmt::join(differ, ", "))
                                 : fmt::format("no majority: ranks [{}] disagree", fmt::join(differ, ", ")));
  nlohmann::json mj = call_json(*first->front());
  mj["result_checksums"] = js;
  mj["differing_ranks"] = differ;
  rep.json["result_mismatch"] = mj;
}

// One backtrace_symbols line "module(symbol+0xoff) [0xaddr]" as "demangled +0xoff (module's file name)".
std::string demangle_frame(const std::string& line) {
  const size_t lp = line.find('('), rp = line.find(')', lp == std::string::npos ? 0 : lp);
  if (lp == std::string::npos || rp == std::string::npos) return line;
  const std::string module = std::filesystem::path(line.substr(0, lp)).filename().string();
  const size_t plus = line.find('+', lp);
  const size_t sym_end = plus != std::string::npos && plus < rp ? plus : rp;
  const std::string sym = line.substr(lp + 1, sym_end - lp - 1);
  const std::string off = line.substr(sym_end, rp - sym_end);
  if (sym.empty()) return fmt::format("?? {} ({})", off, module);
  int status = 0;
  char* d = abi::__cxa_demangle(sym.c_str(), nullptr, nullptr, &status);
  const std::string name = status == 0 && d ? d : sym;
  std::free(d);
  return fmt::format("{} {} ({})", name, off, module);
}

// Each dump's main-thread stack (comm/host_stack.h), demangled, the capture's own frames skipped.
std::map<int, std::vector<std::string>> host_stacks(const std::vector<nlohmann::json>& dumps) {
  std::map<int, std::vector<std::string>> out;
  for (const auto& d : dumps) {
    if (!d.contains("host_stacks")) continue;
    for (const auto& st : d.at("host_stacks")) {
      if (!st.value("captured", false)) continue;
      const auto frames = st.at("frames").get<std::vector<std::string>>();
      auto& v = out[d.at("rank").get<int>()];
      for (size_t i = st.value("capture_frames", size_t{0}); i < frames.size(); ++i) v.push_back(demangle_frame(frames[i]));
    }
  }
  return out;
}

constexpr size_t kTopFrames = 10;  // frames shown per rank in the text report (the JSON has them all)

}  // namespace

std::vector<nlohmann::json> read_hang_dumps(const std::string& dump_dir) {
  namespace fs = std::filesystem;
  fs::path dir = dump_dir;
  if (fs::is_directory(dir / "flight_recorder")) dir /= "flight_recorder";
  if (!fs::is_directory(dir)) fail("mcpp debug hang: '{}' is not a directory", dump_dir);
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("rank_") && n.ends_with(".json")) files.push_back(e.path());
  }
  if (files.empty()) fail("mcpp debug hang: no flight-recorder dump (rank_<r>.json) in {}", dir.string());
  std::sort(files.begin(), files.end());
  std::vector<nlohmann::json> out;
  for (const auto& f : files) {
    std::ifstream in(f);
    try {
      out.push_back(nlohmann::json::parse(in));
    } catch (const nlohmann::json::exception& e) {
      fail("mcpp debug hang: {} is not a flight-recorder dump ({})", f.string(), e.what());
    }
  }
  return out;
}

HangReport analyze_hang(const std::vector<nlohmann::json>& dumps) {
  std::map<int, std::vector<Call>> by_rank;
  int world = 0;
  for (const auto& d : dumps) {
    try {
      const int r = d.at("rank").get<int>();
      world = std::max(world, d.at("world_size").get<int>());
      auto& calls = by_rank[r];
      for (const auto& e : d.at("entries")) calls.push_back(parse_call(r, e));
    } catch (const nlohmann::json::exception& e) {
      fail("mcpp debug hang: a dump does not follow the flight-recorder schema ({})", e.what());
    }
  }
  HangReport rep;
  std::string& t = rep.text;
  nlohmann::json& j = rep.json;
  std::vector<int> missing_dumps;
  for (int r = 0; r < world; ++r)
    if (!by_rank.count(r)) missing_dumps.push_back(r);
  t += fmt::format("flight-recorder dumps of {} of {} ranks{}\n", by_rank.size(), world,
                   missing_dumps.empty() ? "" : fmt::format(" (no dump from ranks [{}])", fmt::join(missing_dumps, ", ")));
  j["missing_dumps"] = missing_dumps;

  // Per rank: coordinates (index in each group), last call, position.
  t += "ranks:\n";
  for (const auto& [r, calls] : by_rank) {
    std::map<std::string, std::string> coords;
    for (const Call& c : calls) {
      const auto it = std::find(c.group_ranks.begin(), c.group_ranks.end(), r);
      if (it != c.group_ranks.end() && c.group != "world")
        coords[c.group] = fmt::format("{}/{}", it - c.group_ranks.begin(), c.group_ranks.size());
    }
    std::string co;
    for (const auto& [g, v] : coords) co += fmt::format("{}{} {}", co.empty() ? "" : ", ", g, v);
    const Call* last = calls.empty() ? nullptr : &calls.back();
    t += fmt::format("  rank {}: {} | last call: {}{}\n", r, co.empty() ? "-" : co, last ? describe(*last) : "none",
                     last ? fmt::format(" [{}]", last->state) : "");
  }

  // Per group: the last collective every member completed; the first mismatch.
  std::map<std::string, std::map<int64_t, std::vector<const Call*>>> colls;  // group -> seq -> calls
  std::map<std::string, std::vector<int>> members;
  for (const auto& [r, calls] : by_rank)
    for (const Call& c : calls)
      if (c.op != "batch_p2p") {
        colls[group_key(c)][c.seq].push_back(&c);
        members[group_key(c)] = c.group_ranks;
      }
  std::optional<std::pair<std::string, int64_t>> first_mismatch;
  int64_t first_mismatch_time = std::numeric_limits<int64_t>::max();
  t += "groups (the last collective all members completed):\n";
  j["last_completed"] = nlohmann::json::array();
  for (const auto& [g, seqs] : colls) {
    const size_t n = members[g].size();
    const Call* last_all = nullptr;
    for (const auto& [seq, cs] : seqs) {
      const bool all_done = cs.size() == n && std::all_of(cs.begin(), cs.end(), [](const Call* c) { return c->state == "done"; });
      if (all_done) last_all = cs.front();
      for (const Call* c : cs)
        if ((c->op != cs.front()->op || c->dtype != cs.front()->dtype || c->count != cs.front()->count) &&
            cs.front()->start_wall_us < first_mismatch_time) {
          first_mismatch = {g, seq};
          first_mismatch_time = cs.front()->start_wall_us;
        }
    }
    t += fmt::format("  {}: {}\n", g, last_all ? describe(*last_all) : "none completed by all members (in the dumps)");
    if (last_all) j["last_completed"].push_back(call_json(*last_all));
  }
  if (first_mismatch) {
    t += fmt::format("first mismatch: group {} seq {}:\n", first_mismatch->first, first_mismatch->second);
    j["first_mismatch"] = nlohmann::json::array();
    for (const Call* c : colls[first_mismatch->first][first_mismatch->second]) {
      t += fmt::format("  rank {}: {}\n", c->rank, describe(*c));
      j["first_mismatch"].push_back(call_json(*c));
    }
  }

  report_result_mismatch(colls, members, rep);

  // Host stacks (SIGUSR1 / watchdog dumps): where each rank's main thread is.
  const std::map<int, std::vector<std::string>> stacks = host_stacks(dumps);
  j["host_stacks"] = nlohmann::json::object();
  if (!stacks.empty()) {
    t += fmt::format("host stacks (main thread, innermost first, top {} frames):\n", kTopFrames);
    for (const auto& [r, frames] : stacks) {
      j["host_stacks"][std::to_string(r)] = frames;
      t += fmt::format("  rank {}:\n", r);
      for (size_t i = 0; i < frames.size() && i < kTopFrames; ++i) t += fmt::format("    #{} {}\n", i, frames[i]);
    }
  }

  // Stuck calls and who never joined them.
  std::vector<const Call*> stuck;
  for (const auto& [r, calls] : by_rank)
    for (const Call& c : calls)
      if (c.pending()) stuck.push_back(&c);
  std::sort(stuck.begin(), stuck.end(), [](const Call* a, const Call* b) { return a->start_wall_us < b->start_wall_us; });
  j["stuck"] = nlohmann::json::array();
  if (stuck.empty()) {
    t += "no rank is inside a collective: not a communication hang (compare the ranks' last calls and host stacks)\n";
    j["culprit_rank"] = nullptr;
    return rep;
  }
  t += "stuck:\n";
  std::optional<int> culprit;
  std::string why;
  for (const Call* c : stuck) {
    std::vector<int> absent;  // members that never issued this call
    const std::vector<int>& peers = c->op == "batch_p2p" ? c->peers : c->group_ranks;
    for (int m : peers) {
      if (m == c->rank || !by_rank.count(m)) continue;
      const auto& mc = by_rank[m];
      const bool joined = std::any_of(mc.begin(), mc.end(), [&](const Call& o) {
        if (o.group != c->group || o.group_ranks != c->group_ranks) return false;
        return c->op == "batch_p2p" ? o.op == "batch_p2p" && std::count(o.peers.begin(), o.peers.end(), c->rank) &&
                                          o.iteration == c->iteration && o.microbatch == c->microbatch
                                    : o.seq == c->seq;
      });
      if (!joined) absent.push_back(m);
    }
    t += fmt::format("  rank {} waits in {}{}\n", c->rank, describe(*c),
                     absent.empty() ? "" : fmt::format("; never issued by ranks [{}]", fmt::join(absent, ", ")));
    nlohmann::json sj = call_json(*c);
    sj["absent"] = absent;
    j["stuck"].push_back(sj);
    for (int m : absent) {
      const auto& mc = by_rank[m];
      const bool idle = std::none_of(mc.begin(), mc.end(), [](const Call& o) { return o.pending(); });
      if (idle && !culprit) {
        culprit = m;
        why = fmt::format("rank {} is in no collective: it stopped calling them (hung, dead or slow) after {}", m,
                          mc.empty() ? std::string("no call") : describe(mc.back()));
      }
    }
  }
  for (int r : missing_dumps)
    if (!culprit) {
      culprit = r;
      why = fmt::format("rank {} wrote no dump (dead?)", r);
    }
  if (!culprit) {  // everyone waits: the first stuck call is the one its peers did not issue
    const Call* c = stuck.front();
    culprit = c->rank;
    why = fmt::format("rank {} issued {} first, which its peers did not issue (they wait elsewhere)", c->rank,
                      describe(*c));
    j["culprit_call"] = call_json(*c);
  }
  t += fmt::format("culprit: {}\n", why);
  j["culprit_rank"] = *culprit;
  j["culprit"] = why;
  return rep;
}

}  // namespace mcpp::tools
