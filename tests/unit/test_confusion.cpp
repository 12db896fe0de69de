// Confusion: the fast search against the brute force on awkward sizes, planted collisions at
// distances just below and just above eps, degenerate heads, and the exact rows against the
// library's plain-loop reference.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/error.hpp"
#include "attnscope/query_transform.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace attnscope::analyses {
namespace {

const char* const kVariants[] = {"softmax",      "linear:relu", "linear:elu1",  "inline",
                                 "inline@code",  "inline:relu", "mala",         "mala@code",
                                 "linear:relu_affine=3"};

MatF normal(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double mean = 0.0) {
  return test::random_matrix(rows, cols, seed, mean).cast<float>();
}

std::string config(const Variant& v, Eigen::Index n, Eigen::Index d, std::uint64_t seed) {
  std::ostringstream os;
  os << "variant=" << v.name() << " N=" << n << " d=" << d << " seed=" << seed;
  return os.str();
}

double row_distance(const Variant& v, const MatF& q, const MatF& k, double scale, int i, int j) {
  const ExactRows rows(v, q, k, scale);
  const VecD a = rows.row(i), b = rows.row(j);
  return std::sqrt(squared_distance(a.data(), b.data(), rows.tokens()));
}

/// Replaces query j by q_i + t dir with t chosen by bisection so that the exact row distance of
/// (i, j) lands just below eps (below = true) or just above it. Returns the distance reached.
double plant(const Variant& v, MatF& q, const MatF& k, double scale, int i, int j, double eps,
             bool below, std::uint64_t seed) {
  const MatF dir = normal(1, q.cols(), seed);
  auto set = [&](double t) {
    q.row(j) = (q.row(i).cast<double>() + t * dir.cast<double>()).cast<float>();
    return row_distance(v, q, k, scale, i, j);
  };
  double lo = 0.0, hi = 1e-3;
  while (set(hi) <= eps && hi < 1e6) hi *= 2.0;
  for (int it = 0; it < 80; ++it) {
    const double mid = 0.5 * (lo + hi);
    (set(mid) <= eps ? lo : hi) = mid;
  }
  return set(below ? lo : hi);
}

void expect_same_count(const Variant& v, const MatF& q, const MatF& q_raw, const MatF& k,
                       double scale, const std::string& what, std::int64_t at_least = 0) {
  const ConfusionOptions opt;
  const HeadConfusion fast = count_confusion(v, q, q_raw, k, scale, opt);
  const HeadConfusion ref = count_confusion_reference(v, q, q_raw, k, scale, opt);
  EXPECT_EQ(fast.pairs, ref.pairs) << what << " (fast looked at " << fast.candidates << " pairs)";
  EXPECT_EQ(fast.degenerate_rows, ref.degenerate_rows) << what;
  EXPECT_EQ(fast.degenerate_pairs, ref.degenerate_pairs) << what;
  EXPECT_GE(ref.pairs, at_least) << what;
}

TEST(ExactRows, MatchesLibraryReference) {
  for (const std::string& spec : test::all_variant_specs()) {
    for (auto [n, d] : {std::pair{1, 1}, {2, 7}, {50, 7}, {197, 64}}) {
      const std::uint64_t seed = 11;
      const Variant v = parse_variant(spec, Convention::Paper, seed);
      const double mean = test::input_mean(v);
      const MatF q = normal(n, d, seed, mean), k = normal(n, d, seed + 1, mean);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const ExactRows rows(v, q, k, scale);
      MatD got(n, n);
      for (int i = 0; i < n; ++i) rows.row(i, got.row(i).data());
      std::vector<int> degenerate;
      const MatD want = reference::weights(v, q.cast<double>(), k.cast<double>(), scale, nullptr, &degenerate);
      EXPECT_TRUE(test::matrices_near(got, want, test::kDoubleTol, config(v, n, d, seed)));
      EXPECT_EQ(rows.degenerate_count(), static_cast<int>(degenerate.size())) << config(v, n, d, seed);
    }
  }
}

TEST(Confusion, FastEqualsBruteForceOnRandomHeads) {
  for (const std::string& spec : test::all_variant_specs()) {
    for (auto [n, d] : {std::pair{1, 1}, {2, 1}, {50, 1}, {197, 1}, {50, 7}, {197, 7}, {197, 64}}) {
      for (std::uint64_t seed : {1u, 2u}) {
        const Variant v = parse_variant(spec, Convention::Paper, seed);
        const double mean = test::input_mean(v);
        const MatF q = normal(n, d, seed * 7, mean), k = normal(n, d, seed * 7 + 1, mean);
        expect_same_count(v, q, q, k, 1.0 / std::sqrt(static_cast<double>(d)), config(v, n, d, seed));
      }
    }
  }
}

// Rows that do not sum to 1 (relu@code with keys so small that the ReLU products sum to ~1e-15:
// each row sums to S_i/(S_i + 1e-15)) are searched as they are, with each row's own constant: the
// fast count equals the brute force, planted pairs just below and above eps included. Queries
// keep an ordinary size (raw queries within 1e-6 of each other would be one query, not confusion).
TEST(Confusion, RowsNotSummingToOneCountExactly) {
  const Variant v = parse_variant("relu@code");
  ASSERT_FALSE(v.rows_sum_to_one());
  for (auto [n, d] : {std::pair{2, 1}, {50, 7}, {197, 64}}) {
    const std::uint64_t seed = 5;
    MatF q = test::random_matrix(n, d, seed).cast<float>();
    const MatF k = (5e-15 / (n * d) * test::random_matrix(n, d, seed + 1)).cast<float>();
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const ExactRows rows(v, q, k, scale);
    double smallest = 2.0;
    for (int i = 0; i < n; ++i) {
      if (!rows.degenerate(i)) smallest = std::min(smallest, rows.row(i).sum());
    }
    EXPECT_LT(smallest, 0.99) << config(v, n, d, seed) << ": control, some row must sum below 1";
    expect_same_count(v, q, q, k, scale, config(v, n, d, seed));
    if (n < 50) continue;
    const double eps = ConfusionOptions{}.eps;
    q.row(3) = q.row(2).cwiseAbs();  // live queries (ReLU keeps them)
    plant(v, q, k, scale, 3, 7, eps, true, seed + 2);
    plant(v, q, k, scale, 3, 9, eps, false, seed + 3);
    expect_same_count(v, q, q, k, scale, config(v, n, d, seed) + " planted", 1);
  }
}

// Each thread keeps its search buffers from head to head: heads that grow and shrink, met in
// different orders on several threads at once, must each still count exactly as the brute force.
TEST(Confusion, ReusedBuffersAcrossHeadSizesAndThreads) {
  struct Head {
    std::string spec;
    int n, d;
    std::uint64_t seed;
  };
  std::vector<Head> heads;
  for (const char* spec : {"softmax", "linear:relu", "inline"}) {
    for (auto [n, d] : {std::pair{197, 64}, {2, 7}, {50, 1}, {1, 1}, {197, 7}, {50, 64}}) {
      heads.push_back({spec, n, d, static_cast<std::uint64_t>(n * 100 + d)});
    }
  }
  const ConfusionOptions opt;
  auto count = [&](const Head& h, bool reference) {
    const Variant v = parse_variant(h.spec, Convention::Paper, h.seed);
    const double mean = test::input_mean(v);
    // Every second query a near copy of its predecessor: many rows reach the exact judge.
    MatF q = normal(h.n, h.d, h.seed, mean);
    for (int i = 1; i < h.n; i += 2) q.row(i) = q.row(i - 1) * 1.0001F;
    const MatF k = normal(h.n, h.d, h.seed + 1, mean);
    const double scale = 1.0 / std::sqrt(static_cast<double>(h.d));
    return reference ? count_confusion_reference(v, q, q, k, scale, opt).pairs
                     : count_confusion(v, q, q, k, scale, opt).pairs;
  };
  std::vector<std::int64_t> want;
  std::int64_t confused = 0;
  for (const Head& h : heads) confused += want.emplace_back(count(h, true));
  ASSERT_GT(confused, static_cast<std::int64_t>(heads.size()))
      << "the near copies should give confused pairs to check";
  constexpr int kThreads = 3;
  std::vector<std::vector<std::int64_t>> got(kThreads, std::vector<std::int64_t>(heads.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Thread t walks the heads starting at a different place, so sizes alternate differently.
      for (std::size_t s = 0; s < heads.size(); ++s) {
        const std::size_t h = (s * 5 + static_cast<std::size_t>(t) * 7) % heads.size();
        got[static_cast<std::size_t>(t)][h] = count(heads[h], false);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    for (std::size_t h = 0; h < heads.size(); ++h) {
      const Head& c = heads[h];
      const Variant v = parse_variant(c.spec, Convention::Paper, c.seed);
      EXPECT_EQ(got[static_cast<std::size_t>(t)][h], want[h])
          << config(v, c.n, c.d, c.seed) << " thread " << t << " near-copy queries";
    }
  }
}

TEST(Confusion, PlantedPairsJustBelowAndAboveEps) {
  const double eps = ConfusionOptions{}.eps;
  for (const char* spec : kVariants) {
    for (auto [n, d] : {std::pair{50, 7}, {197, 64}}) {
      const std::uint64_t seed = 5;
      const Variant v = parse_variant(spec, Convention::Paper, seed);
      MatF q = normal(n, d, seed), k = normal(n, d, seed + 1);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      int below = 0;
      for (int p = 0; p < 6; ++p) {
        const bool want_below = p % 2 == 0;
        const double got = plant(v, q, k, scale, 2 * p, 2 * p + 1, eps, want_below, seed + 100 + p);
        ASSERT_EQ(got <= eps, want_below) << config(v, n, d, seed) << " planting pair " << p << " reached " << got;
        ASSERT_NEAR(got, eps, eps * 1e-3) << config(v, n, d, seed) << " planting pair " << p;
        below += want_below ? 1 : 0;
      }
      expect_same_count(v, q, q, k, scale, config(v, n, d, seed) + " planted", below);
    }
  }
}

TEST(Confusion, IdenticalKeysConfuseEveryPairOfDistinctQueries) {
  for (const char* spec : kVariants) {
    const int n = 50, d = 7;
    const Variant v = parse_variant(spec, Convention::Paper, 3);
    const MatF q = normal(n, d, 3);
    const MatF k = normal(1, d, 4).replicate(n, 1);
    const HeadConfusion got = count_confusion(v, q, q, k, 0.4, ConfusionOptions{});
    const std::int64_t live = n - got.degenerate_rows;
    EXPECT_EQ(got.pairs, live * (live - 1) / 2) << config(v, n, d, 3) << " identical keys";
    expect_same_count(v, q, q, k, 0.4, config(v, n, d, 3) + " identical keys");
  }
}

TEST(Confusion, SingleTokenAndRankDeficientKeys) {
  for (const char* spec : kVariants) {
    const Variant v = parse_variant(spec, Convention::Paper, 9);
    const MatF q1 = normal(1, 7, 9), k1 = normal(1, 7, 10);
    const HeadConfusion one = count_confusion(v, q1, q1, k1, 0.3, ConfusionOptions{});
    EXPECT_EQ(one.pairs, 0) << config(v, 1, 7, 9);
    const MatF q = normal(197, 7, 9), k = normal(197, 2, 10) * normal(2, 7, 11);  // rank 2
    expect_same_count(v, q, q, k, 0.3, config(v, 197, 7, 9) + " rank-2 keys");
  }
}

TEST(Confusion, SameRawQueryIsNotConfusionButScaledCopyIsForLinear) {
  const int n = 60, d = 7;
  MatF q = normal(n, d, 21);
  const MatF k = normal(n, d, 22);
  for (int p = 0; p < 5; ++p) q.row(2 * p + 1) = q.row(2 * p);        // duplicates
  for (int p = 5; p < 9; ++p) q.row(2 * p + 1) = 2.5f * q.row(2 * p);  // scaled copies
  const Variant soft = parse_variant("softmax"), lin = parse_variant("linear:relu");
  expect_same_count(soft, q, q, k, 0.3, config(soft, n, d, 21) + " duplicates");
  const HeadConfusion s = count_confusion(soft, q, q, k, 0.3, ConfusionOptions{});
  EXPECT_EQ(s.pairs, 0) << config(soft, n, d, 21) << ": duplicates are the same query";
  // linear attention is invariant to the query's scale (when relu keeps the same entries): the
  // four scaled copies give identical rows.
  const HeadConfusion l = count_confusion(lin, q, q, k, 0.3, ConfusionOptions{});
  EXPECT_GE(l.pairs, 4) << config(lin, n, d, 21) << " scaled copies";
  expect_same_count(lin, q, q, k, 0.3, config(lin, n, d, 21) + " scaled copies", 4);
}

TEST(Confusion, ReluKilledQueriesAreDegenerateAndExcluded) {
  const int n = 50, d = 7;
  MatF q = normal(n, d, 31);
  const MatF k = normal(n, d, 32).cwiseAbs();
  for (int i = 0; i < 6; ++i) q.row(i) = -q.row(i).cwiseAbs();  // relu(q) = 0
  int killed = 0;  // the planted rows and any random row without a positive entry
  for (int i = 0; i < n; ++i) killed += q.row(i).maxCoeff() <= 0.0f ? 1 : 0;
  const Variant v = parse_variant("linear:relu");
  const HeadConfusion got = count_confusion(v, q, q, k, 0.3, ConfusionOptions{});
  EXPECT_EQ(got.degenerate_rows, killed) << config(v, n, d, 31);
  expect_same_count(v, q, q, k, 0.3, config(v, n, d, 31) + " killed queries");
}

/// A head of n queries whose first `killed` queries ReLU zeroes (every entry negative) and whose
/// other queries and all keys have a positive first entry, so that exactly those rows are
/// degenerate for a ReLU kernel. Among the killed ones: query 1 = query 0 and query 3 = query 2
/// (the same raw query), query 5 = query 4 moved by 2e-6 in one entry (raw distance 2e-6).
struct KilledHead {
  MatF q, k;
  static constexpr int kKilled = 6;
  KilledHead(int n, int d, std::uint64_t seed) : q(normal(n, d, seed)), k(normal(n, d, seed + 1)) {
    for (int i = 0; i < n; ++i) {
      if (i < kKilled) {
        q.row(i) = -q.row(i).cwiseAbs() - MatF::Constant(1, d, 0.25f);
      } else {
        q(i, 0) = std::abs(q(i, 0)) + 0.5f;
      }
      k(i, 0) = std::abs(k(i, 0)) + 0.5f;
    }
    q.row(1) = q.row(0);
    q.row(3) = q.row(2);
    q.row(5) = q.row(4);
    q(5, d - 1) -= 2e-6f;
  }
};

TEST(Confusion, DegeneratePairsCountedByHand) {
  for (auto [n, d] : {std::pair{50, 7}, {197, 64}}) {
    const KilledHead h(n, d, 51);
    for (const char* spec : {"linear:relu", "linear:relu@code"}) {
      const Variant v = parse_variant(spec);
      const std::string what = config(v, n, d, 51) + " 6 killed queries";
      // 6 degenerate rows, 15 pairs; (0, 1) and (2, 3) are the same raw query: 13.
      ConfusionOptions opt;
      HeadConfusion fast = count_confusion(v, h.q, h.q, h.k, 0.3, opt);
      HeadConfusion ref = count_confusion_reference(v, h.q, h.q, h.k, 0.3, opt);
      EXPECT_EQ(fast.degenerate_rows, KilledHead::kKilled) << what;
      EXPECT_EQ(fast.degenerate_pairs, 13) << what;
      EXPECT_EQ(ref.degenerate_pairs, 13) << what;
      EXPECT_EQ(fast.pairs, ref.pairs) << what;
      // A query radius of 3e-6 makes (4, 5) the same query too: 12.
      opt.query_eps = 3e-6;
      fast = count_confusion(v, h.q, h.q, h.k, 0.3, opt);
      ref = count_confusion_reference(v, h.q, h.q, h.k, 0.3, opt);
      EXPECT_EQ(fast.degenerate_pairs, 12) << what << " query_eps 3e-6";
      EXPECT_EQ(ref.degenerate_pairs, 12) << what << " query_eps 3e-6";
      // The degenerate pairs do not depend on the row radius: zero rows are within any eps.
      opt = ConfusionOptions{};
      opt.eps = 0.0;
      fast = count_confusion(v, h.q, h.q, h.k, 0.3, opt);
      ref = count_confusion_reference(v, h.q, h.q, h.k, 0.3, opt);
      EXPECT_EQ(fast.degenerate_pairs, 13) << what << " eps 0";
      EXPECT_EQ(ref.degenerate_pairs, 13) << what << " eps 0";
    }
  }
}

// Negative control: families whose rows are never degenerate here (softmax has no denominator to
// vanish, InLine none at all) have no degenerate pair on the very head that gives linear 13.
TEST(Confusion, DegeneratePairsNeverForSoftmaxOrInline) {
  const int n = 50, d = 7;
  const KilledHead h(n, d, 51);
  for (const char* spec : {"softmax", "softmax@code", "inline", "inline@code"}) {
    const Variant v = parse_variant(spec);
    const std::string what = config(v, n, d, 51) + " 6 killed queries";
    const HeadConfusion fast = count_confusion(v, h.q, h.q, h.k, 0.3, ConfusionOptions{});
    EXPECT_EQ(fast.degenerate_rows, 0) << what;
    EXPECT_EQ(fast.degenerate_pairs, 0) << what;
    expect_same_count(v, h.q, h.q, h.k, 0.3, what);
  }
  const Variant lin = parse_variant("linear:relu");
  EXPECT_EQ(count_confusion(lin, h.q, h.q, h.k, 0.3, ConfusionOptions{}).degenerate_pairs, 13)
      << "the control's head must have degenerate pairs for linear attention";
}

// Many degenerate rows with many repeated raw queries (every query appears three times): the
// windowed count of the fast path against the brute force, at several query radii.
TEST(Confusion, DegeneratePairsWithRepeatedQueriesEqualBruteForce) {
  for (auto [n, d] : {std::pair{197, 1}, {197, 3}, {60, 2}}) {
    MatF q = normal(n, d, 61);
    const MatF k = normal(n, d, 62).cwiseAbs();
    for (int i = 2; i < n; i += 3) q.row(i) = q.row(i - 2), q.row(i - 1) = q.row(i - 2);
    const Variant v = parse_variant("linear:relu");
    for (double query_eps : {0.0, 1e-6, 0.05, 0.5}) {
      ConfusionOptions opt;
      opt.query_eps = query_eps;
      const HeadConfusion fast = count_confusion(v, q, q, k, 0.3, opt);
      const HeadConfusion ref = count_confusion_reference(v, q, q, k, 0.3, opt);
      const std::string what = config(v, n, d, 61) + " query_eps " + std::to_string(query_eps);
      EXPECT_GT(fast.degenerate_rows, 3) << what;
      EXPECT_EQ(fast.degenerate_pairs, ref.degenerate_pairs) << what;
      EXPECT_EQ(fast.pairs, ref.pairs) << what;
    }
  }
}

TEST(Confusion, F1TransformInducesConfusionDecidedOnRawQueries) {
  const int n = 80, d = 7;
  MatF raw = normal(n, d, 41);
  const MatF k = normal(n, d, 42);
  // Pairs that differ only where the query is negative: f1 maps them to the same row.
  for (int p = 0; p < 10; ++p) {
    raw.row(2 * p + 1) = raw.row(2 * p);
    for (int t = 0; t < d; ++t) {
      if (raw(2 * p, t) < 0) raw(2 * p + 1, t) = raw(2 * p, t) * 3.0f - 1.0f;
    }
  }
  const QueryTransform f1 = parse_query_transform("f1");
  const MatF q = f1.apply<float>(raw);
  const Variant v = parse_variant("softmax");
  // Independently: pairs whose transformed queries coincide while the raw ones differ.
  const std::int64_t differing = [&] {
    std::int64_t c = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = i + 1; j < n; ++j) {
        const bool same_q = (q.row(i) - q.row(j)).cast<double>().norm() <= 1e-6;
        const bool same_raw = (raw.row(i) - raw.row(j)).cast<double>().norm() <= 1e-6;
        c += same_q && !same_raw ? 1 : 0;
      }
    }
    return c;
  }();
  ASSERT_GE(differing, 5) << "the planted pairs should survive f1";
  expect_same_count(v, q, raw, k, 0.3, config(v, n, d, 41) + " f1", differing);
  // Without the raw queries the same pairs look like identical queries and are not counted.
  const HeadConfusion same = count_confusion(v, q, q, k, 0.3, ConfusionOptions{});
  const HeadConfusion induced = count_confusion(v, q, raw, k, 0.3, ConfusionOptions{});
  EXPECT_EQ(induced.pairs - same.pairs, differing) << config(v, n, d, 41) << " f1";
}

/// Brute force over the pairs with at least one excluded token: how many of them count as
/// confused (both rows ordinary) and as degenerate pairs, with confusion.hpp's definitions.
HeadConfusion pairs_touching(const Variant& v, const MatF& q, const MatF& k, double scale,
                             const ExcludedTokens& excluded, const ConfusionOptions& opt) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens(), d = static_cast<int>(q.cols());
  const MatD qd = q.cast<double>();
  MatD w(n, n);
  for (int i = 0; i < n; ++i) rows.row(i, w.row(i).data());
  HeadConfusion out;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (!excluded[static_cast<std::size_t>(i)] && !excluded[static_cast<std::size_t>(j)])
        continue;
      const bool differ =
          squared_distance(qd.row(i).data(), qd.row(j).data(), d) > opt.query_eps * opt.query_eps;
      const bool near = squared_distance(w.row(i).data(), w.row(j).data(), n) <= opt.eps * opt.eps;
      if (rows.degenerate(i) && rows.degenerate(j)) out.degenerate_pairs += differ ? 1 : 0;
      if (!rows.degenerate(i) && !rows.degenerate(j)) out.pairs += differ && near ? 1 : 0;
    }
  }
  return out;
}

