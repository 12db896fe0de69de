// Large finite magnitudes: queries and keys whose norms reach 1e19, 1e30 and near FLT_MAX. Float
// logits overflow there, so every fast path must either give its reference's answer (confusion
// counts exactly, the rest within the double tolerance) or refuse with NumericalError exactly when
// its reference cannot be computed either (the exp feature map overflows double). Walked over
// every family, feature map and convention, and over the moderate magnitudes in between, where the
// softmax search switches from float rows to exact double rows. The plain-loop library reference
// (reference::weights) says which cases have an answer: NaN or Inf there means none.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/analyses/maps.hpp"
#include "attnscope/analyses/recompute.hpp"
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/query_transform.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "reference_sweep.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <tuple>

namespace attnscope::analyses {
namespace {

constexpr int kDim = 16;
const TokenGrid kGrid{1, 7, 7};  // 50 tokens: CLS and a 7 x 7 grid

/// One head whose largest query or key entry is `magnitude` (norms up to ~4x that), with planted
/// collinear queries
/// (q_2 = q_1 / 2, q_4 = 2 q_3: the same row for the homogeneous kernel maps).
struct Head {
  MatF q, k, v;
  double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
};

Head huge_head(double magnitude, std::uint64_t seed) {
  const int n = kGrid.tokens();
  MatD q = test::random_matrix(n, kDim, seed), k = test::random_matrix(n, kDim, seed + 1);
  q.row(2) = 0.5 * q.row(1);
  q.row(4) = 2.0 * q.row(3);
  const double top = std::max(q.cwiseAbs().maxCoeff(), k.cwiseAbs().maxCoeff());
  Head h;
  h.q = (q * (magnitude / top)).cast<float>();
  h.k = (k * (magnitude / top)).cast<float>();
  h.v = test::random_matrix(n, 8, seed + 2).cast<float>();
  return h;
}

/// Runs f; true when it threw NumericalError (anything else propagates and fails the test).
template <typename F>
bool refuses(F&& f) {
  try {
    f();
    return false;
  } catch (const NumericalError&) {
    return true;
  }
}


class HugeMagnitudes : public ::testing::TestWithParam<std::tuple<std::string, double>> {
 protected:
  void SetUp() override {
    spec_ = std::get<0>(GetParam());
    magnitude_ = std::get<1>(GetParam());
    variant_ = parse_variant(spec_, Convention::Paper, 5);
    head_ = huge_head(magnitude_, 17);
    std::ostringstream os;
    os << "variant=" << variant_.name() << " magnitude=" << magnitude_ << " N=" << kGrid.tokens()
       << " d=" << kDim << " seed=17";
    what_ = os.str();
  }
  /// The plain-loop reference's weights, or nullopt when they are not finite.
  std::optional<MatD> reference_weights(const MatD& q, std::vector<int>* degenerate = nullptr) const {
    const MatD w = reference::weights(variant_, q, head_.k.cast<double>(), head_.scale, nullptr, degenerate);
    if (!w.allFinite()) return std::nullopt;
    return w;
  }

