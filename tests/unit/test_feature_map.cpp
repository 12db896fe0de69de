// Feature maps: values against the reference, names and parsing, the drawn affine parameters and
// the overflow check.
#include "attnscope/error.hpp"
#include "attnscope/feature_map.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope {
namespace {

constexpr std::uint64_t kSeed = 31;

template <typename T>
void maps_match_reference() {
  for (const std::string& spec : test::feature_map_specs()) {
    const FeatureMap map = parse_feature_map(spec);
    for (int n : test::kAwkwardN) {
      for (int d : test::kAwkwardD) {
        const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
        const MatD x = test::random_matrix(n, d, seed);
        const std::string where = test::config(spec, n, d, seed, test::precision_name<T>());
        const MatD want = reference::feature_map(map, test::rounded<T>(x));
        const Mat<T> got = map.apply<T>(test::as<T>(x));
        // float applies phi in float: a few float ulps of the largest value.
        const double tol = sizeof(T) == sizeof(double) ? test::kDoubleTol : 2e-6;
        EXPECT_TRUE(test::matrices_near(got, want, tol, where));
        EXPECT_EQ(got.cols(), map.out_dim(d)) << where;
      }
    }
  }
}

TEST(FeatureMap, MatchesReferenceDouble) { maps_match_reference<double>(); }
TEST(FeatureMap, MatchesReferenceFloat) { maps_match_reference<float>(); }

TEST(FeatureMap, PointValuesFromTheDefinitions) {
  MatD x(1, 3);
  x << -2.0, 0.0, 1.5;
  const auto apply = [&](const char* spec) { return parse_feature_map(spec).apply<double>(x); };
  EXPECT_EQ(apply("identity"), x);
  EXPECT_EQ(apply("relu"), (MatD(1, 3) << 0.0, 0.0, 1.5).finished());
  EXPECT_EQ(apply("leaky_relu=0.2"), (MatD(1, 3) << -0.4, 0.0, 1.5).finished());
  EXPECT_EQ(apply("leaky_relu"), (MatD(1, 3) << -0.02, 0.0, 1.5).finished());
  // ELU(x) + 1: exp(x) - 1 + 1 below zero, x + 1 above.
  EXPECT_NEAR(apply("elu1")(0, 0), std::exp(-2.0), 1e-15);
  EXPECT_NEAR(apply("elu1")(0, 1), 1.0, 1e-15);
  EXPECT_NEAR(apply("elu1")(0, 2), 2.5, 1e-15);
  EXPECT_NEAR(apply("exp")(0, 2), std::exp(1.5), 1e-14);
}

// FLatten's focused map, phi_P(x) = (|r| / |r^P|) r^P with r = ReLU(x), from its definition.
TEST(FeatureMap, FocusedFromItsDefinition) {
  MatD x(3, 3);
  x << 3.0, -1.0, 4.0,  // r = [3, 0, 4], |r| = 5, r^2 = [9, 0, 16], |r^2| = sqrt(337)
      -1.0, -2.0, 0.0,  // ReLU kills the row: phi = 0
      1e200, 2e200, -1.0;  // r^P would overflow: the map must not
  const MatD y = parse_feature_map("focused=2").apply<double>(x);
  const double c = 5.0 / std::sqrt(337.0);
  EXPECT_NEAR(y(0, 0), 9.0 * c, 1e-14);
  EXPECT_EQ(y(0, 1), 0.0);
  EXPECT_NEAR(y(0, 2), 16.0 * c, 1e-14);
  EXPECT_EQ(y.row(1), MatD::Zero(1, 3));
  // r = 1e200 [1, 2, 0]: |r| = sqrt(5) 1e200, r^2 direction [1, 4, 0] / sqrt(17).
  EXPECT_NEAR(y(2, 0) / 1e200, std::sqrt(5.0) / std::sqrt(17.0), 1e-14);
  EXPECT_NEAR(y(2, 1) / 1e200, 4.0 * std::sqrt(5.0) / std::sqrt(17.0), 1e-14);
  // Norm-preserving, positively homogeneous; P = 1 is ReLU.
  EXPECT_NEAR(y.row(0).norm(), 5.0, 1e-14);
  const MatD y3 = parse_feature_map("focused=2").apply<double>(MatD(3.0 * x.topRows(1)));
  EXPECT_NEAR((y3 - 3.0 * y.topRows(1)).norm(), 0.0, 1e-13);
  EXPECT_TRUE(parse_feature_map("focused").positively_homogeneous());
  EXPECT_FALSE(parse_feature_map("elu1").positively_homogeneous());
  EXPECT_NEAR((parse_feature_map("focused=1").apply<double>(x.topRows(1)) -
               parse_feature_map("relu").apply<double>(x.topRows(1))).norm(), 0.0, 1e-14);
  EXPECT_EQ(parse_feature_map("focused").name(), "focused=3");
  for (const char* bad : {"focused=0", "focused=-1", "focused=abc", "focused=inf"}) {
    EXPECT_THROW((void)parse_feature_map(bad), UsageError) << bad;
  }
}

TEST(FeatureMap, NamesRoundTrip) {
  for (const std::string& spec : test::feature_map_specs()) {
    const FeatureMap map = parse_feature_map(spec);
    EXPECT_EQ(map.name(), spec);
    EXPECT_EQ(parse_feature_map(map.name()).name(), spec);
  }
  EXPECT_EQ(parse_feature_map("leaky_relu").name(), "leaky_relu=0.01");
  EXPECT_EQ(parse_feature_map("relu_affine", 12).name(), "relu_affine=12");
}

TEST(FeatureMap, ParseErrorsListKnownNames) {
  try {
    (void)parse_feature_map("gelu");
    FAIL() << "gelu should not parse";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    for (const char* name : {"identity", "relu", "leaky_relu", "elu1", "exp", "relu_affine", "focused"}) {
      EXPECT_NE(what.find(name), std::string::npos) << what;
    }
  }
  EXPECT_THROW((void)parse_feature_map("leaky_relu=abc"), UsageError);
  EXPECT_THROW((void)parse_feature_map("leaky_relu=nan"), UsageError);
  EXPECT_THROW((void)parse_feature_map("relu_affine=-1"), UsageError);
  EXPECT_THROW((void)parse_feature_map("relu=3"), UsageError);
  EXPECT_THROW((void)parse_feature_map(""), UsageError);
}

TEST(FeatureMap, AffineParametersAreSeededWithTheDocumentedStatistics) {
  MatD a1, a2, a3;
  VecD b1, b2, b3;
  draw_affine_params(5, 64, a1, b1);
  draw_affine_params(5, 64, a2, b2);
  draw_affine_params(6, 64, a3, b3);
  EXPECT_EQ(a1, a2);
  EXPECT_EQ(b1, b2);
  EXPECT_NE(a1, a3);
  ASSERT_EQ(a1.rows(), 64);
  ASSERT_EQ(a1.cols(), 64);
  ASSERT_EQ(b1.size(), 64);
  // 4096 entries of N(0, 1/64): sample variance within 10% of 1/64 and mean near 0 (loose
  // bounds, many standard errors wide).
  const double mean = a1.mean();
  const double var = (a1.array() - mean).square().sum() / (4096.0 - 1.0);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(var * 64.0, 1.0, 0.1);
  EXPECT_NEAR(b1.mean(), 0.0, 0.5);

  FeatureMap map = parse_feature_map("relu_affine=5");
  map.ensure_params(64);
  EXPECT_EQ(map.A, a1);
  EXPECT_EQ(map.b, b1);
  // Given parameters of matching width are kept; out_dim follows A's rows.
  FeatureMap given = parse_feature_map("relu_affine");
  given.A = MatD::Ones(3, 2);
  given.b = VecD::Zero(3);
  given.ensure_params(2);
  EXPECT_EQ(given.A, MatD::Ones(3, 2));
  EXPECT_EQ(given.out_dim(2), 3);
  EXPECT_EQ(given.apply<double>(MatD::Ones(1, 2)), MatD::Constant(1, 3, 2.0));
}

TEST(FeatureMap, UnsetParametersAreDrawnOnApply) {
  const MatD x = test::random_matrix(5, 7, kSeed);
  FeatureMap drawn = parse_feature_map("relu_affine=9");
  const MatD lazy = drawn.apply<double>(x);
  drawn.ensure_params(7);
  EXPECT_EQ(lazy, drawn.apply<double>(x));
}

TEST(FeatureMap, ExpOverflowThrowsNamingTheRow) {
  MatF x = MatF::Zero(4, 3);
  x(2, 1) = 100.0f;  // exp(100) is not a float
  try {
    (void)parse_feature_map("exp").apply<float>(x);
    FAIL() << "exp(100) in float should throw NumericalError";
  } catch (const NumericalError& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
  MatD y = MatD::Zero(3, 2);
  y(0, 0) = 710.0;
  EXPECT_THROW((void)parse_feature_map("exp").apply<double>(y), NumericalError);
  EXPECT_NO_THROW((void)parse_feature_map("exp").apply<double>(x.cast<double>()));
}

}  // namespace
}  // namespace attnscope
