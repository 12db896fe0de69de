// Attention entropy: the fast path (registry weights, portable::log) against the plain reference
// (ExactRows, std::log) and the registry-free reference weights, on awkward sizes and every
// family; a uniform row's entropy is log N, a one-hot row's 0 (negative controls for the 0 log 0
// rule and the eps convention); rows with negative weights take |w| renormalised and are counted.
#include "attnscope/analyses/entropy.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "float_rows_bound.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

namespace attnscope::analyses {
namespace {

/// Float to double element by element. (Eigen's q.cast<double>() as a function argument was seen
/// to give values one float ulp off under GCC 12 -O3 -march=native in a test TU: see the report.)
MatD to_double(const MatF& x) {
  MatD out(x.rows(), x.cols());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    for (Eigen::Index j = 0; j < x.cols(); ++j) out(i, j) = static_cast<double>(x(i, j));
  }
  return out;
}

/// Fast vs reference: each of the N terms |p log p| <= 1/e is computed to a few ulps, so the sum
/// is within a few ulps of N / e; relative to max(1, log N) that is below 1e-12 for N <= 197.
constexpr double kEntropyTol = test::kDoubleTol;

std::string config(const std::string& spec, int n, int d, double eps) {
  return spec + " N=" + std::to_string(n) + " d=" + std::to_string(d) +
         " eps=" + std::to_string(eps);
}

TEST(Entropy, FastMatchesReferenceOnEveryFamily) {
  for (const std::string& spec : test::all_variant_specs()) {
    for (int n : {1, 2, 63, 197}) {
      for (int d : {1, 60}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(n, d, 21, mean).cast<float>();
        const MatF k = test::random_matrix(n, d, 22, mean).cast<float>();
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const test::FloatRowsBound fb = test::float_rows_bound(v, q, k, scale);
        for (double eps : {0.0, 1e-6}) {
          // Softmax heads within the float range with eps = 0 are measured in float: the bound of
          // entropy.hpp, delta + (1 + 2 log N) r / (1 - r), beside the double path's tolerance.
          const bool in_float = fb.used && eps == 0.0;
          const double float_tol =
              in_float ? fb.delta + (1.0 + 2.0 * max_entropy(n)) * fb.r / (1.0 - fb.r) : 0.0;
          const std::string what = config(spec, n, d, eps) + (in_float ? " float" : "");
          const EntropyRows fast = attention_entropy(v, q, k, scale, {eps});
          const EntropyRows ref = attention_entropy_reference(v, q, k, scale, {eps});
          ASSERT_EQ(fast.entropy.size(), static_cast<std::size_t>(n)) << what;
          EXPECT_EQ(fast.degenerate, ref.degenerate) << what;
          EXPECT_EQ(fast.negative_rows, ref.negative_rows) << what;
          for (std::size_t i = 0; i < fast.entropy.size(); ++i) {
            ASSERT_EQ(std::isnan(fast.entropy[i]), std::isnan(ref.entropy[i]))
                << what << " row " << i;
            if (std::isnan(ref.entropy[i])) continue;
            EXPECT_NEAR(fast.entropy[i], ref.entropy[i],
                        kEntropyTol * std::max(1.0, max_entropy(n)) + float_tol)
                << what << " row " << i;
            EXPECT_NEAR(fast.negative_mass[i], ref.negative_mass[i],
                        kEntropyTol * std::max(1.0, ref.negative_mass[i]))
                << what << " row " << i;
            EXPECT_GE(fast.entropy[i], -eps - 1e-12)
                << what << " row " << i;  // -log(1 + eps) at least
            EXPECT_LE(fast.entropy[i], max_entropy(n) + 1e-12) << what << " row " << i;
          }
        }
      }
    }
  }
}

// A third implementation, written here from the registry-free reference weights.
TEST(Entropy, AgreesWithRegistryFreeWeights) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    const double mean = test::input_mean(v);
    const MatF q = test::random_matrix(50, 7, 41, mean).cast<float>();
    const MatF k = test::random_matrix(50, 7, 42, mean).cast<float>();
    std::vector<int> degenerate;
    const MatD w = reference::weights(v, to_double(q), to_double(k), 0.4, nullptr, &degenerate);
    const EntropyRows fast = attention_entropy(v, q, k, 0.4, {});
    const test::FloatRowsBound fb = test::float_rows_bound(v, q, k, 0.4);
    const double float_tol =
        fb.used ? fb.delta + (1.0 + 2.0 * std::log(50.0)) * fb.r / (1.0 - fb.r) : 0.0;
    int negative_rows = 0;
    for (int i = 0; i < 50; ++i) {
      if (std::find(degenerate.begin(), degenerate.end(), i) != degenerate.end()) {
        EXPECT_TRUE(std::isnan(fast.entropy[static_cast<std::size_t>(i)])) << spec << " row " << i;
        continue;
      }
      const bool negative = (w.row(i).array() < 0.0).any();
      negative_rows += negative ? 1 : 0;
      const Eigen::ArrayXd p =
          negative ? Eigen::ArrayXd(w.row(i).cwiseAbs().transpose() / w.row(i).cwiseAbs().sum())
                   : Eigen::ArrayXd(w.row(i).transpose());
      double want = 0.0;
      for (Eigen::Index j = 0; j < p.size(); ++j) want -= p(j) > 0 ? p(j) * std::log(p(j)) : 0.0;
      EXPECT_NEAR(fast.entropy[static_cast<std::size_t>(i)], want,
                  kEntropyTol * std::log(50.0) + float_tol)
          << spec << " row " << i;
    }
    EXPECT_EQ(fast.negative_rows, negative_rows) << spec;
  }
}