  std::string spec_, what_;
  double magnitude_ = 1.0;
  Variant variant_;
  Head head_;
};

TEST_P(HugeMagnitudes, ConfusionFastEqualsReference) {
  const ConfusionOptions opt;
  HeadConfusion fast, ref;
  const bool fast_refused = refuses([&] { fast = count_confusion(variant_, head_.q, head_.q, head_.k, head_.scale, opt); });
  const bool ref_refused =
      refuses([&] { ref = count_confusion_reference(variant_, head_.q, head_.q, head_.k, head_.scale, opt); });
  EXPECT_EQ(ref_refused, !reference_weights(head_.q.cast<double>())) << what_;
  ASSERT_EQ(fast_refused, ref_refused) << what_;
  if (ref_refused) return;
  EXPECT_EQ(fast.pairs, ref.pairs) << what_ << " (fast looked at " << fast.candidates << " pairs)";
  EXPECT_EQ(fast.degenerate_rows, ref.degenerate_rows) << what_;
  // Rows this sharp are one-hot, so queries that share their top key are confused: the
  // comparison is not between two zeros.
  if (!variant_.linear_time_outputs() && magnitude_ >= 1e19) {
    EXPECT_GT(ref.pairs, 0) << what_;
  }
}

TEST_P(HugeMagnitudes, LocalityFastEqualsReference) {
  std::vector<double> fast, ref;
  int dead_fast = -1, dead_ref = -2;
  const bool fast_refused =
      refuses([&] { fast = local_mass(variant_, head_.q, head_.k, head_.scale, kGrid, 3, &dead_fast); });
  const bool ref_refused =
      refuses([&] { ref = local_mass_reference(variant_, head_.q, head_.k, head_.scale, kGrid, 3, &dead_ref); });
  EXPECT_EQ(ref_refused, !reference_weights(head_.q.cast<double>())) << what_;
  ASSERT_EQ(fast_refused, ref_refused) << what_;
  if (ref_refused) return;
  EXPECT_EQ(dead_fast, dead_ref) << what_;
  const ExactRows rows(variant_, head_.q, head_.k, head_.scale);
  int measured = 0;
  for (int i = 0; i < kGrid.tokens(); ++i) {
    const auto u = static_cast<std::size_t>(i);
    ASSERT_EQ(std::isnan(fast[u]), std::isnan(ref[u])) << what_ << " token " << i;
    if (std::isnan(ref[u])) continue;
    ++measured;
    // Errors scale with the row's entries (InLine and MALA rows reach 1e77 here).
    const double row_scale = std::max(1.0, rows.row(i).cwiseAbs().maxCoeff() * 9.0);
    const double tol = variant_.linear_time_outputs() ? test::kDoubleTol : test::kFloatTol;
    EXPECT_NEAR(fast[u], ref[u], tol * row_scale) << what_ << " token " << i;
  }
  EXPECT_EQ(measured, kGrid.height * kGrid.width - dead_ref) << what_;
}

TEST_P(HugeMagnitudes, MapsRowsEqualLibraryReference) {
  const std::optional<MatD> want = reference_weights(head_.q.cast<double>());
  std::optional<ExactRows> rows;
  const bool refused = refuses([&] { rows.emplace(variant_, head_.q, head_.k, head_.scale); });
  ASSERT_EQ(refused, !want.has_value()) << what_;
  if (refused) return;
  for (int t : {0, 1, 2, 25, kGrid.tokens() - 1}) {
    const AttentionMap m = attention_map(*rows, kGrid, t);
    MatD got(1, kGrid.tokens());
    got.leftCols(kGrid.prefix) = Eigen::Map<const MatD>(m.prefix.data(), 1, kGrid.prefix);
    for (int r = 0; r < kGrid.height; ++r)
      for (int c = 0; c < kGrid.width; ++c) got(0, kGrid.token(r, c)) = m.grid(r, c);
    EXPECT_TRUE(test::matrices_near(got, MatD(want->row(t)), test::kDoubleTol, what_ + " token " + std::to_string(t)));
  }
}

TEST_P(HugeMagnitudes, CensusWeightsEqualLibraryReference) {
  std::vector<int> degenerate_ref;
  const std::optional<MatD> want = reference_weights(head_.q.cast<double>(), &degenerate_ref);
  Diagnostics diag;
  MatD got;
  const bool refused = refuses([&] {
    got = attention_weights<double>(variant_, head_.q.cast<double>(), head_.k.cast<double>(), head_.scale, nullptr, &diag);
  });
  ASSERT_EQ(refused, !want.has_value()) << what_;
  if (refused) return;
  EXPECT_TRUE(test::matrices_near(got, *want, test::kDoubleTol, what_));
  EXPECT_EQ(diag.degenerate_rows, degenerate_ref) << what_;
}

TEST_P(HugeMagnitudes, RecomputeOutputsEqualLibraryReference) {
  const MatD q = head_.q.cast<double>(), k = head_.k.cast<double>(), v = head_.v.cast<double>();
  const MatD want = reference::outputs(variant_, q, k, v, head_.scale);
  MatD got, got_explicit;
  const bool refused = refuses([&] { got = attention_outputs<double>(variant_, q, k, v, head_.scale); });
  const bool refused_explicit =
      refuses([&] { got_explicit = attention_outputs_explicit<double>(variant_, q, k, v, head_.scale); });
  ASSERT_EQ(refused, !want.allFinite()) << what_;
  ASSERT_EQ(refused_explicit, refused) << what_;
  if (!refused) {
    EXPECT_TRUE(test::matrices_near(got, want, test::kDoubleTol, what_ + " linear-time"));
    EXPECT_TRUE(test::matrices_near(got_explicit, want, test::kDoubleTol, what_ + " explicit"));
  }
  // The float recomputation of recompute's cells: InLine and MALA outputs past FLT_MAX are
  // refused, never returned as Inf; the double comparison above holds them fine.
  MatF got_float;
  const bool float_refused = refuses([&] { got_float = attention_outputs<float>(variant_, head_.q, head_.k, head_.v, head_.scale); });
  if (!float_refused) {
    EXPECT_TRUE(got_float.allFinite()) << what_;
  }
  if (!refused && want.cwiseAbs().maxCoeff() < 1e38) {
    EXPECT_FALSE(float_refused) << what_;
  }
  // compare_head against the model's own outputs (here: the reference's) either refuses or
  // reports a finite, tiny error.
  if (!refused && want.cwiseAbs().maxCoeff() < 1e38) {
    RecomputeCell cell;
    const MatF model = want.cast<float>();
    compare_head(variant_, head_.q, head_.k, head_.v, head_.scale, &model, nullptr, cell);
    EXPECT_LE(cell.out_max_rel, 1e-6) << what_;
  }
}

TEST_P(HugeMagnitudes, SpikinessSweepEqualsLibraryReference) {
  SpikinessOptions opts;
  opts.scales = {0.5, 1.0, 3.0};
  const std::vector<ScaleSpace> spaces =
      variant_.linear_time_outputs()
          ? std::vector<ScaleSpace>{ScaleSpace::Query, ScaleSpace::Feature}
          : std::vector<ScaleSpace>{ScaleSpace::Query};
  for (ScaleSpace space : spaces) {
    opts.space = space;
    const std::string what = what_ + " space=" + to_string(space);
    const MatD k = head_.k.cast<double>();
    const VecD q = head_.q.row(1).cast<double>().transpose();
    QuerySweep sweep;
    const bool refused = refuses([&] {
      const HeadSweeper sweeper(variant_, k, head_.scale, opts);
      sweep = sweeper.sweep(q, 1, true, nullptr);
    });
    // The reference: the sweep's rows at token 1 in the sweep's space (reference_sweep.hpp).
    bool ref_finite = true;
    std::vector<MatD> want;
    for (double a : opts.scales) {
      if (!ref_finite) break;
      want.push_back(MatD(test::reference_sweep_row(variant_, space, q, 1, a, k, head_.scale).transpose()));
      ref_finite = want.back().allFinite();
    }
    ASSERT_EQ(refused, !ref_finite) << what;
    if (refused) continue;
    ASSERT_EQ(sweep.weights.size(), opts.scales.size()) << what;
    for (std::size_t s = 0; s < opts.scales.size(); ++s) {
      EXPECT_TRUE(test::matrices_near(MatD(sweep.weights[s].transpose()), want[s], test::kDoubleTol,
                                      what + " a=" + std::to_string(opts.scales[s])));
    }
  }
}

// The laws of the sweep hold in exact arithmetic; where the computed weights cannot resolve them
// (logits near 1e77 carry rounding errors far above 1) the points are skipped and counted, never
// reported as a violation of the law.
TEST_P(HugeMagnitudes, SpikinessLawsNeverFailOnRounding) {
  SpikinessOptions opts;
  opts.scales = {0.25, 0.5, 2.0, 8.0};
  for (ScaleSpace space : {ScaleSpace::Auto, ScaleSpace::Query}) {
    opts.space = space;
    const std::string what = what_ + " space=" + to_string(space);
    const MatD k = head_.k.cast<double>();
    std::vector<LawResult> laws;
    const bool refused = refuses([&] {
      const HeadSweeper sweeper(variant_, k, head_.scale, opts);
      laws = sweeper.laws();
      for (int t = 0; t < kGrid.tokens(); t += 7) {
        (void)sweeper.sweep(head_.q.row(t).cast<double>().transpose(), t, false, &laws);
      }
    });
    if (refused) continue;  // the sweep's rows themselves are compared above
    for (const LawResult& r : laws) {
      // Either the law is measured and holds, or no point could be compared and the skipped
      // points say why (reported as NO DATA, never as a violation).
      EXPECT_TRUE(r.pass() || (!r.has_data() && r.skipped > 0)) << what << " law " << to_string(r.law) << " deviation " << r.max_deviation
                            << " over " << r.points << " points (" << r.skipped << " skipped)";
    }
  }
}

std::vector<std::string> specs() { return test::all_variant_specs(); }

INSTANTIATE_TEST_SUITE_P(
    AllFamilies, HugeMagnitudes,
    ::testing::Combine(::testing::ValuesIn(specs()),
                       ::testing::Values(1e19, 1e30, 3e38, 1e2, 1e4, 1e6)),
    [](const ::testing::TestParamInfo<HugeMagnitudes::ParamType>& p) {
      std::ostringstream os;
      os << test::param_name(std::get<0>(p.param)) << "_at_" << std::get<1>(p.param);
      return test::param_name(os.str());
    });

// The softmax search's switch between float rows and exact rows, across the documented limit: the
// count equals the brute force on both sides of it and right at it.
TEST(HugeMagnitudesSoftmax, CountEqualsReferenceAcrossTheFloatLimit) {
  const Variant v = parse_variant("softmax");
  for (double magnitude = 10.0; magnitude < 1e38; magnitude *= 3.7) {
    const Head h = huge_head(magnitude, 23);
    const ConfusionOptions opt;
    const HeadConfusion fast = count_confusion(v, h.q, h.q, h.k, h.scale, opt);
    const HeadConfusion ref = count_confusion_reference(v, h.q, h.q, h.k, h.scale, opt);
    EXPECT_EQ(fast.pairs, ref.pairs) << "softmax magnitude=" << magnitude;
  }
}

// The query transforms run before every family: on float queries near FLT_MAX, A q + b (f2) would
// overflow in float. Their rows are unit vectors whatever the magnitude.
TEST(HugeMagnitudesTransforms, FloatTransformsEqualReference) {
  for (const char* name : {"f1", "f2", "l2norm"}) {
    for (double magnitude : {1e19, 1e30, 3e38}) {
      const Head h = huge_head(magnitude, 31);
      const QueryTransform t = parse_query_transform(name, 9);
      const MatF got = t.apply<float>(h.q);
      const MatD want = reference::query_transform(t, h.q.cast<double>());
      const std::string what = std::string(name) + " magnitude=" + std::to_string(magnitude) + " seed=31";
      EXPECT_TRUE(got.allFinite()) << what;
      EXPECT_TRUE(test::matrices_near(got, want, test::kFloatTol, what));
    }
  }
}

// Non-finite inputs never reach a sort or a mean: every path refuses them.
TEST(HugeMagnitudesSoftmax, NonFiniteInputsAreRefused) {
  for (const std::string& spec : {std::string("softmax"), std::string("linear:relu"), std::string("inline")}) {
    const Variant v = parse_variant(spec);
    for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      for (bool in_query : {true, false}) {
        Head h = huge_head(10.0, 29);
        (in_query ? h.q : h.k)(7, 3) = bad;
        const std::string what = spec + (in_query ? " query " : " key ") + std::to_string(bad);
        const ConfusionOptions opt;
        EXPECT_THROW((void)count_confusion(v, h.q, h.q, h.k, h.scale, opt), NumericalError) << what;
        EXPECT_THROW((void)count_confusion_reference(v, h.q, h.q, h.k, h.scale, opt), NumericalError) << what;
        EXPECT_THROW((void)local_mass(v, h.q, h.k, h.scale, kGrid, 3), NumericalError) << what;
        EXPECT_THROW((void)local_mass_reference(v, h.q, h.k, h.scale, kGrid, 3), NumericalError) << what;
      }
    }
  }
}

}  // namespace
}  // namespace attnscope::analyses
