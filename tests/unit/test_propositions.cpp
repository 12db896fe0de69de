// Every row of `attnscope verify` as a test: the theory of both papers guarded by CI. The same
// analyses functions run here and in the command; wall-clock timing is never asserted (the cost
// rows count multiply-adds). test_negative_controls.cpp runs each check where it must fail.
#include "attnscope/analyses/propositions.hpp"

#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace attnscope::analyses {
namespace {

constexpr std::uint64_t kSeed = 31337;
constexpr int kTrials = 60;  // every trial shape (N, d from (2, 1) to (197, 64)) many times over

std::string describe(const CheckRow& r) {
  std::ostringstream s;
  s.precision(6);
  s << r.check << " [" << r.what << "] trials=" << r.trials << " margin=" << r.margin
    << (r.sense == CheckRow::Sense::Above ? " must be > " : " must be <= ") << r.threshold
    << " seed=" << kSeed;
  return s.str();
}

void expect_pass(const CheckRow& r, long min_trials = kTrials) {
  EXPECT_TRUE(r.pass) << describe(r);
  EXPECT_EQ(r.unusable, 0) << describe(r);
  EXPECT_GE(r.trials, min_trials) << describe(r);
  EXPECT_TRUE(std::isfinite(r.margin)) << describe(r);
}

TEST(Prop1, SoftmaxRowsOfRandomDistinctQueriesDiffer) {
  expect_pass(check_prop1_random(kSeed, kTrials));
}
TEST(Prop1, SoftmaxResistsAdversarialPairs) {
  expect_pass(check_prop1_adversarial(kSeed, kTrials));
}
TEST(Prop1, KeysOnAHyperplaneConfuseSoftmax) {
  expect_pass(check_prop1_hyperplane(kSeed, kTrials));
}
TEST(Prop2, ReluCollinearQueriesConfuseLinear) {
  expect_pass(check_prop2_relu_collinear(kSeed, kTrials));
}
TEST(Prop2, NegatedQueriesConfuseIdentityLinear) {
  expect_pass(check_prop2_identity_negation(kSeed, kTrials));
}
TEST(Prop2, ReluAffineConfusesDistinctDirections) {
  expect_pass(check_prop2_relu_affine(kSeed, kTrials));
}
TEST(Lemma1, LeakyReluHasCollinearFeatures) {
  expect_pass(check_lemma1("leaky_relu", kSeed, kTrials));
}
TEST(Lemma1, Elu1HasCollinearFeatures) { expect_pass(check_lemma1("elu1", kSeed, kTrials)); }
TEST(Prop3, InLineRowsOfRandomDistinctQueriesDiffer) {
  expect_pass(check_prop3_random(kSeed, kTrials));
}
TEST(Prop3, InLineSeparatesThePairsThatFoolLinear) {
  expect_pass(check_prop3_collinear(kSeed, kTrials));
}
TEST(Prop3, KeysOnAHyperplaneConfuseInLine) { expect_pass(check_prop3_hyperplane(kSeed, kTrials)); }
TEST(Mala, RowsSumToOne) { expect_pass(check_mala_rows_sum(kSeed, kTrials)); }
TEST(Mala, Eq11BetaGamma) { expect_pass(check_mala_eq11(kSeed, kTrials)); }
TEST(Mala, Eq19) { expect_pass(check_mala_eq19(kSeed, kTrials)); }
TEST(Mala, Eq22WithPositiveWeights) { expect_pass(check_mala_eq22(kSeed, kTrials)); }

TEST(Mala, Eq22FailsOnceAWeightTurnsNegative) {
  const CheckRow r = check_mala_eq22_counterexample(kSeed, kTrials);
  EXPECT_TRUE(r.pass) << describe(r);
  EXPECT_GT(r.margin, 0.0) << describe(r);
  EXPECT_NE(r.what.find("p_m = -"), std::string::npos) << "p_m must be negative: " << describe(r);
}

TEST(LinearForms, EqualExplicitForms) {
  for (const char* spec : {"inline@paper", "inline@code", "mala@paper", "mala@code",
                           "inline:elu1@paper", "mala:relu@code"}) {
    expect_pass(check_linear_form(spec, kSeed, 12), 12);  // each (N, d) once
  }
}

TEST(Seeds, SameSeedSameRowsOtherSeedOtherTrials) {
  const CheckRow a = check_prop1_random(kSeed, 10), b = check_prop1_random(kSeed, 10),
                 c = check_prop1_random(kSeed + 1, 10);
  EXPECT_EQ(a.margin, b.margin);
  EXPECT_NE(a.margin, c.margin);
}

// ---- the cost rows, without clocks -----------------------------------------------------------

TEST(PowerLaw, FitRecoversExactExponents) {
  std::vector<double> n{64, 128, 256, 512, 1024, 2048, 4096}, lin, quad;
  for (double x : n) {
    lin.push_back(3e-6 * x);
    quad.push_back(2e-9 * x * x);
  }
  const PowerLawFit a = fit_power_law(n, lin), b = fit_power_law(n, quad);
  EXPECT_NEAR(a.exponent, 1.0, 1e-12);
  EXPECT_NEAR(a.prefactor, 3e-6, 1e-15);
  EXPECT_NEAR(b.exponent, 2.0, 1e-12);
  EXPECT_NEAR(b.r2, 1.0, 1e-12);
}

TEST(Cost, CountedWorkIsLinearForTheLinearTimeFormAndQuadraticForTheExplicit) {
  const std::vector<int> sizes{64, 128, 256, 512};
  for (const char* spec : {"inline@code", "mala@code", "inline@paper", "mala:relu@paper"}) {
    const FormWork lin = count_form_work(spec, true, sizes, 16, kSeed);
    const FormWork exp = count_form_work(spec, false, sizes, 16, kSeed);
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      // phi(K)^T V and phi(Q) (phi(K)^T V): 2 N d dv; explicit: Q K^T and W V: 2 N^2 d.
      const double n = sizes[i];
      EXPECT_EQ(lin.multiply_adds[i], 2 * n * 16 * 16) << spec << " N=" << n;
      EXPECT_EQ(exp.multiply_adds[i], 2 * n * n * 16) << spec << " N=" << n;
    }
    EXPECT_EQ(lin.scratch_growths_on_repeat, 0) << spec;
    const CheckRow a = cost_row(lin), b = cost_row(exp);
    EXPECT_TRUE(a.pass) << describe(a);
    EXPECT_TRUE(b.pass) << describe(b);
    EXPECT_NEAR(a.margin, 1.0, 1e-12) << describe(a);
    EXPECT_NEAR(b.margin, 2.0, 1e-12) << describe(b);
  }
  // relu_affine adds x A^T for Q and K (2 N d d') to both forms.
  const FormWork lin = count_form_work("linear:relu_affine=5", true, sizes, 16, kSeed);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(lin.multiply_adds[i], 4.0 * sizes[i] * 16 * 16) << "N=" << sizes[i];
  }
}

