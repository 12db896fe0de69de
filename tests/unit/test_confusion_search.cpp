// The softmax confusion search on its own (an internal piece of the analyses library): rows hold
// one entry per KEY, so a head with more queries than keys, or fewer, must count exactly as the
// brute force over the same exact rows. count_confusion forces the two counts equal today; this
// keeps the search right if that ever changes. Both of the search's paths run: float rows (small
// magnitudes) and the exact double rows that replace them for large ones.
#include "../../analyses/src/confusion_search.hpp"

#include "attnscope/error.hpp"
#include "random_inputs.hpp"

#include "attnscope/family.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/softmax.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace attnscope::analyses {
namespace {

/// Queries in pairs (2m, 2m + 1) that differ by 1e-4 * magnitude in one coordinate: their rows are
/// within eps at small magnitudes; every other pair is far apart.
MatF paired_queries(int nq, int d, double magnitude, std::uint64_t seed) {
  MatD q = test::random_matrix(nq, d, seed);
  for (int i = 1; i < nq; i += 2) {
    q.row(i) = q.row(i - 1);
    q(i, 0) += 1e-4;
  }
  return (q * magnitude).cast<float>();
}

/// Brute force over every pair, with the exact rows the judge uses.
std::int64_t brute_force(const MatF& q, const MatF& k, double scale, const ConfusionOptions& opt) {
  const int nq = static_cast<int>(q.rows()), nk = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  MatD w(nq, nk);
  for (int i = 0; i < nq; ++i) softmax_exact_row(qd.row(i).data(), kd.data(), nk, d, scale, w.row(i).data());
  std::int64_t pairs = 0;
  for (int i = 0; i < nq; ++i) {
    for (int j = i + 1; j < nq; ++j) {
      const bool near = squared_distance(w.row(i).data(), w.row(j).data(), nk) <= opt.eps * opt.eps;
      const bool differ = squared_distance(qd.row(i).data(), qd.row(j).data(), d) > opt.query_eps * opt.query_eps;
      pairs += near && differ ? 1 : 0;
    }
  }
  return pairs;
}

std::int64_t searched(const MatF& q, const MatF& k, double scale, const ConfusionOptions& opt) {
  const int nk = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  const MatD kd = k.cast<double>();
  detail::PairJudge judge;
  detail::ScoreWorkspace ws;
  judge.reset(static_cast<int>(q.rows()), nk, q, opt, [&](int i, double* out) {
    const VecD qi = q.row(i).cast<double>().transpose();
    softmax_exact_row(qi.data(), kd.data(), nk, d, scale, out);
  });
  return detail::search_scores(*find_family("softmax").score(), q, k, scale, judge, ws).pairs;
}

TEST(ConfusionSearch, RowsHaveOneEntryPerKeyWhenQueriesAndKeysDiffer) {
  const int d = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const ConfusionOptions opt;
  for (auto [nq, nk] : {std::pair{40, 25}, {25, 40}, {64, 3}, {3, 64}, {30, 30}}) {
    for (double magnitude : {1.0, 1e30}) {
      const MatF q = paired_queries(nq, d, magnitude, 3);
      const MatF k = (test::random_matrix(nk, d, 4) * magnitude).cast<float>();
      const std::string what = "softmax Nq=" + std::to_string(nq) + " Nk=" + std::to_string(nk) +
                               " d=" + std::to_string(d) + " magnitude=" + std::to_string(magnitude) + " seed=3";
      std::vector<double> q_norm;
      double k_max = 0.0;
      EXPECT_EQ(detail::float_rows_fit(q, k, scale, q_norm, k_max), magnitude == 1.0) << what;
      const std::int64_t want = brute_force(q, k, scale, opt);
      EXPECT_EQ(searched(q, k, scale, opt), want) << what;
      if (magnitude == 1.0) {
        EXPECT_GE(want, nq / 2) << what << ": the planted pairs are confused";
      }
    }
  }
}

// A NaN would make the sort of row distances undefined: the search refuses it before any sort.
TEST(ConfusionSearch, NonFiniteInputNeverReachesTheSort) {
  const int d = 8;
  const ConfusionOptions opt;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    MatF q = paired_queries(20, d, 1.0, 5), k = (test::random_matrix(20, d, 6)).cast<float>();
    q(3, 1) = bad;
    EXPECT_THROW((void)searched(q, k, 0.35, opt), NumericalError) << "query " << bad;
    q(3, 1) = 0.0f;
    k(5, 2) = bad;
    EXPECT_THROW((void)searched(q, k, 0.35, opt), NumericalError) << "key " << bad;
  }
}

