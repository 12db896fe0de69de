// Negative controls: every row of `attnscope verify` run where its proposition is false must
// fail. Each test calls the very check that verify runs (propositions.hpp), with CheckInputs
// replacing the piece that the proposition's hypothesis is about; a check that cannot fail here
// would prove nothing when it passes.
#include "attnscope/analyses/propositions.hpp"
#include "attnscope/analyses/spikiness.hpp"
#include "attnscope/attention.hpp"

#include <gtest/gtest.h>

#include <Eigen/QR>

#include <cmath>
#include <random>
#include <sstream>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 31337;
constexpr int kTrials = 20;  // every trial shape several times over

std::string describe(const CheckRow& r) {
  std::ostringstream s;
  s.precision(6);
  s << r.check << " [" << r.what << "] trials=" << r.trials << " unusable=" << r.unusable
    << " margin=" << r.margin
    << (r.sense == CheckRow::Sense::Above ? " must be > " : " must be <= ") << r.threshold
    << " result=" << r.result() << " seed=" << kSeed;
  return s.str();
}

/// The row failed on a measured margin (not for want of a usable draw).
void expect_measured_fail(const CheckRow& r) {
  EXPECT_FALSE(r.pass) << describe(r);
  EXPECT_EQ(r.result(), "FAIL") << describe(r);
  EXPECT_EQ(r.unusable, 0) << describe(r);
  EXPECT_GE(r.trials, 1) << describe(r);
}

/// The row failed because no draw met its hypothesis: reported as such, no margin.
void expect_no_draw(const CheckRow& r) {
  EXPECT_FALSE(r.pass) << describe(r);
  EXPECT_EQ(r.result(), "NO DRAW") << describe(r);
  EXPECT_GT(r.unusable, 0) << describe(r);
  EXPECT_TRUE(std::isnan(r.margin)) << describe(r);
}

MatD gaussian(int n, int d, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  MatD m(n, d);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = normal(gen);
  return m;
}

/// Keys on the hyperplane {k : k.x = 1}: K x = 1 is solvable, so rank([K, 1]) = d, the case
/// that Prop. 1 and 3 exclude.
MatD hyperplane_keys(int n, int d, std::uint64_t seed) {
  MatD k = gaussian(n, d, seed);
  const VecD x = gaussian(d, 1, seed + 1).col(0).normalized();
  for (Eigen::Index j = 0; j < k.rows(); ++j) {
    k.row(j) -= (k.row(j).dot(x) - 1.0) * x.transpose();
  }
  return k;
}

/// p moved along the solution of K x = 1: the pair the rank condition rank([K, 1]) = d + 1 rules
/// out.
VecD along_ones(const VecD& p, const MatD& k) {
  return p + 0.7 * k.colPivHouseholderQr().solve(VecD::Ones(k.rows()));
}

CheckInputs without_rank_conditions() {
  CheckInputs in;
  in.keys = hyperplane_keys;
  in.skip_hypothesis = true;
  return in;
}

// ---- Prop. 1 -------------------------------------------------------------------------------