TEST(CheckRow, DecideHonoursSenseAndRejectsNaN) {
  CheckRow r;
  r.trials = 1;
  r.sense = CheckRow::Sense::Below;
  r.threshold = 1e-12;
  r.margin = 1e-13;
  r.decide();
  EXPECT_TRUE(r.pass);
  r.margin = std::nan("");
  r.decide();
  EXPECT_FALSE(r.pass);
  r.sense = CheckRow::Sense::Above;
  r.decide();
  EXPECT_FALSE(r.pass);
  r.margin = 1e-12;  // strictly above
  r.decide();
  EXPECT_FALSE(r.pass);
}

TEST(VerifyAll, EveryRowPassesAndNoneDependsOnTiming) {
  VerifyOptions o;
  o.seed = kSeed;
  o.trials = 20;
  o.work_sizes = {64, 128, 256};
  o.timing = false;
  const auto rows = verify_all(o);
  // 20 fixed rows and the linear-form identity of every kernel family, paper and code.
  const std::vector<std::string> forms = linear_form_specs();
  const std::vector<const AttentionFamily*> families = test::qk_families();  // verify draws q and k alone
  EXPECT_EQ(forms.size(), 2 * static_cast<std::size_t>(std::count_if(
                                  families.begin(), families.end(),
                                  [](const AttentionFamily* f) { return f->kernel() != nullptr; })));
  EXPECT_EQ(rows.size(), 20u + forms.size());
  for (const std::string& spec : forms) {
    const std::string name = "linear_form." + parse_variant(spec).name();
    EXPECT_EQ(std::count_if(rows.begin(), rows.end(), [&](const CheckRow& r) { return r.check == name; }), 1)
        << name;
  }
  for (const CheckRow& r : rows) EXPECT_TRUE(r.pass) << describe(r);
  // Timing adds information, never a row nor a verdict.
  std::vector<FormTiming> timings;
  o.timing = true;
  o.timing_sizes = {64, 128};
  o.timing_repeats = 1;
  o.timings = &timings;
  const auto timed = verify_all(o);
  ASSERT_EQ(timed.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(timed[i].check, rows[i].check);
    EXPECT_EQ(timed[i].pass, rows[i].pass) << describe(timed[i]);
  }
  EXPECT_EQ(timings.size(), 2u);
}

}  // namespace
}  // namespace attnscope::analyses
