// Device selection (device.hpp): parsing, and what auto, cpu and cuda resolve to on this machine,
// consistent with whether this build has CUDA and whether a device answers.
#include "attnscope/device.hpp"
#include "attnscope/error.hpp"

#include <gtest/gtest.h>

namespace attnscope {
namespace {

TEST(DeviceSelection, ParsesTheThreeNames) {
  EXPECT_EQ(parse_device("auto"), Device::Auto);
  EXPECT_EQ(parse_device("cpu"), Device::Cpu);
  EXPECT_EQ(parse_device("cuda"), Device::Cuda);
  for (const char* bad : {"", "gpu", "CUDA", "cuda:0"}) {
    try {
      (void)parse_device(bad);
      ADD_FAILURE() << "'" << bad << "' parsed";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--device"), std::string::npos) << e.what();
    }
  }
  for (Device d : {Device::Auto, Device::Cpu, Device::Cuda}) EXPECT_EQ(parse_device(device_name(d)), d);
}

TEST(DeviceSelection, CpuIsAlwaysTheCpu) {
  const ResolvedDevice r = resolve_device(Device::Cpu, "confusion");
  EXPECT_EQ(r.used, Device::Cpu);
  EXPECT_EQ(r.index, -1);
  EXPECT_EQ(r.description, "cpu (requested)");
}

TEST(DeviceSelection, AutoAndCudaFollowTheMachine) {
  std::string why;
  const bool available = cuda_device_available(&why);
  if (!built_with_cuda()) {
    EXPECT_FALSE(available);
    EXPECT_EQ(why, "built without CUDA");
  }
  const ResolvedDevice a = resolve_device(Device::Auto, "confusion");
  if (available) {
    EXPECT_EQ(a.used, Device::Cuda);
    EXPECT_EQ(a.index, 0);
    EXPECT_EQ(a.description.rfind("cuda:0 ", 0), 0U) << a.description;
    EXPECT_EQ(resolve_device(Device::Cuda, "confusion").used, Device::Cuda);
    return;
  }
  EXPECT_EQ(a.used, Device::Cpu);
  const std::string want = built_with_cuda() ? "cpu (no CUDA device: " + why + ")" : "cpu (built without CUDA)";
  EXPECT_EQ(a.description, want);
  try {
    (void)resolve_device(Device::Cuda, "confusion");
    ADD_FAILURE() << "--device cuda resolved without a device";
  } catch (const UsageError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("--device cuda: ", 0), 0U) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
  }
}

TEST(DeviceSelection, AnalysesWithoutACudaPathStayOnTheCpu) {
  const ResolvedDevice a = resolve_device(Device::Auto, "maps", false);
  EXPECT_EQ(a.used, Device::Cpu);
  if (built_with_cuda()) {
    EXPECT_EQ(a.description, "cpu (maps has no CUDA path)");
  }
  EXPECT_THROW((void)resolve_device(Device::Cuda, "maps", false), UsageError);
}

}  // namespace
}  // namespace attnscope