/// Token masks of n tokens: every third token, all but the last, all, and a fixed scatter.
std::vector<std::pair<std::string, ExcludedTokens>> exclusion_masks(int n) {
  std::vector<std::pair<std::string, ExcludedTokens>> out;
  ExcludedTokens third(static_cast<std::size_t>(n)), scatter(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    third[static_cast<std::size_t>(i)] = i % 3 == 0 ? 1 : 0;
    scatter[static_cast<std::size_t>(i)] = (i * 37 + 11) % 7 < 3 ? 1 : 0;
  }
  ExcludedTokens all_but_last(static_cast<std::size_t>(n), 1);
  all_but_last.back() = 0;
  out.emplace_back("every third token excluded", third);
  out.emplace_back("scattered tokens excluded", scatter);
  out.emplace_back("all but the last token excluded", all_but_last);
  out.emplace_back("every token excluded", ExcludedTokens(static_cast<std::size_t>(n), 1));
  return out;
}

// Excluded tokens on every family and awkward sizes: the fast search equals the brute force with
// the same filter, and the filter takes away exactly the pairs that involve an excluded token
// (counted apart by brute force), the degenerate pairs included.
TEST(ConfusionFilter, FastEqualsReferenceAndRemovesExactlyThePairsOfExcludedTokens) {
  const ConfusionOptions opt;
  std::int64_t removed = 0, left = 0;
  for (const std::string& spec : test::all_variant_specs()) {
    for (auto [n, d] : {std::pair{1, 1}, {2, 1}, {50, 1}, {63, 7}, {197, 7}, {50, 64}}) {
      const std::uint64_t seed = 3;
      const Variant v = parse_variant(spec, Convention::Paper, seed);
      const double mean = test::input_mean(v);
      // Every second query a near copy of its predecessor, and a few queries far negative
      // (degenerate rows for the kernels that divide): pairs on both sides of every mask.
      MatF q = normal(n, d, seed, mean);
      for (int i = 1; i < n; i += 2) q.row(i) = q.row(i - 1) * 1.0001F;
      for (int i = 0; i < n; i += 8) q.row(i) = -q.row(i).cwiseAbs() - MatF::Constant(1, d, 5.0f);
      const MatF k = normal(n, d, seed + 1, mean).cwiseAbs();
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const HeadConfusion whole = count_confusion_reference(v, q, q, k, scale, opt);
      for (const auto& [name, excluded] : exclusion_masks(n)) {
        const std::string what = config(v, n, d, seed) + " near copies, " + name;
        const HeadConfusion fast = count_confusion(v, q, q, k, scale, opt, &excluded);
        const HeadConfusion ref = count_confusion_reference(v, q, q, k, scale, opt, &excluded);
        EXPECT_EQ(fast.pairs, ref.pairs) << what;
        EXPECT_EQ(fast.degenerate_pairs, ref.degenerate_pairs) << what;
        EXPECT_EQ(fast.degenerate_rows, ref.degenerate_rows) << what;
        EXPECT_EQ(ref.degenerate_rows, whole.degenerate_rows)
            << what << ": degenerate rows whatever the filter";
        const HeadConfusion touching = pairs_touching(v, q, k, scale, excluded, opt);
        EXPECT_EQ(whole.pairs - ref.pairs, touching.pairs) << what;
        EXPECT_EQ(whole.degenerate_pairs - ref.degenerate_pairs, touching.degenerate_pairs) << what;
        if (excluded_count(excluded) >= n - 1) {
          EXPECT_EQ(ref.pairs + ref.degenerate_pairs, 0) << what << ": no pair of kept tokens";
        }
        removed += touching.pairs + touching.degenerate_pairs;
        left += ref.pairs + ref.degenerate_pairs;
      }
      // An empty mask is no filter.
      const ExcludedTokens none;
      EXPECT_EQ(count_confusion(v, q, q, k, scale, opt, &none).pairs, whole.pairs)
          << config(v, n, d, seed);
    }
  }
  EXPECT_GT(removed, 1000) << "pairs the masks took away";
  EXPECT_GT(left, 1000) << "pairs the masks left";
}

