// Attention sinks: the fast path (registry weights, one pass over W) against the plain reference
// (ExactRows, key by key) on awkward sizes and every family; planted sinks are found and a sink
// that misses one query is not (negative control of "every query"); received attention sums to 1;
// the median and high-norm rule; the folding over images.
#include "attnscope/analyses/sinks.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "float_rows_bound.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace attnscope::analyses {
namespace {

/// Received attention, fast vs reference: a mean of N weights, each a few ulps of max(1, |w|).
constexpr double kReceivedTol = test::kDoubleTol;

TEST(Sinks, FastMatchesReferenceOnEveryFamily) {
  for (const std::string& spec : test::all_variant_specs()) {
    for (int n : {1, 2, 63, 197}) {
      for (int d : {1, 60}) {
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(n, d, 51, mean).cast<float>();
        const MatF k = test::random_matrix(n, d, 52, mean).cast<float>();
        const double scale = 1.0 / std::sqrt(static_cast<double>(d));
        const MatD w = attention_weights<double>(v, q.cast<double>(), k.cast<double>(), scale);
        const double bound = std::max(1.0, w.cwiseAbs().maxCoeff());
        // Softmax heads within the float range: float weights, each within a relative
        // 2 r / (1 - r) (float_softmax_rows.hpp), and so their mean.
        const test::FloatRowsBound fb = test::float_rows_bound(v, q, k, scale);
        const double rel = fb.used ? 2.0 * fb.r / (1.0 - fb.r) : 0.0;
        // 0.5 (the default), a low threshold that most columns pass, and one no column passes.
        for (double threshold : {0.5, -1e300, 1e300}) {
          const std::string what = spec + " N=" + std::to_string(n) + " d=" + std::to_string(d) +
                                   " threshold=" + std::to_string(threshold);
          const HeadSinks fast = head_sinks(v, q, k, scale, threshold);
          const HeadSinks ref = head_sinks_reference(v, q, k, scale, threshold);
          EXPECT_EQ(fast.valid_rows, ref.valid_rows) << what;
          EXPECT_EQ(fast.degenerate, ref.degenerate) << what;
          EXPECT_EQ(fast.sink_keys, ref.sink_keys) << what;
          ASSERT_EQ(fast.received.size(), static_cast<std::size_t>(n)) << what;
          for (std::size_t j = 0; j < fast.received.size(); ++j) {
            EXPECT_NEAR(fast.received[j], ref.received[j],
                        kReceivedTol * bound + rel * std::abs(ref.received[j]))
                << what << " key " << j;
          }
          if (threshold < 0 && fast.valid_rows > 0) {
            EXPECT_EQ(fast.sink_keys.size(), static_cast<std::size_t>(n)) << what;
          }
          if (threshold > 1e299) {
            EXPECT_TRUE(fast.sink_keys.empty()) << what;
          }
          if (v.rows_sum_to_one() && fast.valid_rows > 0) {
            double total = 0.0;
            for (double r : fast.received) total += r;
            EXPECT_NEAR(total, 1.0, 1e-9 * bound * n) << what;
          }
        }
      }
    }
  }
}

/// Softmax inputs where every query puts ~all its mass on key `sink`, except query `rebel`
/// (-1: none) which puts it on key `other`.
void planted(int n, int sink, int rebel, int other, MatF& q, MatF& k) {
  k = MatF::Identity(n, n);
  q = MatF::Zero(n, n);
  for (int i = 0; i < n; ++i) q(i, i == rebel ? other : sink) = 10.0F;
}

TEST(Sinks, PlantedSinkIsFoundAndOneRebelQueryBreaksIt) {
  const int n = 50;
  MatF q, k;
  planted(n, 0, -1, 0, q, k);
  for (const bool reference : {false, true}) {
    const auto run = [&](double t) {
      return reference ? head_sinks_reference(parse_variant("softmax"), q, k, 1.0, t)
                       : head_sinks(parse_variant("softmax"), q, k, 1.0, t);
    };
    const HeadSinks found = run(0.5);
    EXPECT_EQ(found.sink_keys, std::vector<int>{0});
    EXPECT_GT(found.received[0], 0.99);
    // exp(10) / (exp(10) + 49) = 0.99778: a threshold of 0.998 finds no sink.
    EXPECT_TRUE(run(0.998).sink_keys.empty());
  }
  // One query looks elsewhere: key 0 no longer takes "every" query's mass.
  planted(n, 0, 17, 5, q, k);
  const HeadSinks broken = head_sinks(parse_variant("softmax"), q, k, 1.0, 0.5);
  EXPECT_TRUE(broken.sink_keys.empty());
  EXPECT_GT(broken.received[0], 0.95);
  // A sink on a grid token (not CLS) is found at its index.
  planted(n, 23, -1, 0, q, k);
  EXPECT_EQ(head_sinks(parse_variant("softmax"), q, k, 1.0, 0.5).sink_keys, std::vector<int>{23});
}

TEST(Sinks, DegenerateRowsDoNotCountAsQueries) {
  // linear:relu with every query but one killed: the one valid row decides alone.
  const int n = 10;
  MatF q = -MatF::Ones(n, 3);
  q.row(4) << 1.0F, 0.0F, 0.0F;
  MatF k = MatF::Zero(n, 3);
  k(2, 0) = 1.0F;  // key 2 takes all of row 4
  const HeadSinks h = head_sinks(parse_variant("linear:relu"), q, k, 1.0, 0.5);
  EXPECT_EQ(h.valid_rows, 1);
  EXPECT_EQ(h.degenerate, n - 1);
  EXPECT_EQ(h.sink_keys, std::vector<int>{2});
  EXPECT_EQ(h.received[2], 1.0);
  const HeadSinks none = head_sinks(parse_variant("linear:relu"), -MatF::Ones(n, 3), k, 1.0, 0.5);
  EXPECT_EQ(none.valid_rows, 0);
  EXPECT_TRUE(none.sink_keys.empty());
}

TEST(Sinks, MedianAndHighNormRule) {
  // Norms 1, 2, 3, 40 (squared 1, 4, 9, 1600): median (2 + 3) / 2 = 2.5; 40 / 2.5 = 16.
  const LayerNorms even = layer_norms({9.0, 1.0, 1600.0, 4.0}, 4.0);
  EXPECT_EQ(even.median, 2.5);
  EXPECT_EQ(even.ratio[2], 16.0);
  EXPECT_EQ(even.high, (std::vector<char>{0, 0, 1, 0}));
  // Odd count: the middle value; a ratio equal to R is not above it.
  const LayerNorms odd = layer_norms({4.0, 64.0, 1.0}, 4.0);
  EXPECT_EQ(odd.median, 2.0);
  EXPECT_EQ(odd.ratio[1], 4.0);
  EXPECT_EQ(odd.high, (std::vector<char>{0, 0, 0}));
  // A median of 0 (most tokens zero): every non-zero token stands out.
  const LayerNorms zero = layer_norms({0.0, 0.0, 0.0, 1.0}, 4.0);
  EXPECT_EQ(zero.median, 0.0);
  EXPECT_EQ(zero.high, (std::vector<char>{0, 0, 0, 1}));
  EXPECT_TRUE(std::isinf(zero.ratio[3]));
}

TEST(Sinks, OptionsAreChecked) {
  EXPECT_THROW(check_sink_options({std::nan(""), NormSource::Values, 4.0}), UsageError);
  EXPECT_THROW(check_sink_options({0.5, NormSource::Values, 0.0}), UsageError);
  EXPECT_THROW(
      check_sink_options({0.5, NormSource::Values, std::numeric_limits<double>::infinity()}),
      UsageError);
  EXPECT_THROW((void)parse_norm_source("values"), UsageError);
  EXPECT_EQ(parse_norm_source("out"), NormSource::Outputs);
  EXPECT_EQ(to_string(NormSource::None), "none");
}

TEST(Sinks, TotalsAverageOverImagesWithValidRows) {
  Selection sel;
  sel.layers = {0};
  sel.heads = {0};
  SinksTotals totals({parse_variant("softmax")}, sel, 3, true);
  SinksImage a, b, c;
  a.heads = {{HeadSinks{{0.8, 0.1, 0.1}, {0}, 3, 0}}};
  b.heads = {{HeadSinks{{0.2, 0.4, 0.4}, {}, 3, 0}}};
  c.heads = {
      {HeadSinks{{0.0, 0.0, 0.0}, {}, 0, 3}}};  // every row degenerate: not an image of the mean
  for (SinksImage* img : {&a, &b, &c}) {
    LayerNorms ln;
    ln.ratio = {1.0, 5.0, 1.0};
    ln.high = {0, 1, 0};
    img->norms = {ln};
    totals.add(*img);
  }
  const SinksHeadTotal& h = totals.result().heads[0][0];
  EXPECT_EQ(h.images, 2);
  EXPECT_EQ(h.images_with_sink, 1);
  EXPECT_EQ(h.sink_images, (std::vector<std::int64_t>{1, 0, 0}));
  EXPECT_DOUBLE_EQ(h.received_sum[0], 1.0);
  EXPECT_DOUBLE_EQ(h.top_received_sum, 1.2);
  EXPECT_EQ(h.degenerate_rows, 3);
  EXPECT_EQ(totals.result().layers[0].high_tokens, 3);
  EXPECT_EQ(totals.result().layers[0].high_images[1], 3);
}

}  // namespace
}  // namespace attnscope::analyses
