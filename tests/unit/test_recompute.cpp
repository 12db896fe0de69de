// The recomputation check: outputs/weights written from the plain-loop reference are recovered
// to rounding, and a single corrupted value is found in the right layer and head.
#include "attnscope/analyses/recompute.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace attnscope {
namespace {

struct Written {
  std::string path;
  DumpAttributes attrs;
};

// A synthetic dump whose `out` and `attn` hold the reference's outputs and weights for `spec`.
// corrupt_layer/head >= 0 adds `delta` to out[0, 0] of that head in image 1.
Written write_dump(const std::string& name, const std::string& family, const std::string& map,
                   const std::string& spec, int corrupt_layer = -1, int corrupt_head = -1,
                   float delta = 0.0f) {
  SynthOptions o;
  o.layers = 2;
  o.heads = 2;
  o.grid = {1, 4, 5};
  o.head_dim = 7;
  o.images = 3;
  o.family = family;
  o.feature_map = map;
  o.convention = "code";
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  const DumpAttributes attrs = o.attributes();
  const Variant v = parse_variant(spec);
  DumpWriterOptions w;
  w.with_attn = w.with_out = true;
  DumpWriter writer(path, attrs, w);
  for (int i = 0; i < o.images; ++i) {
    const ImageQKV img = synth_image(o, i);
    std::vector<MatF> attn, out;
    for (int l = 0; l < o.layers; ++l)
      for (int h = 0; h < o.heads; ++h) {
        const MatD q = img.Q(l, h).cast<double>(), k = img.K(l, h).cast<double>();
        attn.push_back(reference::weights(v, q, k, o.scale()).cast<float>());
        out.push_back(
            reference::outputs(v, q, k, img.V(l, h).cast<double>(), o.scale()).cast<float>());
        if (i == 1 && l == corrupt_layer && h == corrupt_head) out.back()(0, 0) += delta;
      }
    writer.append(img, &attn, &out);
  }
  writer.close();
  return {path, attrs};
}

TEST(Recompute, RecoversReferenceOutputsForEveryFamily) {
  const struct {
    const char *family, *map, *spec;
  } cases[] = {{"softmax", "none", "softmax@code"},
               {"linear", "relu", "linear:relu@code"},
               {"inline", "identity", "inline:identity@code"},
               {"mala", "elu1", "mala:elu1@code"}};
  for (const auto& c : cases) {
    const Written w = write_dump(std::string("recompute_") + c.family + ".h5", c.family, c.map,
                                 c.spec);
    DumpReader reader(w.path);
    const Variant v = w.attrs.variant();
    ASSERT_EQ(v.name(), c.spec);
    const auto cells = analyses::recompute_dump(reader, v, {});
    ASSERT_EQ(cells.size(), 4u) << c.spec;
    for (const auto& cell : cells) {
      EXPECT_EQ(cell.images, 3) << c.spec;
      EXPECT_TRUE(cell.has_out && cell.has_attn) << c.spec;
      // float32 storage of out and attn: a few float ulps of the head's largest value.
      EXPECT_LT(cell.out_max_rel, 1e-6) << c.spec << " layer " << cell.layer << " head "
                                        << cell.head;
      EXPECT_LT(cell.attn_max_abs, 1e-6) << c.spec << " layer " << cell.layer;
    }
    std::filesystem::remove(w.path);
  }
}

TEST(Recompute, FindsOneCorruptedValueInItsHead) {
  const Written w =
      write_dump("recompute_corrupt.h5", "mala", "elu1", "mala:elu1@code", 1, 0, 0.5f);
  DumpReader reader(w.path);
  const auto cells = analyses::recompute_dump(reader, w.attrs.variant(), {});
  for (const auto& cell : cells) {
    const bool corrupted = cell.layer == 1 && cell.head == 0;
    if (corrupted) {
      EXPECT_NEAR(cell.out_max_abs, 0.5, 1e-5);
    } else {
      EXPECT_LT(cell.out_max_abs, 1e-5) << "layer " << cell.layer << " head " << cell.head;
    }
  }
  // Restricted to image 0, the corruption (in image 1) is not seen.
  const auto first = analyses::recompute_dump(reader, w.attrs.variant(), {0});
  for (const auto& cell : first) EXPECT_LT(cell.out_max_abs, 1e-5);
  std::filesystem::remove(w.path);
}

TEST(Recompute, DumpWithoutModelTensorsIsAnInputError) {
  SynthOptions o;
  o.images = 1;
  const std::string path =
      (std::filesystem::temp_directory_path() / "recompute_plain.h5").string();
  write_synth_dump(path, o);
  DumpReader reader(path);
  try {
    (void)analyses::recompute_dump(reader, o.attributes().variant(), {});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("out"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace attnscope