// The search's judge computes its exact rows with softmax_exact_row_t (keys transposed, sums
// advancing across keys); every count is defined by softmax_exact_row. The two must give the same
// bits on every size (vector tails), magnitude (underflow, overflow to inf and NaN) and sign.
TEST(ConfusionSearch, TransposedExactRowsAreTheSameBits) {
  auto same_bits = [](const double* a, const double* b, int n) {
    return std::memcmp(a, b, sizeof(double) * static_cast<std::size_t>(n)) == 0;
  };
  int differing_orders = 0, cases = 0;
  for (int n : {1, 2, 3, 5, 8, 9, 16, 17, 31, 197}) {
    for (int d : {1, 3, 8, 64}) {
      for (double magnitude : {1e-30, 1e-3, 1.0, 7.0, 1e3, 1e19, 1e30}) {
        const std::uint64_t seed = static_cast<std::uint64_t>(n * 131 + d);
        const MatF qf = (test::random_matrix(3, d, seed) * magnitude).cast<float>();
        MatF kf = (test::random_matrix(n, d, seed + 1) * magnitude).cast<float>();
        if (n > 2) kf.row(1).setZero();  // a key of logit 0; -0 entries below
        if (n > 4) kf.row(3) = -kf.row(3).cwiseAbs() * 0.0f;
        const MatD kd = kf.cast<double>();
        MatD kt;
        transpose_keys(kf, kt);
        ASSERT_EQ(kt.rows(), d);
        ASSERT_EQ(kt.cols(), n);
        for (double scale : {0.125, -1.0 / std::sqrt(static_cast<double>(d))}) {
          for (int i = 0; i < qf.rows(); ++i) {
            const VecD qi = qf.row(i).cast<double>().transpose();
            VecD want(n), got(n), reversed(n);
            softmax_exact_row(qi.data(), kd.data(), n, d, scale, want.data());
            softmax_exact_row_t(qi.data(), kt.data(), n, d, scale, got.data());
            EXPECT_TRUE(same_bits(want.data(), got.data(), n))
                << "n=" << n << " d=" << d << " magnitude=" << magnitude << " scale=" << scale
                << " query " << i;
            // Negative control: the same row with each logit summed over t in decreasing order.
            // Where that moves a bit, the comparison above would have seen an order changed.
            MatD k_rev = kd.rowwise().reverse();
            const VecD q_rev = qi.reverse();
            softmax_exact_row(q_rev.data(), k_rev.data(), n, d, scale, reversed.data());
            differing_orders += same_bits(want.data(), reversed.data(), n) ? 0 : 1;
            ++cases;
          }
        }
      }
    }
  }
  // (d = 1 has one order only, and rows of one dominant key round alike in any order.)
  EXPECT_GT(differing_orders, cases / 20) << "the inputs should be sensitive to the order of the sums";
}


/// The search as `searched` runs it, with its workspace left for inspection.
std::int64_t searched_with(const MatF& q, const MatF& k, double scale, const ConfusionOptions& opt,
                           detail::ScoreWorkspace& ws) {
  const int nk = static_cast<int>(k.rows()), d = static_cast<int>(k.cols());
  const MatD kd = k.cast<double>();
  detail::PairJudge judge;
  judge.reset(static_cast<int>(q.rows()), nk, q, opt, [&](int i, double* out) {
    const VecD qi = q.row(i).cast<double>().transpose();
    softmax_exact_row(qi.data(), kd.data(), nk, d, scale, out);
  });
  return detail::search_scores(*find_family("softmax").score(), q, k, scale, judge, ws).pairs;
}

