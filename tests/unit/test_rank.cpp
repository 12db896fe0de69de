// Rank diagnostics: the fast path (registry weights and features, singular_values) against the reference
// (ExactRows, one-sided Jacobi SVD, plain loops) on awkward sizes and every family; exact ranks on
// matrices built to have them (uniform rows: rank 1; one-hot rows to distinct keys: rank N,
// effective rank N; the kernel families' rank bound r + 1); the InLine Prop. 1 assumptions failing
// where they must (a repeated column of K; K on a hyperplane, so [K, 1] loses a rank while K keeps
// its own); the key-value state; the rank-collapse residual.
#include "attnscope/analyses/rank.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>
#include <Eigen/SVD>

#include <cmath>
#include <limits>

namespace attnscope::analyses {
namespace {

/// Singular values of two SVD algorithms agree to a few ulps of the largest: ratios (<= 1) within
/// this, effective ranks within this relative.
constexpr double kSpectrumTol = 1e-10;

MatD to_double(const MatF& x) {
  MatD out(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) out(i, j) = static_cast<double>(x(i, j));
  }
  return out;
}

/// Whether a singular value of m lies within a factor 1e3 of numpy's rank tolerance: there two
/// correct SVDs may count the rank differently, so ranks are compared only away from it.
bool near_the_tolerance(const MatD& m) {
  const VecD s = Eigen::JacobiSVD<MatD>(m).singularValues();
  if (s.size() == 0 || !(s(0) > 0)) return false;
  const double tol = s(0) * static_cast<double>(std::max(m.rows(), m.cols())) *
                     std::numeric_limits<double>::epsilon();
  for (Eigen::Index i = 0; i < s.size(); ++i) {
    if (s(i) > tol * 1e-3 && s(i) < tol * 1e3) return true;
  }
  return false;
}

void expect_same(const Spectrum& a, const Spectrum& b, bool compare_rank, const std::string& what) {
  if (compare_rank) {
    EXPECT_EQ(a.rank, b.rank) << what;
    EXPECT_EQ(a.full_column_rank, b.full_column_rank) << what;
  }
  EXPECT_NEAR(a.erank, b.erank, kSpectrumTol * std::max(1.0, b.erank)) << what;
  EXPECT_NEAR(a.ratio, b.ratio, kSpectrumTol) << what;
}

TEST(Rank, FastMatchesReferenceOnEveryFamily) {
  for (const std::string& spec : test::all_variant_specs()) {
    // N = 197 with the one-sided Jacobi reference is slow: every family, but one map per family.
    const bool large =
        spec.find(':') == std::string::npos || spec.find(":relu@") != std::string::npos;
    for (int n : {1, 2, 63, 197}) {
      if (n == 197 && !large) continue;
      for (int d : {1, 60}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(n, d, 61, mean).cast<float>();
        const MatF k = test::random_matrix(n, d, 62, mean).cast<float>();
        const MatF vals = test::random_matrix(n, 5, 63).cast<float>();
        const MatF out = test::random_matrix(n, 5, 64).cast<float>();
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const std::string what = spec + " N=" + std::to_string(n) + " d=" + std::to_string(d);
        const HeadRank fast = head_rank(v, q, k, vals, &out, scale, {});
        const HeadRank ref = head_rank_reference(v, q, k, vals, &out, scale, {});
        const MatD w = attention_weights<double>(v, to_double(q), to_double(k), scale);
        EXPECT_EQ(fast.degenerate, ref.degenerate) << what;
        expect_same(fast.w, ref.w, !near_the_tolerance(w), what + " W");
        expect_same(fast.k, ref.k, !near_the_tolerance(to_double(k)), what + " K");
        expect_same(fast.k1, ref.k1, true, what + " [K, 1]");
        ASSERT_EQ(fast.has_kv, v.linear_time_outputs()) << what;
        EXPECT_EQ(ref.has_kv, fast.has_kv) << what;
        if (fast.has_kv) {
          expect_same(fast.fk, ref.fk, false, what + " F_k");
          expect_same(fast.fk1, ref.fk1, false, what + " [F_k, 1]");
          expect_same(fast.kv, ref.kv, false, what + " F_k^T V");
        }
        EXPECT_NEAR(fast.out_residual, ref.out_residual, 1e-12) << what;
      }
    }
  }
}

TEST(Rank, UniformRowsHaveRankOneAndOneHotRowsRankN) {
  for (int n : {1, 2, 63, 197}) {
    // Zero queries: every softmax row is exactly 1/N, W = 1 1^T / N.
    const MatF zero = MatF::Zero(n, 4);
    const MatF k = test::random_matrix(n, 4, 3).cast<float>();
    const MatF vals = test::random_matrix(n, 4, 4).cast<float>();
    const HeadRank uniform = head_rank(parse_variant("softmax"), zero, k, vals, nullptr, 1.0, {});
    EXPECT_EQ(uniform.w.rank, 1) << n;
    EXPECT_NEAR(uniform.w.erank, 1.0, 1e-10) << n;  // rounding noise: N singular values of ~1e-16
    EXPECT_TRUE(std::isnan(uniform.out_residual));
    // Row i one-hot on key (i + 1) mod N: a permutation, every singular value 1.
    MatF q = MatF::Zero(n, n);
    for (int i = 0; i < n; ++i) q(i, (i + 1) % n) = 1000.0F;
    const HeadRank perm =
        head_rank(parse_variant("softmax"), q, MatF::Identity(n, n), vals, nullptr, 1.0, {});
    EXPECT_EQ(perm.w.rank, n);
    EXPECT_NEAR(perm.w.erank, n, 1e-9 * n);
    EXPECT_NEAR(perm.w.ratio, 1.0, 1e-12);
    EXPECT_EQ(perm.w.full_column_rank, true);
  }
}

TEST(Rank, KernelFamiliesAreBoundedByTheirFeatureWidth) {
  // W = Z M with M = [F_k^T; 1^T]: rank at most r (+ 1 with an offset), far below N = 63 at d = 4.
  for (const std::string& spec : test::linear_family_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    const double mean = test::input_mean(v);
    const MatF q = test::random_matrix(63, 4, 7, mean).cast<float>();
    const MatF k = test::random_matrix(63, 4, 8, mean).cast<float>();
    const HeadRank r = head_rank(v, q, k, MatF::Ones(63, 3), nullptr, 0.5, {});
    const int width = v.kernel()->feature_dim(v, 4) + (v.kernel()->has_offset() ? 1 : 0);
    EXPECT_LE(r.w.rank, width) << spec;
    EXPECT_GE(r.w.rank, 1) << spec;
    EXPECT_LE(r.kv.rank, 1) << spec << ": V of rank 1 gives a state of rank 1 at most";
  }
  // Softmax has no such bound: exp of a rank-4 matrix is full rank here.
  const MatF q = test::random_matrix(63, 4, 7).cast<float>();
  const MatF k = test::random_matrix(63, 4, 8).cast<float>();
  const HeadRank s = head_rank(parse_variant("softmax"), q, k, MatF::Ones(63, 3), nullptr, 2.0, {});
  EXPECT_GT(s.w.rank, 5);
  EXPECT_FALSE(s.has_kv);
}

TEST(Rank, Proposition1AssumptionsFailWhereTheyMust) {
  MatF k = test::random_matrix(50, 6, 9).cast<float>();
  const MatF q = test::random_matrix(50, 6, 10).cast<float>();
  const MatF vals = test::random_matrix(50, 6, 11).cast<float>();
  HeadRank r = head_rank(parse_variant("softmax"), q, k, vals, nullptr, 0.4, {});
  EXPECT_TRUE(r.k.full_column_rank);
  EXPECT_TRUE(r.k1.full_column_rank);
  EXPECT_EQ(r.k1.rank, 7);
  // Keys on the hyperplane k . e_0 = 1: K keeps rank d, [K, 1] has two equal columns.
  k.col(0).setOnes();
  r = head_rank(parse_variant("softmax"), q, k, vals, nullptr, 0.4, {});
  EXPECT_TRUE(r.k.full_column_rank);
  EXPECT_FALSE(r.k1.full_column_rank);
  EXPECT_EQ(r.k1.rank, 6);
  EXPECT_LT(r.k1.ratio, 1e-14);
  // A repeated column: K itself loses a rank.
  k = test::random_matrix(50, 6, 9).cast<float>();
  k.col(5) = k.col(2);
  r = head_rank(parse_variant("inline"), q, k, vals, nullptr, 0.4, {});
  EXPECT_FALSE(r.k.full_column_rank);
  EXPECT_EQ(r.k.rank, 5);
  EXPECT_FALSE(r.fk.full_column_rank) << "identity features repeat the column too";
  // Fewer keys than columns: never full column rank.
  const MatF few = test::random_matrix(3, 6, 12).cast<float>();
  EXPECT_FALSE(
      head_rank(parse_variant("softmax"), few, few, few, nullptr, 0.4, {}).k.full_column_rank);
}

TEST(Rank, CollapseResidual) {
  MatF same(7, 3);
  for (int i = 0; i < 7; ++i) same.row(i) << 1.0F, -2.0F, 0.5F;
  EXPECT_NEAR(collapse_residual(same), 0.0, 1e-15);
  MatF centred = MatF::Zero(4, 2);
  centred(0, 0) = 1.0F;
  centred(1, 0) = -1.0F;  // mean row 0: the residual is the whole matrix
  EXPECT_NEAR(collapse_residual(centred), 1.0, 1e-15);
  EXPECT_TRUE(std::isnan(collapse_residual(MatF::Zero(3, 3))));
}

TEST(Rank, SpectrumRules) {
  const RankOptions numpy{};
  // numpy's tolerance: 1 * 3 * 2^-52; 1e-17 is below, 1e-10 above.
  Spectrum s = spectrum_of({1e-10, 1.0, 1e-17}, 3, 3, numpy);
  EXPECT_EQ(s.rank, 2);
  EXPECT_EQ(s.ratio, 1e-17);
  EXPECT_FALSE(s.full_column_rank);
  s = spectrum_of({1.0, 1e-10, 1e-17}, 3, 3, RankOptions{1e-9});
  EXPECT_EQ(s.rank, 1);
  s = spectrum_of({2.0, 2.0}, 5, 2, numpy);
  EXPECT_EQ(s.rank, 2);
  EXPECT_NEAR(s.erank, 2.0, 1e-15);
  EXPECT_TRUE(s.full_column_rank);
  s = spectrum_of({0.0, 0.0}, 2, 2, numpy);
  EXPECT_EQ(s.rank, 0);
  EXPECT_EQ(s.erank, 0.0);
  EXPECT_THROW((void)rank_measure(RankOptions{-1.0}, 1.0, false), UsageError);
}

}  // namespace
}  // namespace attnscope::analyses