TEST(Entropy, UniformRowIsLogN) {
  // Zero queries: every softmax logit is 0, every weight exactly 1/N.
  for (int n : {1, 2, 63, 197}) {
    const MatF q = MatF::Zero(n, 5);
    const MatF k = test::random_matrix(n, 5, 3).cast<float>();
    for (const bool reference : {false, true}) {
      const EntropyRows r =
          reference ? attention_entropy_reference(parse_variant("softmax"), q, k, 1.0, {})
                    : attention_entropy(parse_variant("softmax"), q, k, 1.0, {});
      for (int i = 0; i < n; ++i) {
        EXPECT_NEAR(r.entropy[static_cast<std::size_t>(i)], std::log(static_cast<double>(n)),
                    4e-16 * n)
            << "N=" << n << " row " << i << (reference ? " reference" : " fast");
      }
    }
  }
  // Identical keys: uniform rows for every family whose weights do not depend on positions.
  for (const AttentionFamily* family : test::qk_families()) {
    if (family->position_dependent()) continue;
    const Variant v = parse_variant(example_spec(*family));
    const MatF q = test::random_matrix(63, 7, 5, 1.0).cast<float>();
    const MatF k = test::random_matrix(1, 7, 6, 1.0).cast<float>().replicate(63, 1);
    const EntropyRows r = attention_entropy(v, q, k, 0.4, {});
    EXPECT_EQ(r.negative_rows, 0) << v.name();
    for (double h : r.entropy) EXPECT_NEAR(h, std::log(63.0), 1e-9) << v.name();
  }
}

TEST(Entropy, OneHotRowIsZeroAndEpsConventionShiftsIt) {
  // Row i one-hot on key i: weight exactly 1 there, exactly 0 elsewhere (0 log 0 = 0, not NaN).
  const int n = 9;
  const MatF k = MatF::Identity(n, n);
  const MatF q = 1000.0F * MatF::Identity(n, n);
  const EntropyRows exact = attention_entropy(parse_variant("softmax"), q, k, 1.0, {0.0});
  const EntropyRows code = attention_entropy(parse_variant("softmax"), q, k, 1.0, {1e-6});
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(exact.entropy[static_cast<std::size_t>(i)], 0.0) << "row " << i;
    // -1 * log(1 + 1e-6): the code convention is not the exact entropy.
    EXPECT_NEAR(code.entropy[static_cast<std::size_t>(i)], -std::log1p(1e-6), 1e-15) << "row " << i;
  }
  // A row split evenly over two keys: log 2.
  MatF q2 = MatF::Zero(n, n);
  q2.col(0).setConstant(1000.0F);
  q2.col(3).setConstant(1000.0F);
  for (double h : attention_entropy(parse_variant("softmax"), q2, k, 1.0, {}).entropy) {
    EXPECT_NEAR(h, std::log(2.0), 1e-15);
  }
}

TEST(Entropy, NegativeRowsTakeMagnitudesAndAreCounted) {
  // InLine in the paper convention on unscaled inputs: many negative weights.
  const MatF q = test::random_matrix(50, 16, 3).cast<float>();
  const MatF k = test::random_matrix(50, 16, 4).cast<float>();
  const Variant v = parse_variant("inline@paper");
  const EntropyRows r = attention_entropy(v, q, k, 0.25, {});
  const MatD w = attention_weights<double>(v, q.cast<double>(), k.cast<double>(), 0.25);
  int negative = 0;
  for (int i = 0; i < 50; ++i) {
    const Eigen::ArrayXd row = w.row(i).transpose().array();
    if ((row < 0.0).any()) ++negative;
    const Eigen::ArrayXd p = row.abs() / row.abs().sum();
    const double want = -(p * p.log()).sum();
    EXPECT_NEAR(r.entropy[static_cast<std::size_t>(i)], want, 1e-12) << "row " << i;
    EXPECT_NEAR(r.negative_mass[static_cast<std::size_t>(i)], -(row.min(0.0)).sum(), 1e-12)
        << "row " << i;
  }
  EXPECT_GT(negative, 40);
  EXPECT_EQ(r.negative_rows, negative);
}

TEST(Entropy, DegenerateRowsAreLeftOut) {
  MatF q = test::random_matrix(10, 4, 1).cwiseAbs().cast<float>();
  const MatF k = test::random_matrix(10, 4, 2).cast<float>();
  q.row(6) = -q.row(6) - MatF::Ones(1, 4);
  const EntropyRows r = attention_entropy(parse_variant("linear:relu"), q, k, 0.5, {});
  EXPECT_EQ(r.degenerate, 1);
  EXPECT_TRUE(std::isnan(r.entropy[6]));
  EXPECT_FALSE(std::isnan(r.entropy[5]));
}

TEST(Entropy, LayoutAndOptions) {
  EXPECT_EQ(max_entropy(1), 0.0);
  EXPECT_NEAR(max_entropy(197), std::log(197.0), 1e-15);
  const QueryStatsLayout layout = entropy_layout(197, 10);
  EXPECT_EQ(layout.bins.hi, max_entropy(197));
  EXPECT_EQ(layout.quantities.front(), "entropy");
  EXPECT_THROW((void)entropy_layout(197, 0), UsageError);
  EXPECT_THROW((void)entropy_measure({-1.0}, 1.0, false), UsageError);
  const MatF q = MatF::Ones(3, 2);
  EXPECT_THROW((void)attention_entropy(parse_variant("softmax"), q, q, 1.0, {std::nan("")}),
               UsageError);
}

}  // namespace
}  // namespace attnscope::analyses
