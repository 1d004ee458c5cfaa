// Provenance of a run (provenance.h): the build's facts, the backends' library versions, the device, the command.
#include "mcpp/training/provenance.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <fstream>
#include <iterator>

#include "mcpp/comm/nccl/nccl_communicator.h"
#include "mcpp/core/build_info.h"
#include "mcpp/core/device_memory.h"

namespace mcpp {
namespace {

// CUDA's 13000 -> "13.0"; cuDNN 9's 91002 and NCCL's 22809 (major * 10000 + minor * 100 + patch) -> "9.10.2".
nlohmann::json cuda_version_string(int v) {
  if (v <= 0) return nullptr;
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}
nlohmann::json library_version_string(int v) {
  if (v <= 0) return nullptr;
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

std::vector<std::string> command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string cur;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) args.push_back(cur);
  return args;
}

std::string host_name() {
  std::array<char, 256> buf{};
  if (gethostname(buf.data(), buf.size() - 1) != 0) return "unknown";
  return buf.data();
}

std::string str(const nlohmann::json& v) { return v.is_null() ? "none" : v.get<std::string>(); }

}  // namespace

nlohmann::json provenance() {
  const std::string device = cuda_device_name();
  return {{"version", build_info::version()},
          {"git_commit", build_info::git_commit()},
          {"git_dirty", build_info::git_dirty()},
          {"build_type", build_info::build_type()},
          {"compiler", build_info::compiler()},
          {"cuda_runtime", cuda_version_string(cuda_runtime_version())},
          {"cuda_driver", cuda_version_string(cuda_driver_version())},
          {"cudnn", library_version_string(cudnn_version())},
          {"nccl", library_version_string(comm::nccl_version())},
          {"device", device.empty() ? "cpu" : device},
          {"hostname", host_name()},
          {"argv", command_line()}};
}

std::string format_version(const nlohmann::json& p) {
  const std::string commit = p.at("git_commit").get<std::string>() + (p.at("git_dirty").get<bool>() ? " (dirty)" : "");
  return fmt::format(
      "mcpp {} (megatron-cpp)\ngit commit: {}\nbuild: {}, {}\nCUDA runtime: {}, driver: {} | cuDNN: {} | NCCL: {}\n"
      "device: {}\n",
      p.at("version").get<std::string>(), commit, p.at("build_type").get<std::string>(),
      p.at("compiler").get<std::string>(), str(p.at("cuda_runtime")), str(p.at("cuda_driver")), str(p.at("cudnn")),
      str(p.at("nccl")), p.at("device").get<std::string>());
}

std::string format_provenance_line(const nlohmann::json& p) {
  std::string argv;
  for (const auto& a : p.at("argv")) argv += (argv.empty() ? "" : " ") + a.get<std::string>();
  const std::string commit = p.at("git_commit").get<std::string>().substr(0, 12);
  return fmt::format("mcpp {} (commit {}{}, {}) | CUDA {}, cuDNN {}, NCCL {} | device {} | argv: {}",
                     p.at("version").get<std::string>(), commit, p.at("git_dirty").get<bool>() ? "-dirty" : "",
                     p.at("build_type").get<std::string>(), str(p.at("cuda_runtime")), str(p.at("cudnn")),
                     str(p.at("nccl")), p.at("device").get<std::string>(), argv);
}

}  // namespace mcpp