// With eps large enough the pivot distances are summed in float (three times faster), and the
// sweep widens every comparison of them by the float sums' rigorous slack. Pairs planted at the
// threshold, just inside it and just outside (eps the exact distance of a planted pair, and the
// double below it), at DeiT-T's shape and on short rows: the count is the brute force's every
// time, with float pivots in use; below the eps where they pay, the search sums in double.
TEST(ConfusionSearch, FloatPivotDistancesKeepThePairsAtTheThreshold) {
  int float_heads = 0, thresholds = 0;
  for (auto [n, d] : {std::pair{197, 64}, {60, 16}, {33, 7}}) {
    for (std::uint64_t seed : {11U, 12U, 13U}) {
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      MatD qd = test::random_matrix(n, d, seed);
      for (int i = 1; i < n; i += 2) {  // pairs whose rows lie about 1e-3 apart
        qd.row(i) = qd.row(i - 1);
        qd(i, static_cast<int>(seed) % d) += 0.05 * static_cast<double>(1 + i % 5);
      }
      const MatF q = qd.cast<float>();
      const MatF k = test::random_matrix(n, d, seed + 100).cast<float>();
      // The exact distance of each planted pair, as the judge decides it.
      const MatD qe = q.cast<double>(), ke = k.cast<double>();
      MatD w(n, n);
      for (int i = 0; i < n; ++i) softmax_exact_row(qe.row(i).data(), ke.data(), n, d, scale, w.row(i).data());
      std::vector<double> planted;
      for (int i = 1; i < n; i += 2) planted.push_back(std::sqrt(squared_distance(w.row(i - 1).data(), w.row(i).data(), n)));
      std::sort(planted.begin(), planted.end());
      const double at = planted[planted.size() / 2];
      ASSERT_GT(at, 6e-4) << "planted pairs too close for the float path";
      std::vector<std::int64_t> counts;
      for (const double eps : {std::nextafter(at, 1.0), at, std::nextafter(at, 0.0), at * 2.0}) {
        ConfusionOptions opt;
        opt.eps = eps;
        detail::ScoreWorkspace ws;
        const std::string what = "N=" + std::to_string(n) + " d=" + std::to_string(d) + " seed=" +
                                 std::to_string(seed) + " eps=" + std::to_string(eps);
        const std::int64_t want = brute_force(q, k, scale, opt);
        counts.push_back(want);
        EXPECT_EQ(searched_with(q, k, scale, opt, ws), want) << what;
        EXPECT_TRUE(ws.float_pivots) << what << ": the float pivot distances are the path under test";
        float_heads += ws.float_pivots ? 1 : 0;
        ++thresholds;
      }
      EXPECT_GT(counts[0], counts[2]) << "the planted pair at the threshold is in just above it and out just below";
      ConfusionOptions tight;
      tight.eps = 1e-5;
      detail::ScoreWorkspace ws;
      EXPECT_EQ(searched_with(q, k, scale, tight, ws), brute_force(q, k, scale, tight));
      EXPECT_FALSE(ws.float_pivots) << "eps 1e-5: the float sums' slack would be a tenth of the window";
    }
  }
  EXPECT_EQ(float_heads, thresholds);
}

// The bound the slack rests on: each float-summed pivot distance is within kappa d + the underflow
// term of the double-summed distance of the same float rows (half the slack, which covers two
// rows), on rows of probabilities, of tiny and of huge entries. Negative control: the float sums
// do differ from the double ones, so the slack is needed.
TEST(ConfusionSearch, FloatPivotDistancesAreWithinTheirSlack) {
  int differ = 0;
  for (const Eigen::Index n : {5, 16, 17, 197, 1000}) {
    for (const double magnitude : {1.0 / static_cast<double>(n), 1e-20, 1e-3, 1.0, 1e15}) {
      const MatF x = (test::random_matrix(9, n, static_cast<std::uint64_t>(n)).cwiseAbs() * magnitude).cast<float>();
      std::vector<float> fsum(9);
      std::vector<double> dsum(9);
      portable::distances2_float(x.data(), n, 9, x.row(4).data(), n, fsum.data());
      portable::distances2(x.data(), n, 9, x.row(4).data(), n, dsum.data());
      double farthest = 0.0;
      for (int r = 0; r < 9; ++r) farthest = std::max(farthest, std::sqrt(static_cast<double>(fsum[static_cast<std::size_t>(r)])));
      const double slack = detail::float_pivot_slack(n, farthest);
      for (int r = 0; r < 9; ++r) {
        const double got = std::sqrt(static_cast<double>(fsum[static_cast<std::size_t>(r)]));
        const double want = std::sqrt(dsum[static_cast<std::size_t>(r)]);
        EXPECT_LE(std::abs(got - want), slack / 2.0) << "n=" << n << " magnitude=" << magnitude << " row " << r;
        differ += got != want ? 1 : 0;
      }
    }
  }
  EXPECT_GT(differ, 0) << "no float sum differed from the double one";
}

}  // namespace
}  // namespace attnscope::analyses