TEST(NegativeControl, Prop1RandomRefusesKeysWithoutTheRankConditions) {
  CheckInputs in;
  in.keys = hyperplane_keys;
  expect_no_draw(check_prop1_random(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop1RandomFailsWhenRankKOneIsD) {
  CheckInputs in = without_rank_conditions();
  in.partner = along_ones;
  expect_measured_fail(check_prop1_random(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop1AdversarialFailsWhenRankKOneIsD) {
  expect_measured_fail(check_prop1_adversarial(kSeed, kTrials, without_rank_conditions()));
}

TEST(NegativeControl, Prop1HyperplaneRefusesGenericKeys) {
  CheckInputs in;
  in.keys = gaussian;
  expect_no_draw(check_prop1_hyperplane(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop1HyperplaneFailsOnGenericKeys) {
  CheckInputs in;
  in.keys = gaussian;
  in.skip_hypothesis = true;
  expect_measured_fail(check_prop1_hyperplane(kSeed, kTrials, in));
}

// ---- Prop. 2 and Lemma 1: the pairs that fool linear attention do not fool others ------------

TEST(NegativeControl, Prop2ReluCollinearFailsForSoftmax) {
  CheckInputs in;
  in.family = "softmax";
  expect_measured_fail(check_prop2_relu_collinear(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop2IdentityNegationFailsForInLine) {
  CheckInputs in;
  in.family = "inline";
  expect_measured_fail(check_prop2_identity_negation(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop2ReluAffineFailsForSoftmax) {
  CheckInputs in;
  in.family = "softmax";
  expect_measured_fail(check_prop2_relu_affine(kSeed, kTrials, in));
}

TEST(NegativeControl, Lemma1FailsForInLine) {
  CheckInputs in;
  in.family = "inline";
  expect_measured_fail(check_lemma1("leaky_relu", kSeed, kTrials, in));
  expect_measured_fail(check_lemma1("elu1", kSeed, kTrials, in));
}

TEST(NegativeControl, Lemma1FailsForAPartnerThatIsNotAPreimage) {
  CheckInputs in;
  in.partner = [](const VecD& p, const MatD&) { return VecD(p + VecD::Constant(p.size(), 0.1)); };
  expect_measured_fail(check_lemma1("elu1", kSeed, kTrials, in));
}

// ---- Prop. 3 -------------------------------------------------------------------------------

TEST(NegativeControl, Prop3RandomFailsWithoutTheRankConditions) {
  CheckInputs in = without_rank_conditions();
  in.partner = along_ones;
  expect_measured_fail(check_prop3_random(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop3RandomFailsForLinearAttention) {
  CheckInputs in;
  in.family = "linear";
  in.partner = [](const VecD& p, const MatD&) { return VecD(2.0 * p); };
  expect_measured_fail(check_prop3_random(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop3CollinearFailsForLinearAttention) {
  CheckInputs in;
  in.family = "linear";
  expect_measured_fail(check_prop3_collinear(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop3CollinearFailsWithoutTheRankConditions) {
  // phi = identity trials meet keys on a hyperplane: InLine's weakest direction is exact there.
  expect_measured_fail(check_prop3_collinear(kSeed, kTrials, without_rank_conditions()));
}

TEST(NegativeControl, Prop3HyperplaneRefusesGenericKeys) {
  CheckInputs in;
  in.keys = gaussian;
  expect_no_draw(check_prop3_hyperplane(kSeed, kTrials, in));
}

TEST(NegativeControl, Prop3HyperplaneFailsOnGenericKeys) {
  CheckInputs in;
  in.keys = gaussian;
  in.skip_hypothesis = true;
  expect_measured_fail(check_prop3_hyperplane(kSeed, kTrials, in));
}

// ---- MALA ----------------------------------------------------------------------------------

TEST(NegativeControl, MalaRowsSumFailsForWeightsOffByOnePartInABillion) {
  CheckInputs in;
  in.weights = [](const Variant& v, const MatD& x, const MatD& k, double scale) {
    return MatD(attention_weights<double>(v, x, k, scale) * (1.0 + 1e-9));
  };
  expect_measured_fail(check_mala_rows_sum(kSeed, kTrials, in));
}

TEST(NegativeControl, MalaEq11FailsForAQueryScaledByAnotherFactor) {
  CheckInputs in;
  in.scaled_query = [](const VecD& phi_q, double a) { return VecD(a * (1.0 + 1e-9) * phi_q); };
  expect_measured_fail(check_mala_eq11(kSeed, kTrials, in));
}

TEST(NegativeControl, MalaEq19FailsForAShrunkQuery) {
  // a < 1: (a - 1)(beta - 1) < 0, so a beta / (a + beta - 1) < 1.
  CheckInputs in;
  in.a_range = std::pair{0.125, 0.75};
  expect_measured_fail(check_mala_eq19(kSeed, kTrials, in));
}

TEST(NegativeControl, MalaEq19FailsForAQueryThatIsNotScaled) {
  CheckInputs in;
  in.scaled_query = [](const VecD& phi_q, double) { return phi_q; };
  expect_measured_fail(check_mala_eq19(kSeed, kTrials, in));
}

TEST(NegativeControl, MalaEq22FailsForAShrunkQuery) {
  CheckInputs in;
  in.a_range = std::pair{0.125, 0.75};
  expect_measured_fail(check_mala_eq22(kSeed, kTrials, in));
}

TEST(NegativeControl, MalaEq22CounterexampleNotFoundWhenNothingIsScaled) {
  // a = 1: no weight can change sign, so there is no counterexample to find.
  CheckInputs in;
  in.a_range = std::pair{1.0, 1.0};
  expect_no_draw(check_mala_eq22_counterexample(kSeed, kTrials, in));
}

// ---- linear-time forms and their cost --------------------------------------------------------

TEST(NegativeControl, LinearFormFailsForAWrongLinearForm) {
  CheckInputs in;
  // The right outputs without the b_i sum_j v_j term of eq. 5 / eq. 13 (weights that do not
  // sum to 1): what a linear-time form that forgot InLine's 1/N or MALA's gamma would give.
  in.outputs = [](const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                  double scale) {
    const LowRankForm lr = low_rank_form<double>(v, q, k, scale);
    const Eigen::Index r = lr.M.rows() - 1;
    return MatD(lr.Z.leftCols(r) * (lr.M.topRows(r) * values));
  };
  for (const char* spec : {"inline@paper", "inline@code", "mala@paper", "mala@code"}) {
    expect_measured_fail(check_linear_form(spec, kSeed, 12, in));
  }
}

TEST(NegativeControl, LinearFormFailsForOutputsOffByOnePartInABillion) {
  CheckInputs in;
  in.outputs = [](const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                  double scale) {
    return MatD(attention_outputs<double>(v, q, k, values, scale) * (1.0 + 1e-9));
  };
  expect_measured_fail(check_linear_form("inline@code", kSeed, 12, in));
}

const std::vector<int> kSizes{64, 128, 256, 512};

TEST(NegativeControl, LinearTimeCostFailsForTheExplicitForm) {
  CheckInputs in;
  in.outputs = [](const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                  double scale) {
    return attention_outputs_explicit<double>(v, q, k, values, scale);
  };
  for (const char* spec : {"inline@code", "mala@code"}) {
    const CheckRow r = cost_row(count_form_work(spec, true, kSizes, 16, kSeed, in));
    expect_measured_fail(r);
    EXPECT_NEAR(r.margin, 2.0, 1e-9) << describe(r);
  }
}

TEST(NegativeControl, ExplicitCostFailsForTheLinearTimeForm) {
  CheckInputs in;
  in.outputs = [](const Variant& v, const MatD& q, const MatD& k, const MatD& values,
                  double scale) { return attention_outputs<double>(v, q, k, values, scale); };
  const CheckRow r = cost_row(count_form_work("mala@code", false, kSizes, 16, kSeed, in));
  expect_measured_fail(r);
  EXPECT_NEAR(r.margin, 1.0, 1e-9) << describe(r);
}

TEST(NegativeControl, CostRowWithoutCountedWorkIsNotMeasured) {
  CheckInputs in;  // a "form" that does no counted work at all
  in.outputs = [](const Variant&, const MatD& q, const MatD&, const MatD& values, double) {
    return MatD(MatD::Zero(q.rows(), values.cols()));
  };
  expect_no_draw(cost_row(count_form_work("inline@code", true, kSizes, 16, kSeed, in)));
}

TEST(NegativeControl, CostRowFailsWhenARepeatedCallAllocates) {
  FormWork w = count_form_work("inline@code", true, kSizes, 16, kSeed);
  EXPECT_TRUE(cost_row(w).pass) << describe(cost_row(w));
  w.scratch_growths_on_repeat = 1;
  EXPECT_FALSE(cost_row(w).pass) << describe(cost_row(w));
}

// ---- rows that checked nothing ---------------------------------------------------------------

TEST(CheckRow, ZeroTrialsOrUnusableTrialsDoNotPass) {
  CheckRow r;
  r.sense = CheckRow::Sense::Below;
  r.threshold = 1e-12;
  r.margin = 0.0;
  r.decide();
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.result(), "NO DRAW");
  r.trials = 5;
  r.decide();
  EXPECT_TRUE(r.pass);
  r.unusable = 1;
  r.decide();
  EXPECT_FALSE(r.pass);
  EXPECT_EQ(r.result(), "NO DRAW");
}

TEST(LawResult, ZeroPointsDoNotPass) {
  LawResult law;
  law.threshold = kLawTolerance;
  EXPECT_FALSE(law.has_data());
  EXPECT_FALSE(law.pass());
  law.points = 1;
  EXPECT_TRUE(law.pass());
  LawResult off;  // a law that does not apply is not judged, with or without points
  off.applicable = false;
  EXPECT_TRUE(off.pass());
}

}  // namespace
}  // namespace attnscope::analyses
