// Query transforms f1, f2, l2norm, none against the reference, zero rows, and f2 sharing its
// parameters with relu_affine.
#include "attnscope/error.hpp"
#include "attnscope/feature_map.hpp"
#include "attnscope/query_transform.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"

#include <gtest/gtest.h>

namespace attnscope {
namespace {

constexpr std::uint64_t kSeed = 4242;

template <typename T>
void transforms_match_reference() {
  for (const char* spec : {"none", "f1", "f2", "l2norm"}) {
    const QueryTransform t = parse_query_transform(spec, 17);
    for (int n : test::kAwkwardN) {
      for (int d : test::kAwkwardD) {
        const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
        MatD q = test::random_matrix(n, d, seed);
        if (n > 1) q.row(1).setZero();  // a zero row
        const std::string where = test::config(spec, n, d, seed, test::precision_name<T>());
        int want_zero = -1, got_zero = -1;
        const MatD want = reference::query_transform(t, test::rounded<T>(q), &want_zero);
        const Mat<T> got = t.apply<T>(test::as<T>(q), &got_zero);
        const double tol = sizeof(T) == sizeof(double) ? test::kDoubleTol : 2e-6;
        EXPECT_TRUE(test::matrices_near(got, want, tol, where));
        EXPECT_EQ(got_zero, want_zero) << where;
        // f2 maps a zero row to ReLU(b) / |ReLU(b)|, the others keep it zero.
        if (n > 1 && !t.is_identity() && t.kind != QueryTransformKind::F2) {
          EXPECT_TRUE(got.row(1).isZero(0.0)) << where;
        }
      }
    }
  }
}

TEST(QueryTransform, MatchesReferenceDouble) { transforms_match_reference<double>(); }
TEST(QueryTransform, MatchesReferenceFloat) { transforms_match_reference<float>(); }

TEST(QueryTransform, RowsHaveUnitNormOrAreZero) {
  const MatD q = test::random_matrix(50, 7, kSeed);
  for (const char* spec : {"f1", "f2", "l2norm"}) {
    int zero = 0;
    const MatD y = parse_query_transform(spec, 3).apply<double>(q, &zero);
    int zero_rows = 0;
    for (Eigen::Index i = 0; i < y.rows(); ++i) {
      const double norm = y.row(i).norm();
      if (norm == 0.0) {
        ++zero_rows;
      } else {
        EXPECT_NEAR(norm, 1.0, 1e-14) << spec << " row " << i;
      }
    }
    EXPECT_EQ(zero, zero_rows) << spec;
  }
}

TEST(QueryTransform, F1CountsAllNegativeRows) {
  MatD q(3, 2);
  q << -1.0, -2.0, 3.0, -4.0, -0.5, 0.0;
  int zero = 0;
  const MatD y = parse_query_transform("f1").apply<double>(q, &zero);
  EXPECT_EQ(zero, 2);
  EXPECT_EQ(y, (MatD(3, 2) << 0.0, 0.0, 1.0, 0.0, 0.0, 0.0).finished());
}

TEST(QueryTransform, F2SharesParametersWithReluAffine) {
  const MatD q = test::random_matrix(20, 7, kSeed);
  const MatD phi = parse_feature_map("relu_affine=11").apply<double>(q);
  const MatD f2 = parse_query_transform("f2", 11).apply<double>(q);
  MatD want = phi;
  for (Eigen::Index i = 0; i < want.rows(); ++i) {
    const double norm = phi.row(i).norm();
    if (norm > 0.0) want.row(i) /= norm;
  }
  EXPECT_TRUE(test::matrices_near(f2, want, test::kDoubleTol, "f2 seed 11 vs relu_affine=11"));
}

TEST(QueryTransform, NamesAndErrors) {
  for (const char* spec : {"none", "f1", "f2", "l2norm"}) {
    EXPECT_EQ(parse_query_transform(spec).name(), spec);
  }
  EXPECT_TRUE(parse_query_transform("none").is_identity());
  EXPECT_FALSE(parse_query_transform("f1").is_identity());
  try {
    (void)parse_query_transform("f3");
    FAIL() << "f3 should not parse";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("l2norm"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnscope
