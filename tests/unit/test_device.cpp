// Device selection (device.hpp): parsing, and what auto, cpu and cuda resolve to on this machine,
// consistent with whether this build has CUDA and whether a device answers; in a build without
// CUDA, every GPU path refuses with --device cuda's message.
#include "attnscope/analyses/confusion_cuda.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/analyses/masking.hpp"
#include "attnscope/device.hpp"
#include "attnscope/error.hpp"
#include "attnscope/gpu/attention.hpp"
#include "attnscope/variant.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

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

// The GPU paths ask the family how its rows are computed on the device (ScoreFamily's
// rows_are_softmax): the score kernels for softmax, the features and row forms for every
// kernel family; no family is named.
TEST(DeviceSelection, TheFamilySaysHowTheGpuComputesItsRows) {
  EXPECT_TRUE(gpu::score_rows_on_gpu(parse_variant("softmax")));
  for (const char* spec : {"linear:relu", "inline", "mala", "efficient", "cosformer", "rala", "mlla"}) {
    EXPECT_FALSE(gpu::score_rows_on_gpu(parse_variant(spec))) << spec;
  }
}

TEST(DeviceSelection, GpuPathsOfABuildWithoutCudaRefuseAsDeviceCudaDoes) {
  if (built_with_cuda()) GTEST_SKIP() << "built with CUDA: tests/cuda/ runs the GPU paths";
  const Variant v = parse_variant("softmax");
  const MatD q = MatD::Constant(4, 2, 0.5), k = q, values = q;
  const MatF qf = q.cast<float>(), kf = k.cast<float>();
  const Mask mask = Mask::Constant(4, 4, true);
  const TokenGrid grid{0, 2, 2};
  std::string refusal;
  try {
    (void)resolve_device(Device::Cuda, "confusion");
  } catch (const UsageError& e) {
    refusal = e.what();
  }
  ASSERT_FALSE(refusal.empty())
      << "negative control: --device cuda resolved in a build without CUDA";
  const std::vector<std::pair<const char*, std::function<void()>>> paths = {
      {"gpu::attention_weights", [&] { (void)gpu::attention_weights(v, q, k, 0.5); }},
      {"gpu::attention_outputs", [&] { (void)gpu::attention_outputs(v, q, k, values, 0.5); }},
      {"gpu::attention_weights_and_outputs",
       [&] { (void)gpu::attention_weights_and_outputs(v, q, k, values, 0.5); }},
      {"count_confusion_cuda",
       [&] {
         (void)analyses::count_confusion_cuda(v, qf, qf, kf, 0.5, analyses::ConfusionOptions{});
       }},
      {"count_confusion_cuda_batch",
       [&] {
         (void)analyses::count_confusion_cuda_batch(
             v, {analyses::HeadInput{&qf, &qf, &kf, nullptr}}, 0.5, analyses::ConfusionOptions{});
       }},
      {"confusion_rows_cuda",
       [&] {
         (void)analyses::confusion_rows_cuda(analyses::ExactRows(v, qf, kf, 0.5), qf, kf, 0.5);
       }},
      {"local_mass_cuda", [&] { (void)analyses::local_mass_cuda(v, qf, kf, 0.5, grid, 1); }},
      {"mask_head_cuda", [&] { (void)analyses::mask_head_cuda(v, q, k, values, 0.5, mask); }},
  };
  for (const auto& [name, call] : paths) {
    try {
      call();
      ADD_FAILURE() << name << " ran in a build without CUDA";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), refusal) << name;
    }
  }
}

}  // namespace
}  // namespace attnscope
