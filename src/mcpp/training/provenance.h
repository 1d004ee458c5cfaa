// Provenance of a run: what built and what runs it — `mcpp --version`, `mcpp train`'s banner, the first record of
// every metrics file and every checkpoint's manifest meta ("provenance").
//   {"version": "0.1.0", "git_commit": "<hash>", "git_dirty": false, "build_type": "Release",
//    "compiler": "GNU 12.2.0", "cuda_runtime": "13.0" | null, "cuda_driver": "13.0" | null, "cudnn": "9.10.2" | null,
//    "nccl": "2.28.9" | null, "device": "NVIDIA H100 80GB HBM3" | "cpu", "hostname": "...",
//    "argv": ["mcpp", "train", ...]}
// null: not in this build (or no driver). argv is the process's own command line (/proc/self/cmdline), so every
// rank reports what it was started with. The build's part comes from core/build_info.h (generated at build time).
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace mcpp {

nlohmann::json provenance();
// `mcpp --version`: a few lines (version + commit, build, CUDA / cuDNN / NCCL, device).
std::string format_version(const nlohmann::json& provenance);
// One line for the train banner: "mcpp 0.1.0 (commit c2ba0fb, Release) | CUDA 13.0, cuDNN 9.10.2, NCCL 2.28.9 |
// device NVIDIA H200 | argv: mcpp train ...".
std::string format_provenance_line(const nlohmann::json& provenance);

}  // namespace mcpp
