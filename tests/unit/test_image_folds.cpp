// Per-image parts and their folds (locality, census, mask): an image's part is the same whoever
// computes it, and folding the parts of any split of the images, in the selection's order, gives
// the same bits as one pass. The pairwise statistics merge against a direct computation.
#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/analyses/masking.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "random_inputs.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace attnscope::analyses {
namespace {

bool same_bits(double a, double b) { return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b); }

/// Expects two statistics to be equal to the last bit.
void expect_same_stats(const RunningStats& got, const RunningStats& want, const std::string& where) {
  EXPECT_EQ(got.count, want.count) << where;
  EXPECT_TRUE(same_bits(got.mean, want.mean)) << where << ": mean " << got.mean << " vs " << want.mean;
  EXPECT_TRUE(same_bits(got.m2, want.m2)) << where << ": m2 " << got.m2 << " vs " << want.m2;
  EXPECT_TRUE(same_bits(got.min, want.min)) << where << ": min " << got.min << " vs " << want.min;
  EXPECT_TRUE(same_bits(got.max, want.max)) << where << ": max " << got.max << " vs " << want.max;
}

TEST(RunningStatsFold, MergedPartsMatchTheDirectStatistics) {
  // Parts of awkward sizes, empty ones included, merged in order, against a two-pass
  // computation over every value at once.
  const std::vector<int> sizes = {0, 1, 2, 197, 0, 63, 1, 196, 5};
  const MatD x = test::random_matrix(1, 1000, 11);
  std::vector<double> all;
  RunningStats folded;
  Eigen::Index next = 0;
  for (int n : sizes) {
    RunningStats part;
    for (int i = 0; i < n; ++i) {
      // Values far from zero, where a one-pass sum of squares would lose digits.
      const double v = 1e3 + x(0, next++);
      part.add(v);
      all.push_back(v);
    }
    folded.merge(part);
  }
  long double sum = 0;
  for (double v : all) sum += v;
  const long double mean = sum / static_cast<long double>(all.size());
  long double m2 = 0;
  double lo = all.front(), hi = all.front();
  for (double v : all) {
    m2 += (v - mean) * (v - mean);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  ASSERT_EQ(folded.count, static_cast<std::int64_t>(all.size()));
  EXPECT_NEAR(folded.mean, static_cast<double>(mean), 1e-15 * 1e3);
  EXPECT_NEAR(folded.m2, static_cast<double>(m2), 1e-12 * static_cast<double>(m2));
  EXPECT_NEAR(folded.stddev(), std::sqrt(static_cast<double>(m2) / static_cast<double>(all.size())), 1e-12);
  EXPECT_EQ(folded.min, lo);
  EXPECT_EQ(folded.max, hi);
  // An empty part changes nothing, bits included.
  RunningStats again = folded;
  again.merge(RunningStats{});
  expect_same_stats(again, folded, "merge of an empty part");
}

/// A small synthetic dump, and the selection's image order cut into blocks in every way that
/// processes could share it (two blocks at every point, and three).
class ImageFolds : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    opts_.layers = 2;
    opts_.heads = 2;
    opts_.grid = TokenGrid{1, 5, 6};
    opts_.head_dim = 7;
    opts_.images = 6;
    opts_.seed = 9;
    opts_.plant_duplicates = 1;
    path_ = (std::filesystem::temp_directory_path() /
             ("attnscope_image_folds_" + std::to_string(::getpid()) + ".h5"))
                .string();
    write_synth_dump(path_, opts_);
  }
  static void TearDownTestSuite() { std::filesystem::remove(path_); }

  /// The selection: images out of order, layers and heads a subset.
  static Selection selection() {
    DumpReader reader(path_);
    Selection sel;
    sel.images = {4, 0, 5, 2, 1};
    sel.layers = {1, 0};
    sel.heads = {1};
    return resolve(reader.schema(), sel);
  }

  /// Every way to cut n images into contiguous blocks of two or three (block ends, in order).
  static std::vector<std::vector<std::size_t>> splits(std::size_t n) {
    std::vector<std::vector<std::size_t>> out;
    for (std::size_t a = 0; a <= n; ++a) {
      out.push_back({a, n});
      for (std::size_t b = a; b <= n; ++b) out.push_back({a, b, n});
    }
    return out;
  }

  /// The images of block [begin, end) of the selection.
  static Selection block(const Selection& sel, std::size_t begin, std::size_t end) {
    Selection part = sel;
    part.images.assign(sel.images.begin() + static_cast<std::ptrdiff_t>(begin),
                       sel.images.begin() + static_cast<std::ptrdiff_t>(end));
    return part;
  }

  static std::string where(const std::vector<std::size_t>& ends) {
    std::string s = "blocks ending at";
    for (std::size_t e : ends) s += " " + std::to_string(e);
    return s;
  }

  static SynthOptions opts_;
  static std::string path_;
};
SynthOptions ImageFolds::opts_;
std::string ImageFolds::path_;

