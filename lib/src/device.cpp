// Device selection. The probe uses the CUDA runtime's C API only, so it is plain C++ compiled
// with the rest of the library; a build without CUDA answers "built without CUDA".
#include "attnscope/device.hpp"

#include "attnscope/error.hpp"

#ifdef ATTNSCOPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace attnscope {

Device parse_device(std::string_view name) {
  if (name == "auto") return Device::Auto;
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  throw UsageError("--device must be auto, cpu or cuda, got '" + std::string(name) + "'");
}

std::string_view device_name(Device d) {
  switch (d) {
    case Device::Auto: return "auto";
    case Device::Cpu: return "cpu";
    case Device::Cuda: return "cuda";
  }
  return "?";
}

bool built_with_cuda() {
#ifdef ATTNSCOPE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

void refuse_without_cuda() {
  throw UsageError(
      "--device cuda: this attnscope was built without CUDA (configure with "
      "-DATTNSCOPE_CUDA=AUTO or ON where a CUDA toolkit is installed)");
}

namespace {

#ifdef ATTNSCOPE_HAVE_CUDA
/// Device 0's name, or the runtime's reason why there is none.
bool probe(std::string& name, std::string& why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    why = cudaGetErrorString(err);
    return false;
  }
  if (count < 1) {
    why = "the CUDA runtime reports no device";
    return false;
  }
  cudaDeviceProp prop{};
  const cudaError_t perr = cudaGetDeviceProperties(&prop, 0);
  if (perr != cudaSuccess) {
    why = cudaGetErrorString(perr);
    return false;
  }
  name = prop.name;
  return true;
}
#endif

/// The probe runs once per process: the answer cannot change while it runs.
struct Probe {
  bool available = false;
  std::string name, why;
  Probe() {
#ifdef ATTNSCOPE_HAVE_CUDA
    available = probe(name, why);
#else
    why = "built without CUDA";
#endif
  }
};

const Probe& the_probe() {
  static const Probe p;
  return p;
}

}  // namespace

bool cuda_device_available(std::string* why) {
  const Probe& p = the_probe();
  if (!p.available && why) *why = p.why;
  return p.available;
}

ResolvedDevice resolve_device(Device requested, std::string_view analysis, bool has_cuda_path) {
  ResolvedDevice r;
  if (requested == Device::Cpu) {
    r.description = "cpu (requested)";
    return r;
  }
  const Probe& p = the_probe();
  std::string why;
  if (!built_with_cuda()) {
    why = "built without CUDA";
  } else if (!has_cuda_path) {
    why = std::string(analysis) + " has no CUDA path";
  } else if (!p.available) {
    why = "no CUDA device: " + p.why;
  }
  if (why.empty()) {
    r.used = Device::Cuda;
    r.index = 0;
    r.description = "cuda:0 " + p.name;
    return r;
  }
  if (requested == Device::Cuda) {
    if (!built_with_cuda()) refuse_without_cuda();
    throw UsageError("--device cuda: " + why);
  }
  r.description = "cpu (" + why + ")";
  return r;
}

}  // namespace attnscope
