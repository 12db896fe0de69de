// The recomputation check: outputs/weights written from the plain-loop reference are recovered
// to rounding, and a single corrupted value is found in the right layer and head.
#include "attnscope/analyses/recompute.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "attnscope/variant.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>
#include <omp.h>

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

// recompute_dump streams the dump through the analyses' loop (dump_loop.hpp); the numbers must be
// those of comparing every head by hand, image by image, in the same order. One thread, so that
// both sides round the same way.
TEST(Recompute, StreamedRunEqualsComparingEveryHeadByHand) {
  const Written w =
      write_dump("recompute_streamed.h5", "mala", "elu1", "mala:elu1@code", 0, 1, 0.25f);
  DumpReader reader(w.path);
  const Variant v = w.attrs.variant();
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<int> images = {2, 0, 1};
  const auto cells = analyses::recompute_dump(reader, v, images);
  std::vector<analyses::RecomputeCell> want(4);
  for (int image : images) {
    const ImageQKV img = reader.read_image(image);
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) {
        analyses::RecomputeCell& c = want[static_cast<std::size_t>(l * 2 + h)];
        c.layer = l;
        c.head = h;
        const auto out = reader.read_out(image, l, h);
        const auto attn = reader.read_attn(image, l, h);
        ASSERT_TRUE(out && attn);
        analyses::compare_head(v, img.Q(l, h), img.K(l, h), img.V(l, h), w.attrs.scale, &*out,
                               &*attn, c);
      }
  }
  omp_set_num_threads(threads);
  ASSERT_EQ(cells.size(), want.size());
  for (std::size_t i = 0; i < cells.size(); ++i) {
    const auto &got = cells[i], &exp = want[i];
    const std::string where = "layer " + std::to_string(exp.layer) + " head " + std::to_string(exp.head);
    EXPECT_EQ(got.layer, exp.layer) << where;
    EXPECT_EQ(got.head, exp.head) << where;
    EXPECT_EQ(got.images, 3) << where;
    EXPECT_TRUE(got.has_out && got.has_attn) << where;
    EXPECT_EQ(got.out_max_abs, exp.out_max_abs) << where;
    EXPECT_EQ(got.out_max_rel, exp.out_max_rel) << where;
    EXPECT_EQ(got.out_sum_abs, exp.out_sum_abs) << where;
    EXPECT_EQ(got.out_values, exp.out_values) << where;
    EXPECT_EQ(got.attn_max_abs, exp.attn_max_abs) << where;
    EXPECT_EQ(got.degenerate_rows, exp.degenerate_rows) << where;
  }
  EXPECT_NEAR(cells[1].out_max_abs, 0.25, 1e-5) << "the corrupted head (layer 0, head 1)";
  EXPECT_THROW((void)analyses::recompute_dump(reader, v, {3}), UsageError) << "image 3 of 3";
  std::filesystem::remove(w.path);
}

// A run split into per-image cells, whatever the split, merges back to recompute_dump's cells
// bit for bit when the images are merged in the selection's order.
TEST(Recompute, PerImageCellsMergeToTheRunInAnySplit) {
  const Written w = write_dump("recompute_split.h5", "mala", "elu1", "mala:elu1@code", 1, 1, 0.125f);
  DumpReader reader(w.path);
  const Variant v = w.attrs.variant();
  const std::vector<int> images = {1, 2, 0};
  const auto whole = analyses::recompute_dump(reader, v, images);
  for (std::size_t cut = 0; cut <= images.size(); ++cut) {
    std::vector<analyses::RecomputeImage> parts;
    const auto keep = [&parts](analyses::RecomputeImage&& img) { parts.push_back(std::move(img)); };
    // Two separate runs: the images before the cut, then the rest (an empty list means every
    // image, so an empty part is not run).
    const std::vector<int> head(images.begin(), images.begin() + static_cast<long>(cut)),
        tail(images.begin() + static_cast<long>(cut), images.end());
    if (!head.empty()) analyses::recompute_images(reader, v, head, keep);
    if (!tail.empty()) analyses::recompute_images(reader, v, tail, keep);
    ASSERT_EQ(parts.size(), images.size()) << "cut " << cut;
    std::vector<analyses::RecomputeCell> merged = analyses::recompute_cells(reader.schema());
    for (std::size_t i = 0; i < parts.size(); ++i) {
      EXPECT_EQ(parts[i].image, images[i]) << "cut " << cut << ": images in order";
      ASSERT_EQ(parts[i].cells.size(), merged.size());
      for (std::size_t c = 0; c < merged.size(); ++c) {
        EXPECT_EQ(parts[i].cells[c].images, 1) << "cut " << cut;
        merged[c].merge(parts[i].cells[c]);
      }
    }
    for (std::size_t c = 0; c < merged.size(); ++c) {
      const std::string where = "cut " + std::to_string(cut) + ", layer " + std::to_string(whole[c].layer) +
                                " head " + std::to_string(whole[c].head);
      EXPECT_EQ(merged[c].layer, whole[c].layer) << where;
      EXPECT_EQ(merged[c].head, whole[c].head) << where;
      EXPECT_EQ(merged[c].images, 3) << where;
      EXPECT_EQ(merged[c].has_out, whole[c].has_out) << where;
      EXPECT_EQ(merged[c].has_attn, whole[c].has_attn) << where;
      EXPECT_EQ(merged[c].out_max_abs, whole[c].out_max_abs) << where;
      EXPECT_EQ(merged[c].out_max_rel, whole[c].out_max_rel) << where;
      EXPECT_EQ(merged[c].out_sum_abs, whole[c].out_sum_abs) << where;
      EXPECT_EQ(merged[c].out_values, whole[c].out_values) << where;
      EXPECT_EQ(merged[c].attn_max_abs, whole[c].attn_max_abs) << where;
      EXPECT_EQ(merged[c].degenerate_rows, whole[c].degenerate_rows) << where;
    }
  }
  // Only the corrupted image (1) of the corrupted head carries its error.
  EXPECT_NEAR(whole[3].out_max_abs, 0.125, 1e-5) << "layer 1, head 1";
  std::filesystem::remove(w.path);
}

TEST(Recompute, MergeTakesMaximaAndSums) {
  analyses::RecomputeCell a, b;
  a.images = 1, a.has_out = true, a.out_max_abs = 0.5, a.out_max_rel = 0.25, a.out_sum_abs = 1.0;
  a.out_values = 10, a.attn_max_abs = 0.0, a.degenerate_rows = 1;
  b.images = 2, b.has_attn = true, b.out_max_abs = 0.25, b.out_max_rel = 0.75, b.out_sum_abs = 2.5;
  b.out_values = 20, b.attn_max_abs = 0.125, b.degenerate_rows = 2;
  a.merge(b);
  EXPECT_EQ(a.images, 3);
  EXPECT_TRUE(a.has_out && a.has_attn);
  EXPECT_EQ(a.out_max_abs, 0.5);
  EXPECT_EQ(a.out_max_rel, 0.75);
  EXPECT_EQ(a.out_sum_abs, 3.5);
  EXPECT_EQ(a.out_values, 30);
  EXPECT_EQ(a.attn_max_abs, 0.125);
  EXPECT_EQ(a.degenerate_rows, 3);
  EXPECT_EQ(a.out_mean_abs(), 3.5 / 30);
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