TEST_F(ImageFolds, LocalityAnySplitGivesTheSameBitsAsOnePass) {
  const Selection sel = selection();
  const auto variants = parse_variants("softmax,inline,mala");
  DumpReader reader(path_);
  const TokenGrid grid = reader.schema().attrs.grid;
  const double scale = reader.schema().attrs.scale;
  const LocalityResult whole = run_locality(reader, sel, variants, 3);
  ASSERT_EQ(whole.images, 5);

  // The one pass against the statistics of every query computed directly.
  for (std::size_t v = 0; v < variants.size(); ++v) {
    for (const LocalityHead& h : whole.per_head[v]) {
      std::vector<double> values;
      for (int image : sel.images) {
        const ImageQKV img = synth_image(opts_, image);
        for (double m : local_mass(variants[v], img.Q(h.layer, h.head), img.K(h.layer, h.head), scale, grid, 3)) {
          if (!std::isnan(m)) values.push_back(m);
        }
      }
      double sum = 0;
      for (double m : values) sum += m;
      const double mean = sum / static_cast<double>(values.size());
      double m2 = 0;
      for (double m : values) m2 += (m - mean) * (m - mean);
      const std::string at = variants[v].name() + " layer " + std::to_string(h.layer) + " head " +
                             std::to_string(h.head);
      ASSERT_EQ(h.mass.count, static_cast<std::int64_t>(values.size())) << at;
      EXPECT_NEAR(h.mass.mean, mean, 1e-13 * std::max(1.0, std::abs(mean))) << at;
      EXPECT_NEAR(h.mass.m2, m2, 1e-12 * std::max(1.0, m2)) << at;
    }
  }

  std::vector<LocalityImage> parts;
  locality_images(reader, sel, variants, 3, false, [&](LocalityImage&& img) { parts.push_back(std::move(img)); });
  ASSERT_EQ(parts.size(), sel.images.size());
  for (const auto& ends : splits(sel.images.size())) {
    LocalityTotals totals(variants, sel, grid, 3);
    std::size_t begin = 0, pos = 0;
    for (std::size_t end : ends) {
      DumpReader own(path_);  // another process's reader
      locality_images(own, block(sel, begin, end), variants, 3, false, [&](LocalityImage&& img) {
        // The part of an image is the same whoever computes it.
        const LocalityImage& want = parts[pos++];
        EXPECT_EQ(img.image, want.image) << where(ends);
        for (std::size_t v = 0; v < variants.size(); ++v) {
          for (std::size_t s = 0; s < want.heads[v].size(); ++s) {
            expect_same_stats(img.heads[v][s].mass, want.heads[v][s].mass,
                              where(ends) + " image " + std::to_string(img.image));
          }
        }
        totals.add(img);
      });
      begin = end;
    }
    const LocalityResult& got = totals.result();
    EXPECT_EQ(got.images, whole.images) << where(ends);
    for (std::size_t v = 0; v < variants.size(); ++v) {
      for (std::size_t s = 0; s < whole.per_head[v].size(); ++s) {
        const std::string at = where(ends) + " " + variants[v].name() + " slot " + std::to_string(s);
        expect_same_stats(got.per_head[v][s].mass, whole.per_head[v][s].mass, at);
        EXPECT_EQ(got.per_head[v][s].degenerate_rows, whole.per_head[v][s].degenerate_rows) << at;
      }
    }
  }
}

void expect_same_cell(const CensusCell& got, const CensusCell& want, const std::string& at) {
  EXPECT_EQ(got.variant, want.variant) << at;
  EXPECT_EQ(got.layer, want.layer) << at;
  EXPECT_EQ(got.head, want.head) << at;
  EXPECT_EQ(got.rows, want.rows) << at;
  EXPECT_EQ(got.weights, want.weights) << at;
  EXPECT_EQ(got.negative, want.negative) << at;
  EXPECT_EQ(got.zero, want.zero) << at;
  EXPECT_TRUE(same_bits(got.most_negative, want.most_negative)) << at;
  EXPECT_EQ(got.rows_not_summing_to_one, want.rows_not_summing_to_one) << at;
  EXPECT_TRUE(same_bits(got.max_row_sum_error, want.max_row_sum_error)) << at;
  EXPECT_EQ(got.degenerate_rows, want.degenerate_rows) << at;
}

