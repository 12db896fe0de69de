// Where an analysis runs: the CPU, or a CUDA device when the build has CUDA paths (ATTNSCOPE_CUDA)
// and the machine has a device. `--device auto|cpu|cuda` of every analysis resolves through here.
#pragma once

#include <string>
#include <string_view>

namespace attnscope {

enum class Device { Auto, Cpu, Cuda };

/// "auto", "cpu" or "cuda"; UsageError naming --device otherwise.
[[nodiscard]] Device parse_device(std::string_view name);
[[nodiscard]] std::string_view device_name(Device d);

/// The device a run uses and what it is, for the run's metadata and the user:
/// "cuda:0 NVIDIA H100 80GB HBM3", "cpu (no CUDA device: <reason>)", "cpu (built without CUDA)",
/// "cpu (requested)", "cpu (<analysis> has no CUDA path)".
struct ResolvedDevice {
  Device used = Device::Cpu;  ///< Cpu or Cuda, never Auto
  int index = -1;             ///< the CUDA device's ordinal (0), -1 on the CPU
  std::string description;
};

/// Whether this build has the CUDA paths.
[[nodiscard]] bool built_with_cuda();

/// Throws the UsageError of `--device cuda` in a build without CUDA: what every GPU path of such
/// a build does when called.
[[noreturn]] void refuse_without_cuda();

/// Whether a CUDA device can be used; when not, `why` (if given) receives the reason
/// ("built without CUDA" or the CUDA runtime's error string).
[[nodiscard]] bool cuda_device_available(std::string* why = nullptr);

/// Resolves a request: Cpu is the CPU; Auto is CUDA device 0 when one is available and the
/// analysis has a CUDA path, else the CPU (the description says why); Cuda is device 0 or a
/// UsageError of one line saying why it cannot be ("--device cuda: ...").
/// `analysis` names the analysis in messages; `has_cuda_path` is false for those without one.
[[nodiscard]] ResolvedDevice resolve_device(Device requested, std::string_view analysis,
                                            bool has_cuda_path = true);

}  // namespace attnscope
