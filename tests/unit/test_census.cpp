// Weight census: counts of one matrix by hand, the collector against plain-loop counts of the
// reference weights (exact), the default variants, and the code+rope refusal.
#include "attnscope/analyses/census.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "reference.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 777;

TEST(CensusOf, CountsByHand) {
  MatD w(3, 3);
  w << 0.5, 0.5, 0.0,     // sums to 1, one zero
      1.5, -0.25, -0.25,  // sums to 1, two negatives
      0.2, 0.2, 0.2;      // sums to 0.6
  const CensusCell c = census_of(w, {}, 1e-6);
  EXPECT_EQ(c.rows, 3);
  EXPECT_EQ(c.weights, 9);
  EXPECT_EQ(c.negative, 2);
  EXPECT_EQ(c.zero, 1);
  EXPECT_EQ(c.most_negative, -0.25);
  EXPECT_EQ(c.rows_not_summing_to_one, 1);
  EXPECT_NEAR(c.max_row_sum_error, 0.4, 1e-15);
  EXPECT_EQ(c.degenerate_rows, 0);
}

TEST(CensusOf, DegenerateRowsAreLeftOut) {
  MatD w = MatD::Zero(3, 2);
  w.row(1) << 0.25, 0.75;
  const CensusCell c = census_of(w, {0, 2}, 1e-6);
  EXPECT_EQ(c.rows, 1);
  EXPECT_EQ(c.weights, 2);
  EXPECT_EQ(c.zero, 0);
  EXPECT_EQ(c.degenerate_rows, 2);
  EXPECT_EQ(c.rows_not_summing_to_one, 0);
}

TEST(CensusOf, ToleranceDecidesTheSumCount) {
  MatD w(1, 2);
  w << 0.5, 0.5 + 1e-7;
  EXPECT_EQ(census_of(w, {}, 1e-6).rows_not_summing_to_one, 0);
  EXPECT_EQ(census_of(w, {}, 1e-8).rows_not_summing_to_one, 1);
}

/// Plain-loop census of the reference weights, for comparison.
CensusCell plain_census(const Variant& v, const MatF& q, const MatF& k, double scale) {
  std::vector<int> degenerate;
  const MatD w =
      reference::weights(v, q.cast<double>(), k.cast<double>(), scale, nullptr, &degenerate);
  CensusCell c;
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    if (std::find(degenerate.begin(), degenerate.end(), i) != degenerate.end()) continue;
    ++c.rows;
    double sum = 0;
    for (Eigen::Index j = 0; j < w.cols(); ++j) {
      ++c.weights;
      if (w(i, j) < 0) ++c.negative;
      if (w(i, j) == 0) ++c.zero;
      c.most_negative = std::min(c.most_negative, w(i, j));
      sum += w(i, j);
    }
    c.max_row_sum_error = std::max(c.max_row_sum_error, std::abs(sum - 1));
  }
  return c;
}

TEST(CensusCollector, MatchesPlainCountsOfTheReference) {
  SynthOptions so;
  so.images = 2;
  so.seed = kSeed;
  Selection sel;
  sel.images = {0, 1};
  sel.layers = {0, 2};
  sel.heads = {0, 2};
  // Every family of the registry (its default map, relu where it needs one) as well.
  std::string every_family;
  for (const AttentionFamily* f : test::qk_families()) {
    every_family += (every_family.empty() ? "" : ",") + example_spec(*f);
  }
  for (const std::string& specs : {std::string("inline,mala"), std::string("inline@code,mala:elu1@code"),
                                   std::string("mala:relu"), every_family}) {
    const auto variants = parse_variants(specs);
    CensusCollector collector(variants, sel, so.scale(), 1e-6);
    std::vector<ImageQKV> images;
    for (int image : sel.images) images.push_back(synth_image(so, image));
    for (int image : sel.images) {
      const ImageQKV& img = images[static_cast<std::size_t>(image)];
      for (int l : sel.layers)
        for (int h : sel.heads)
          collector.add_head({image, l, h, img.Q(l, h), img.K(l, h), img.V(l, h)});
    }
    const auto cells = collector.cells();
    ASSERT_EQ(cells.size(), variants.size() * 4);
    std::size_t i = 0;
    for (const Variant& v : variants) {
      for (int l : sel.layers) {
        for (int h : sel.heads) {
          const CensusCell& got = cells[i++];
          CensusCell want;
          for (const ImageQKV& img : images)
            want.merge(plain_census(v, img.Q(l, h), img.K(l, h), so.scale()));
          const std::string where = v.name() + " layer " + std::to_string(l) + " head " +
                                    std::to_string(h) + " seed " + std::to_string(kSeed);
          EXPECT_EQ(got.variant, v.name()) << where;
          EXPECT_EQ(got.layer, l) << where;
          EXPECT_EQ(got.head, h) << where;
          EXPECT_EQ(got.rows, want.rows) << where;
          EXPECT_EQ(got.weights, want.weights) << where;
          EXPECT_EQ(got.negative, want.negative) << where;
          EXPECT_EQ(got.zero, want.zero) << where;
          EXPECT_NEAR(got.most_negative, want.most_negative,
                      1e-12 * std::max(1.0, std::abs(want.most_negative)))
              << where;
          EXPECT_LE(got.max_row_sum_error, 1e-9) << where;
          EXPECT_EQ(got.rows_not_summing_to_one, 0) << where;
        }
      }
    }
  }
}

TEST(CensusCollector, SynthQueriesGiveNegativeMalaWeights) {
  // The synthetic heads are spread enough that MALA's subtraction goes below zero: the census
  // must see it (the MALA paper's "never negative" is a property of trained models, if any).
  SynthOptions so;
  so.images = 1;
  Selection sel;
  sel.images = {0};
  sel.layers = {0};
  sel.heads = {0};
  CensusCollector collector(parse_variants("mala"), sel, so.scale(), 1e-6);
  const ImageQKV img = synth_image(so, 0);
  collector.add_head({0, 0, 0, img.Q(0, 0), img.K(0, 0), img.V(0, 0)});
  const CensusCell c = collector.cells().at(0);
  EXPECT_GT(c.negative, 0);
  EXPECT_LT(c.most_negative, 0.0);
}

TEST(DefaultCensusVariants, OwnVariantOrFamilyDefaultsUnderTheDumpsConvention) {
  DumpAttributes a;
  a.attention_family = "softmax";
  a.convention = "paper";
  a.feature_map = "none";
  auto v = default_census_variants(a);
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].name(), parse_variant("inline:identity@paper").name());
  EXPECT_EQ(v[1].name(), parse_variant("mala:elu1@paper").name());

  a.attention_family = "inline";
  a.convention = "code";
  a.feature_map = "relu";
  v = default_census_variants(a);
  EXPECT_EQ(v[0].name(), parse_variant("inline:relu@code").name());
  EXPECT_EQ(v[1].name(), parse_variant("mala:elu1@code").name());
}

TEST(CensusCollector, CodeRopeOfAFamilyWithoutItIsRefusedWithTheReason) {
  Selection sel;
  sel.images = {0};
  sel.layers = {0};
  sel.heads = {0};
  try {
    CensusCollector c(parse_variants("inline@code+rope"), sel, 0.25, 1e-6);
    FAIL() << "inline@code+rope was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("code+rope"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(CensusCollector(parse_variants("mala@code+rope"), sel, 0.25, 1e-6));  // mala_rope@code
  EXPECT_THROW(CensusCollector(parse_variants("mala"), sel, 0.25, -1.0), UsageError);
}

}  // namespace
}  // namespace attnscope::analyses