TEST_F(ImageFolds, CensusAnySplitGivesTheSameCountsAsOnePass) {
  const Selection sel = selection();
  const auto variants = parse_variants("inline,mala");
  DumpReader reader(path_);
  const double scale = reader.schema().attrs.scale;
  // One pass: every head of every image into one collector.
  CensusCollector one(variants, sel, scale, 1e-6);
  for_each_head(reader, sel, [&](const HeadView& h) { one.add_head(h); });
  const auto whole = one.cells();
  long long negative = 0;
  for (const auto& c : whole) negative += c.negative;
  EXPECT_GT(negative, 0) << "the synthetic heads give negative MALA weights: the counts are not all zero";

  for (const auto& ends : splits(sel.images.size())) {
    CensusCollector totals(variants, sel, scale, 1e-6);
    std::vector<int> seen;
    std::size_t begin = 0;
    for (std::size_t end : ends) {
      DumpReader own(path_);
      census_images(own, block(sel, begin, end), variants, scale, 1e-6,
                    [&](int image, std::vector<CensusCell>&& cells) {
                      seen.push_back(image);
                      for (const auto& c : cells) EXPECT_LE(c.rows, opts_.tokens()) << "one image's cells";
                      totals.add(cells);
                    });
      begin = end;
    }
    EXPECT_EQ(seen, sel.images) << where(ends);
    const auto got = totals.cells();
    ASSERT_EQ(got.size(), whole.size());
    for (std::size_t i = 0; i < got.size(); ++i) expect_same_cell(got[i], whole[i], where(ends) + " cell " + std::to_string(i));
  }
  CensusCollector wrong(parse_variants("inline"), sel, scale, 1e-6);
  EXPECT_THROW(wrong.add(whole), Error) << "cells of another selection";
}

TEST_F(ImageFolds, MaskAnySplitGivesTheSameBitsAsOnePass) {
  const Selection sel = selection();
  const auto variants = parse_variants("softmax,inline");
  const auto masks = parse_mask_specs("local:3,random:4");
  DumpReader reader(path_);
  const TokenGrid grid = reader.schema().attrs.grid;
  const double scale = reader.schema().attrs.scale;
  constexpr std::uint64_t kSeed = 5;
  // One pass: every head of every image into one collector, as the command did before runs
  // were split.
  MaskCollector one(variants, masks, sel, grid, scale, kSeed);
  for_each_head(reader, sel, [&](const HeadView& h) { one.add_head(h); });
  const auto whole = one.cells();

  for (const auto& ends : splits(sel.images.size())) {
    MaskCollector totals(variants, masks, sel, grid, scale, kSeed);
    std::size_t begin = 0;
    for (std::size_t end : ends) {
      DumpReader own(path_);
      mask_images(own, block(sel, begin, end), variants, masks, grid, scale, kSeed,
                  [&](int image, std::vector<MaskCell>&& cells) {
                    for (const auto& c : cells) {
                      EXPECT_EQ(c.change.count + c.unmeasured_heads, 1)
                          << "image " << image << ": one value per head and image";
                    }
                    totals.add(cells);
                  });
      begin = end;
    }
    const auto got = totals.cells();
    ASSERT_EQ(got.size(), whole.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      const std::string at = where(ends) + " " + whole[i].variant + " " + whole[i].mask + " layer " +
                             std::to_string(whole[i].layer) + " head " + std::to_string(whole[i].head);
      EXPECT_EQ(got[i].variant, whole[i].variant) << at;
      EXPECT_EQ(got[i].mask, whole[i].mask) << at;
      expect_same_stats(got[i].change, whole[i].change, at + " change");
      expect_same_stats(got[i].removed_mass, whole[i].removed_mass, at + " removed mass");
      EXPECT_EQ(got[i].empty_rows, whole[i].empty_rows) << at;
      EXPECT_EQ(got[i].degenerate_rows, whole[i].degenerate_rows) << at;
      EXPECT_EQ(got[i].unmeasured_heads, whole[i].unmeasured_heads) << at;
    }
    EXPECT_EQ(got.front().change.count, 5) << where(ends);
  }
}

}  // namespace
}  // namespace attnscope::analyses
