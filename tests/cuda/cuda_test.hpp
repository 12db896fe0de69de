// What every GPU test starts with: skip, with the reason, where no CUDA device answers.
#pragma once

#include "attnscope/device.hpp"

#include <gtest/gtest.h>

#include <string>

namespace attnscope::test {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

}  // namespace attnscope::test
