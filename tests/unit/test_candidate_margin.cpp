// The GPU confusion count's host side, run on the CPU in every build: the margins of
// candidate_margin.hpp, the candidate bookkeeping, and the whole filter emulated on the host
// (rows computed as the kernels compute them, in another order; candidates from the Gram matrix;
// exact judging) giving the CPU's exact counts on every case the GPU tests use.
#include "attnscope/analyses/confusion_cuda.hpp"
#include "attnscope/candidate_margin.hpp"
#include "attnscope/error.hpp"
#include "gpu_cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace attnscope {
namespace {

using margin::CandidatePair;

TEST(CandidateMargin, RowBoundsAreTinyAtModelSizesAndGrowWithMagnitude) {
  // DeiT-T: N = 197, d = 64, logits of a few tens.
  const double deit = margin::row_bound_softmax(30.0, 197, 64);
  EXPECT_GT(deit, 0.0);
  EXPECT_LT(deit, 1e-11) << "softmax bound at N=197 d=64 L=30";
  EXPECT_LT(margin::row_bound_softmax(30.0, 3136, 64), 1e-10) << "softmax bound at N=3136";
  EXPECT_LT(deit, margin::row_bound_softmax(300.0, 197, 64));
  EXPECT_FALSE(std::isfinite(margin::row_bound_softmax(1e30, 197, 64))) << "huge logits: every pair is judged";
  EXPECT_EQ(margin::row_bound_kernel(0.0, 0.0, 1.0, 1.0, 197, 16), 0.0);
  EXPECT_LT(margin::row_bound_kernel(0.1, 1.0 / 197, 3.0, 40.0, 197, 16), 1e-12);
  EXPECT_LT(margin::row_bound_kernel(0.1, 0.0, 3.0, 40.0, 197, 16),
            margin::row_bound_kernel(0.1, 0.01, 3.0, 40.0, 197, 16));
}

TEST(CandidateMargin, ThresholdCoversItsReachAndStaysClose) {
  const double eps = 1e-3;
  const int n = 197;
  const double t = margin::pair_threshold(eps, 0.1, 0.1, 0.0, 0.0, n);
  EXPECT_GE(t, eps * eps);
  EXPECT_LT(t, eps * eps * (1.0 + 1e-6)) << "the filter must stay a filter at DeiT-T's size";
  // A pair whose GPU rows lie eps + R_i + R_j apart (the most an accepted pair can) is proposed
  // with the bounds and may be missed without them.
  const double r = 1e-7, reach = eps + 2.0 * r;
  const double n_i = 0.1, n_j = 0.1, g = (n_i + n_j - reach * reach) / 2.0;
  EXPECT_TRUE(margin::is_candidate(eps, n_i, n_j, g, r, r, n));
  EXPECT_FALSE(margin::is_candidate(eps, n_i, n_j, g, 0.0, 0.0, n)) << "negative control: no margin";
  // NaN and infinities propose the pair rather than drop it.
  EXPECT_TRUE(margin::is_candidate(eps, std::nan(""), 0.1, 0.0, 0.0, 0.0, n));
  EXPECT_TRUE(margin::is_candidate(eps, 0.3, 0.1, 0.0, HUGE_VAL, 0.0, n));
  EXPECT_FALSE(margin::is_candidate(eps, 0.3, 0.1, 0.0, 0.0, 0.0, n));
}

TEST(CandidateMargin, SplitByHeadGroupsAndSorts) {
  const std::vector<CandidatePair> flat{{1, 4, 9}, {0, 2, 3}, {1, 0, 5}, {0, 0, 1}, {1, 0, 2}};
  const auto heads = margin::split_by_head(flat, 3);
  ASSERT_EQ(heads.size(), 3U);
  EXPECT_EQ(heads[0], (std::vector<std::pair<int, int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(heads[1], (std::vector<std::pair<int, int>>{{0, 2}, {0, 5}, {4, 9}}));
  EXPECT_TRUE(heads[2].empty());
  EXPECT_THROW((void)margin::split_by_head({{3, 0, 1}}, 3), std::out_of_range);
  EXPECT_THROW((void)margin::split_by_head({{-1, 0, 1}}, 3), std::out_of_range);
}

TEST(CandidateMargin, RetryCapacityAndHeadsPerLaunch) {
  EXPECT_EQ(margin::retry_capacity(100, 128), 128);
  EXPECT_EQ(margin::retry_capacity(129, 128), 256);
  EXPECT_EQ(margin::retry_capacity(1000000, 65536), 1048576);
  EXPECT_EQ(margin::retry_capacity(0, 0), 1);
  EXPECT_EQ(margin::heads_per_launch(36, 1000, 10000), 10);
  EXPECT_EQ(margin::heads_per_launch(36, 1000, 1000000), 36);
  EXPECT_EQ(margin::heads_per_launch(36, 1000, 10), 1) << "at least one head per launch";
  EXPECT_EQ(margin::heads_per_launch(0, 1000, 10), 1);
}

TEST(CandidateMargin, EpsAtIsTheThreshold) {
  for (double d2 : {1e-6, 2.5e-7, 1.0 / 3.0, 1e-300}) {
    const double e = test::eps_at(d2);
    EXPECT_GE(e * e, d2);
    const double below = std::nextafter(e, 0.0);
    EXPECT_LT(below * below, d2);
  }
}

/// The host emulation: the GPU model's rows, candidate_row_bounds, the Gram filter, the judge.
analyses::HeadConfusion emulate(const test::HeadCase& c, std::int64_t* proposed = nullptr,
                                const analyses::ExcludedTokens* excluded = nullptr) {
  const analyses::ExactRows rows(c.variant, c.q, c.k, c.scale);
  const std::vector<double> bound = analyses::candidate_row_bounds(rows, c.q, c.k, c.scale);
  const MatD w = test::gpu_model_rows(rows, c.q, c.k, c.scale);
  // The model's rows are within the bounds of the exact ones (the premise of the filter).
  for (int i = 0; i < rows.tokens(); ++i) {
    const VecD exact = rows.row(i);
    const double err = (w.row(i).transpose() - exact).norm();
    EXPECT_FALSE(err > bound[static_cast<std::size_t>(i)]) << c.label << " row " << i << " off by " << err
                                                           << " > bound " << bound[static_cast<std::size_t>(i)];
  }
  analyses::ConfusionOptions opt;
  opt.eps = c.eps;
  const auto pairs = analyses::candidate_pairs_host(w, bound, rows, c.eps);
  if (proposed) *proposed = static_cast<std::int64_t>(pairs.size());
  return analyses::judge_candidates(rows, c.q, opt, pairs, excluded);
}

TEST(CandidateMargin, HostEmulationGivesTheExactCountsOnEveryCase) {
  int judged = 0, refused = 0, huge_softmax = 0;
  std::int64_t planted_at_threshold = 0;
  for (const test::HeadCase& c : test::gpu_cases()) {
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    analyses::HeadConfusion ref;
    try {
      ref = analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt);
    } catch (const NumericalError&) {
      EXPECT_THROW((void)emulate(c), NumericalError) << c.label;
      ++refused;
      continue;
    }
    std::int64_t proposed = 0;
    const analyses::HeadConfusion got = emulate(c, &proposed);
    const analyses::HeadConfusion fast = analyses::count_confusion(c.variant, c.q, c.q, c.k, c.scale, opt);
    EXPECT_EQ(got.pairs, ref.pairs) << c.label << " (" << proposed << " proposed)";
    EXPECT_EQ(got.pairs, fast.pairs) << c.label;
    EXPECT_EQ(got.degenerate_rows, ref.degenerate_rows) << c.label;
    EXPECT_EQ(got.degenerate_pairs, ref.degenerate_pairs) << c.label;
    EXPECT_GE(proposed, got.pairs) << c.label;
    if (c.label.rfind("huge magnitudes", 0) == 0 && !c.variant.linear_time_outputs()) {
      const std::int64_t n = c.q.rows();
      EXPECT_EQ(proposed, n * (n - 1) / 2) << c.label << ": infinite bounds send every pair to the judge";
      ++huge_softmax;
    }
    if (c.label.rfind("planted", 0) == 0 && c.q.rows() >= 2 && ref.pairs > 0) ++planted_at_threshold;
    ++judged;
  }
  EXPECT_GT(judged, 100) << "cases judged";
  EXPECT_EQ(huge_softmax, 1) << "the huge head of the score form (softmax)";
  EXPECT_EQ(refused, 0) << "no case is out of double's range for its family (ExactRows's limits)";
  EXPECT_GT(planted_at_threshold, 50) << "cases with a confused pair at the threshold";
}

// The GPU path's host code under a token filter: the candidates the filter proposes (excluded
// tokens among them) are judged with the image's excluded tokens, and the counts are the exact
// ones of the same filter, the degenerate pairs included.
TEST(CandidateMargin, HostEmulationHonoursExcludedTokens) {
  int compared = 0;
  std::int64_t removed = 0;
  for (const test::HeadCase& c : test::gpu_cases()) {
    const int n = static_cast<int>(c.q.rows());
    analyses::ExcludedTokens excluded(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) excluded[static_cast<std::size_t>(i)] = i % 3 == 1 ? 1 : 0;
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    analyses::HeadConfusion ref, whole;
    try {
      ref = analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt, &excluded);
      whole = analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt);
    } catch (const NumericalError&) {
      continue;
    }
    const analyses::HeadConfusion got = emulate(c, nullptr, &excluded);
    EXPECT_EQ(got.pairs, ref.pairs) << c.label << " every third token excluded";
    EXPECT_EQ(got.degenerate_rows, ref.degenerate_rows) << c.label << " every third token excluded";
    EXPECT_EQ(got.degenerate_pairs, ref.degenerate_pairs)
        << c.label << " every third token excluded";
    removed += whole.pairs + whole.degenerate_pairs - ref.pairs - ref.degenerate_pairs;
    ++compared;
  }
  EXPECT_GT(compared, 100) << "cases judged";
  EXPECT_GT(removed, 0) << "pairs the filter took away";
}

TEST(CandidateMargin, ThresholdPairIsConfusedAndOneUlpLessEpsIsNot) {
  // The planted pair 0 sits exactly on eps: the exact count includes it, and shrinking eps by one
  // ulp drops exactly that pair; the emulated filter follows both.
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala"}) {
    test::HeadCase c = test::planted_case(spec, 50, 7, 91);
    const std::int64_t at = emulate(c).pairs;
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    EXPECT_EQ(at, analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt).pairs) << c.label;
    c.eps = std::nextafter(c.eps, 0.0);
    opt.eps = c.eps;
    const std::int64_t below = emulate(c).pairs;
    EXPECT_EQ(below, analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt).pairs) << c.label;
    EXPECT_EQ(at - below, 1) << c.label << ": the pair on the threshold";
  }
}

}  // namespace
}  // namespace attnscope
