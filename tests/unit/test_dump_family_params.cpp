// The per-layer family parameters of a dump (dump_family_params.hpp): values read exactly, and one
// line naming file, dataset, expectation and finding for every malformed or missing one.
#include "attnscope/dump_family_params.hpp"
#include "attnscope/error.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace attnscope {
namespace {

class FamilyParams : public test::ScratchDirTest {
 protected:
  /// A file with /layers/0/family_params holding rope_cos float32 [2, 3, 4] (value h*100 + r*10 +
  /// c), exponent float32 [2, 4], a float64 dataset `wide`, a NaN in `broken`, the string
  /// attribute rope_layout, and /layers/0/agents float32 [2 images, 2 heads, 1 agent, 4].
  std::string make() {
    const std::string p = path("params.h5");
    const hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    const hid_t g = H5Gcreate2(f, "/layers/0/family_params", lcpl, H5P_DEFAULT, H5P_DEFAULT);
    auto write = [&](hid_t loc, const char* name, std::vector<hsize_t> dims, hid_t type,
                     const void* data, hid_t mem) {
      const hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
      const hid_t d = H5Dcreate2(loc, name, type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      H5Dwrite(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
      H5Dclose(d);
      H5Sclose(s);
    };
    std::vector<float> cos(24), exponent(8), agents(16);
    for (int h = 0; h < 2; ++h) {
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 4; ++c)
          cos[(h * 3 + r) * 4 + c] = static_cast<float>(h * 100 + r * 10 + c) + 0.1f;
      }
    }
    for (int i = 0; i < 8; ++i) exponent[i] = 1.0f + 0.5f * static_cast<float>(i);
    for (int i = 0; i < 16; ++i) agents[i] = static_cast<float>(i);
    write(g, "rope_cos", {2, 3, 4}, H5T_IEEE_F32LE, cos.data(), H5T_NATIVE_FLOAT);
    write(g, "exponent", {2, 4}, H5T_IEEE_F32LE, exponent.data(), H5T_NATIVE_FLOAT);
    const std::vector<double> wide(8, 1.0);
    write(g, "wide", {2, 4}, H5T_IEEE_F64LE, wide.data(), H5T_NATIVE_DOUBLE);
    std::vector<float> broken(8, 1.0f);
    broken[5] = std::numeric_limits<float>::quiet_NaN();
    write(g, "broken", {2, 4}, H5T_IEEE_F32LE, broken.data(), H5T_NATIVE_FLOAT);
    const hid_t layer = H5Gopen2(f, "/layers/0", H5P_DEFAULT);
    write(layer, "agents", {2, 2, 1, 4}, H5T_IEEE_F32LE, agents.data(), H5T_NATIVE_FLOAT);
    const hid_t st = H5Tcopy(H5T_C_S1);
    H5Tset_size(st, H5T_VARIABLE);
    H5Tset_cset(st, H5T_CSET_UTF8);
    const hid_t sp = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(g, "rope_layout", st, sp, H5P_DEFAULT, H5P_DEFAULT);
    const char* value = "retnet";
    H5Awrite(a, st, &value);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(st);
    H5Gclose(layer);
    H5Gclose(g);
    H5Pclose(lcpl);
    H5Fclose(f);
    return p;
  }
};

/// The one-line message of what `f` throws, or "" when it throws nothing.
template <typename F>
std::string message(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST_F(FamilyParams, ReadsValuesPerHeadExactly) {
  const std::string p = make();
  EXPECT_EQ(family_param_names(p, 0),
            (std::vector<std::string>{"broken", "exponent", "rope_cos", "wide"}));
  EXPECT_TRUE(family_param_names(p, 1).empty());
  const FamilyParam cos = read_family_param(p, 0, "rope_cos", 2, 3, 4);
  ASSERT_EQ(cos.per_head.size(), 2u);
  EXPECT_EQ(cos.per_head[1](2, 3), static_cast<double>(123.1f));
  EXPECT_EQ(cos.per_head[0](1, 0), static_cast<double>(10.1f));
  const FamilyParam e = read_family_param(p, 0, "exponent", 2, 1, 4);
  EXPECT_EQ(e.per_head[1](0, 3), 4.5);
  EXPECT_EQ(family_param_attribute(p, 0, "rope_layout"), "retnet");
  EXPECT_EQ(family_param_attribute(p, 0, "absent", "mlla"), "mlla");
  const std::vector<MatD> agents = read_layer_agents(p, 0, 1, 2, 4);
  EXPECT_EQ(agents[1](0, 2), 14.0);
}

TEST_F(FamilyParams, EveryFaultIsOneLineNamingFileDatasetAndExpectation) {
  const std::string p = make();
  const std::string shape = message([&] { (void)read_family_param(p, 0, "rope_cos", 2, 3, 5); });
  EXPECT_NE(shape.find(p), std::string::npos) << shape;
  EXPECT_NE(shape.find("/layers/0/family_params/rope_cos"), std::string::npos) << shape;
  EXPECT_NE(shape.find("float32 [2, 3, 5]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("[2, 3, 4]"), std::string::npos) << shape;
  const std::string heads = message([&] { (void)read_family_param(p, 0, "rope_cos", 3); });
  EXPECT_NE(heads.find("[2, 3, 4]"), std::string::npos) << heads;
  const std::string type = message([&] { (void)read_family_param(p, 0, "wide", 2); });
  EXPECT_NE(type.find("float64"), std::string::npos) << type;
  const std::string missing = message([&] { (void)read_family_param(p, 0, "rope_sin", 2); });
  EXPECT_NE(missing.find("/layers/0/family_params/rope_sin"), std::string::npos) << missing;
  const std::string nan = message([&] { (void)read_family_param(p, 0, "broken", 2); });
  EXPECT_NE(nan.find("finite"), std::string::npos) << nan;
  const std::string image = message([&] { (void)read_layer_agents(p, 0, 2, 2, 4); });
  EXPECT_NE(image.find("/layers/0/agents"), std::string::npos) << image;
  const std::string dim = message([&] { (void)read_layer_agents(p, 0, 0, 2, 8); });
  EXPECT_NE(dim.find("[2, 2, 1, 4]"), std::string::npos) << dim;
  for (const std::string& m : {shape, heads, type, missing, nan, image, dim}) {
    EXPECT_FALSE(m.empty());
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace attnscope