TEST(ConfusionFilter, DegeneratePairsOfExcludedTokensCountedByHand) {
  const KilledHead h(50, 7, 51);
  for (const char* spec : {"linear:relu", "linear:relu@code"}) {
    const Variant v = parse_variant(spec);
    // 13 degenerate pairs among the 6 killed queries ((0, 1) and (2, 3) are the same query).
    ExcludedTokens excluded(50, 0);
    excluded[0] = 1;  // takes (0, 2), (0, 3), (0, 4), (0, 5): 9 left
    const ConfusionOptions opt;
    EXPECT_EQ(count_confusion(v, h.q, h.q, h.k, 0.3, opt, &excluded).degenerate_pairs, 9) << spec;
    EXPECT_EQ(count_confusion_reference(v, h.q, h.q, h.k, 0.3, opt, &excluded).degenerate_pairs, 9)
        << spec;
    excluded[1] = 1;  // takes (1, 2) .. (1, 5): the 5 pairs of {2, 3, 4, 5} less (2, 3)
    EXPECT_EQ(count_confusion(v, h.q, h.q, h.k, 0.3, opt, &excluded).degenerate_pairs, 5) << spec;
    EXPECT_EQ(count_confusion_reference(v, h.q, h.q, h.k, 0.3, opt, &excluded).degenerate_pairs, 5)
        << spec;
    excluded[0] = excluded[1] = 0;
    excluded[49] = 1;  // an ordinary row: the degenerate pairs are untouched
    EXPECT_EQ(count_confusion(v, h.q, h.q, h.k, 0.3, opt, &excluded).degenerate_pairs, 13) << spec;
  }
}

TEST(ConfusionFilter, AMaskOfAnotherSizeIsRefused) {
  const MatF q = normal(20, 4, 1), k = normal(20, 4, 2);
  const ExcludedTokens wrong(19, 0);
  for (const char* spec : {"softmax", "linear:relu"}) {
    const Variant v = parse_variant(spec);
    EXPECT_THROW((void)count_confusion(v, q, q, k, 0.5, ConfusionOptions{}, &wrong), UsageError)
        << spec;
    EXPECT_THROW((void)count_confusion_reference(v, q, q, k, 0.5, ConfusionOptions{}, &wrong),
                 UsageError)
        << spec;
  }
}

TEST(Confusion, BinsArePowersOfTwo) {
  for (std::int64_t c = 0; c < 100; ++c) {
    int want = 0;
    if (c >= 1) want = 1 + static_cast<int>(std::floor(std::log2(static_cast<double>(c))));
    want = std::min(want, kConfusionBins - 1);
    EXPECT_EQ(confusion_bin(c), want) << "count " << c;
  }
  EXPECT_EQ(confusion_bin_labels()[2], "2-3");
  EXPECT_EQ(confusion_bin_labels()[6], ">=32");
}

}  // namespace
}  // namespace attnscope::analyses
