// The references of the field's families that take per-layer model data (MLLA, RALA, MALA with
// its released RoPE, PolaFormer, Agent attention): each against an independent computation
// (Eigen products, complex rotations, softmaxes through Eigen's array ops), its released route to
// O against W V, on awkward sizes and magnitudes, and their properties with negative controls.
#include "attnscope/error.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>

#include <Eigen/SVD>

#include <array>
#include <cmath>
#include <complex>
#include <functional>
#include <sstream>
#include <string>

namespace attnscope {
namespace {

namespace ref = reference;

constexpr std::uint64_t kSeed = 20250122;
constexpr double kTol = 1e-12;  // double against double, relative to the largest |want|
constexpr std::array<int, 4> kN{1, 2, 7, 50};
constexpr std::array<int, 3> kD{1, 3, 16};
constexpr std::array<double, 3> kMagnitudes{1.0, 1e-8, 1e8};

std::string where(const std::string& what, int n, int d, std::uint64_t seed, double magnitude) {
  std::ostringstream os;
  os << what << " N=" << n << " d=" << d << " seed=" << seed << " magnitude=" << magnitude;
  return os.str();
}

/// max |got - want| <= tol * max |want| (relative to the matrix, whatever its size).
::testing::AssertionResult relatively_near(const MatD& got, const MatD& want, double tol,
                                           const std::string& config) {
  const double top = want.size() ? want.cwiseAbs().maxCoeff() : 0.0;
  if (top == 0.0) return test::matrices_near(got, want, 0.0, config);
  return test::matrices_near(MatD(got / top), MatD(want / top), tol, config);
}

// ----------------------------------------------------------------------------- independent forms
MatD elu1(const MatD& x) {
  return (x.array() > 0.0).select(x.array() + 1.0, x.array().exp()).matrix();
}

/// Each pair (2p, 2p+1) as a complex number times e^{i angle}.
MatD complex_rotate(const MatD& x, const MatD& angles) {
  MatD y(x.rows(), x.cols());
  for (Eigen::Index t = 0; t < x.rows(); ++t) {
    for (Eigen::Index p = 0; p < x.cols() / 2; ++p) {
      const std::complex<double> z =
          std::complex<double>(x(t, 2 * p), x(t, 2 * p + 1)) * std::polar(1.0, angles(t, p));
      y(t, 2 * p) = z.real();
      y(t, 2 * p + 1) = z.imag();
    }
  }
  return y;
}

/// R fq R fk^T / (fq sum fk + N eps), rows divided by their unrotated sums.
MatD rope_normalised(const MatD& fq, const MatD& fk, const MatD& angles, double eps) {
  const MatD num = complex_rotate(fq, angles) * complex_rotate(fk, angles).transpose();
  const VecD den =
      (fq * fk.colwise().sum().transpose()).array() + eps * static_cast<double>(fk.rows());
  return (num.array().colwise() / den.array()).matrix();
}

MatD softmax_rows(const MatD& logits) {
  const MatD shifted = logits.colwise() - logits.rowwise().maxCoeff();
  const MatD e = shifted.array().exp().matrix();
  return (e.array().colwise() / e.rowwise().sum().array()).matrix();
}

MatD independent_rala(const MatD& q, const MatD& k, double scale, const MatD& angles, double eps) {
  const MatD fq = elu1(q), fk = elu1(k);
  const MatD qbar = fq.colwise().mean();
  const MatD weights = softmax_rows(scale * qbar * fk.transpose());  // 1 x N
  MatD kk = fk;
  for (Eigen::Index j = 0; j < fk.rows(); ++j)
    kk.row(j) *= weights(0, j) * static_cast<double>(fk.rows());
  return rope_normalised(fq, kk, angles, eps);
}

MatD independent_mala(Convention c, const MatD& q, const MatD& k, double scale,
                      const MatD& angles) {
  const MatD fq = elu1(q), fk = elu1(k);
  const double n = static_cast<double>(k.rows());
  const MatD num = complex_rotate(fq, angles) * complex_rotate(fk, angles).transpose();
  const VecD S = fq * fk.colwise().sum().transpose();
  MatD w(q.rows(), k.rows());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    if (c == Convention::Paper) {
      w.row(i) = (1.0 + 1.0 / S(i)) * num.row(i).array() - S(i) / n;
    } else {
      const double z = scale * S(i) / n;
      w.row(i) = scale / n * (1.0 + 1.0 / (z + 1e-6)) * num.row(i).array() - z / n;
    }
  }
  return w;
}

/// [ReLU(x/a)^p, ReLU(-x/a)^p] through Eigen's array ops.
MatD signed_features(const MatD& x, const VecD& a, const VecD& p, bool negative_first) {
  const Eigen::ArrayXXd u = x.array().rowwise() / a.transpose().array();
  const Eigen::ArrayXXd pos = u.max(0.0).pow(p.transpose().replicate(x.rows(), 1).array());
  const Eigen::ArrayXXd neg = (-u).max(0.0).pow(p.transpose().replicate(x.rows(), 1).array());
  MatD y(x.rows(), 2 * x.cols());
  y << (negative_first ? neg : pos).matrix(), (negative_first ? pos : neg).matrix();
  return y;
}

MatD normalised(const MatD& fq, const MatD& fk, double eps) {
  const MatD num = fq * fk.transpose();
  const VecD den = num.rowwise().sum().array() + eps * static_cast<double>(fk.rows());
  return (num.array().colwise() / den.array()).matrix();
}

MatD random_angles(Eigen::Index n, Eigen::Index pairs, std::uint64_t seed) {
  return test::random_matrix(n, pairs, seed, 0.0, 3.0);
}

// ----------------------------------------------------------------------------- the RoPE families
struct RopeFamily {
  const char* name;
  // weights and outputs of the reference; independent weights
  std::function<MatD(Convention, const MatD&, const MatD&, double, const ref::Rotation&,
                     std::vector<int>*)>
      weights;
  std::function<MatD(Convention, const MatD&, const MatD&, const MatD&, double,
                     const ref::Rotation&)>
      outputs;
  std::function<MatD(Convention, const MatD&, const MatD&, double, const MatD&)> independent;
  /// The largest addend of a weight over the largest weight: MALA subtracts terms of size S,
  /// so its weights (by any route) keep about 16 - log10(this) digits.
  std::function<double(const MatD& w_independent, const MatD& q, const MatD& k, double s,
                       const MatD& angles)>
      conditioning = [](const MatD&, const MatD&, const MatD&, double, const MatD&) { return 1.0; };
};

std::vector<RopeFamily> rope_families() {
  return {
      {"mlla",
       [](Convention c, const MatD& q, const MatD& k, double, const ref::Rotation& r,
          std::vector<int>* deg) { return ref::mlla_weights(c, q, k, r, deg); },
       [](Convention c, const MatD& q, const MatD& k, const MatD& v, double,
          const ref::Rotation& r) { return ref::mlla_outputs(c, q, k, v, r); },
       [](Convention c, const MatD& q, const MatD& k, double, const MatD& a) {
         return rope_normalised(elu1(q), elu1(k), a, c == Convention::Paper ? 0.0 : 1e-6);
       }},
      {"rala",
       [](Convention c, const MatD& q, const MatD& k, double s, const ref::Rotation& r,
          std::vector<int>* deg) { return ref::rala_weights(c, q, k, s, r, deg); },
       [](Convention c, const MatD& q, const MatD& k, const MatD& v, double s,
          const ref::Rotation& r) { return ref::rala_outputs(c, q, k, v, s, r); },
       [](Convention c, const MatD& q, const MatD& k, double s, const MatD& a) {
         return independent_rala(q, k, s, a, c == Convention::Paper ? 0.0 : 1e-6);
       }},
      {"mala_rope",
       [](Convention c, const MatD& q, const MatD& k, double s, const ref::Rotation& r,
          std::vector<int>* deg) { return ref::mala_rope_weights(c, q, k, s, r, deg); },
       [](Convention c, const MatD& q, const MatD& k, const MatD& v, double s,
          const ref::Rotation& r) { return ref::mala_rope_outputs(c, q, k, v, s, r); },
       [](Convention c, const MatD& q, const MatD& k, double s, const MatD& a) {
         return independent_mala(c, q, k, s, a);
       },
       [](const MatD& w, const MatD& q, const MatD& k, double, const MatD& a) {
         // |(1 + 1/S) num| against |w|, in the paper scaling (the code's differs by a factor).
         const MatD fq = elu1(q), fk = elu1(k);
         const MatD num = complex_rotate(fq, a) * complex_rotate(fk, a).transpose();
         const VecD S = fq * fk.colwise().sum().transpose();
         double top = 0.0;
         for (Eigen::Index i = 0; i < num.rows(); ++i) {
           top = std::max(top, (1.0 + 1.0 / S(i)) * num.row(i).cwiseAbs().maxCoeff());
         }
         const double wmax = w.allFinite() ? w.cwiseAbs().maxCoeff() : 0.0;
         return wmax > 0.0 ? std::max(1.0, top / wmax) : 1.0;
       }},
  };
}

constexpr std::array<Convention, 2> kConventions{Convention::Code, Convention::Paper};

TEST(FieldRope, MatchesIndependentAndOutputsAreWV) {
  for (const RopeFamily& f : rope_families()) {
    for (Convention c : kConventions) {
      for (int n : kN) {
        for (int d : {2, 16}) {
          for (double m : kMagnitudes) {
            const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d);
            const test::Qkv in = test::random_qkv(n, d, d + 3, seed);
            const MatD q = m * in.q, k = m * in.k;
            const MatD angles = random_angles(n, d / 2, seed + 7);
            const ref::Rotation rot = ref::rotation_from_angles(angles);
            const double s = 1.0 / std::sqrt(static_cast<double>(d));
            const std::string at = where(std::string(f.name) + "@" + to_string(c), n, d, seed, m);
            std::vector<int> degenerate;
            const MatD w = f.weights(c, q, k, s, rot, &degenerate);
            MatD want = f.independent(c, q, k, s, angles);
            // A degenerate row is one whose independent row is 0/0 (ELU+1 underflowed to 0 for a
            // whole query or every key: the paper form has no denominator left); the reference
            // lists it and gives 0.
            std::vector<int> undefined;
            for (Eigen::Index i = 0; i < want.rows(); ++i) {
              if (!want.row(i).allFinite()) {
                undefined.push_back(static_cast<int>(i));
                want.row(i).setZero();
              }
            }
            EXPECT_EQ(degenerate, undefined) << at;
            const double cond = f.conditioning(want, q, k, s, angles);
            EXPECT_TRUE(relatively_near(w, want, kTol * cond, at + " W"));
            EXPECT_TRUE(relatively_near(f.outputs(c, q, k, in.v, s, rot),
                                        ref::apply_weights(w, in.v), 1e-11 * cond,
                                        at + " O = W V"));
          }
        }
      }
    }
  }
}

TEST(FieldRope, OddHeadDimIsRefusedInOneLine) {
  for (const RopeFamily& f : rope_families()) {
    for (int d : kD) {
      if (d % 2 == 0) continue;
      const test::Qkv in = test::random_qkv(7, d, d, kSeed);
      const ref::Rotation rot = ref::rotation_from_angles(MatD::Zero(7, d / 2 + 1));
      try {
        (void)f.weights(Convention::Code, in.q, in.k, 0.5, rot, nullptr);
        ADD_FAILURE() << f.name << " d=" << d << ": no error";
      } catch (const UsageError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("odd"), std::string::npos) << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      }
    }
  }
  const test::Qkv in = test::random_qkv(7, 4, 4, kSeed);
  try {
    (void)ref::mlla_weights(Convention::Code, in.q, in.k,
                            ref::rotation_from_angles(MatD::Zero(6, 2)));
    ADD_FAILURE() << "a 6-token rotation for 7 tokens was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 7x2"), std::string::npos) << e.what();
  }
}

/// Angles of the tokens of an h x w window at (dr, dc) inside a larger grid, as the model would
/// compute them there.
MatD window_angles(ref::RopeLayout layout, int h, int w, int dr, int dc, int d, int head,
                   int heads) {
  const MatD big = ref::rope_angles(layout, h + dr, w + dc, d, head, heads);
  MatD a(static_cast<Eigen::Index>(h) * w, d / 2);
  for (int r = 0; r < h; ++r) {
    for (int c = 0; c < w; ++c) a.row(r * w + c) = big.row((r + dr) * (w + dc) + c + dc);
  }
  return a;
}

TEST(FieldRope, CommonOffsetOfAllPositionsLeavesWeightsUnchanged) {
  // R(a + t) x . R(b + t) y = R(a) x . R(b) y: the numerator depends on position differences only,
  // and the denominators are unrotated, so the whole map is unchanged.
  const int h = 3, w = 4, d = 16, heads = 2;
  for (const RopeFamily& f : rope_families()) {
    for (ref::RopeLayout layout : {ref::RopeLayout::Mlla, ref::RopeLayout::RetNet}) {
      const test::Qkv in = test::random_qkv(h * w, d, d, kSeed + 11);
      const ref::Rotation at_origin =
          ref::rotation_from_angles(window_angles(layout, h, w, 0, 0, d, 1, heads));
      const ref::Rotation shifted =
          ref::rotation_from_angles(window_angles(layout, h, w, 5, 2, d, 1, heads));
      const MatD w0 = f.weights(Convention::Code, in.q, in.k, 0.25, at_origin, nullptr);
      EXPECT_TRUE(relatively_near(f.weights(Convention::Code, in.q, in.k, 0.25, shifted, nullptr),
                                  w0, 1e-12, std::string(f.name) + ": offset (5, 2)"));
      // Negative control: shifting the keys' positions only (not the queries') moves the map.
      const MatD rq = ref::rotate(at_origin, elu1(in.q));
      const MatD rk_shifted = ref::rotate(shifted, elu1(in.k));
      const MatD rk = ref::rotate(at_origin, elu1(in.k));
      EXPECT_GT((rq * rk_shifted.transpose() - rq * rk.transpose()).cwiseAbs().maxCoeff(), 1e-3)
          << f.name << ": a relative shift left the numerator unchanged";
    }
  }
}

TEST(FieldRope, RowsDoNotSumToOneButDoWithoutRotation) {
  const int h = 5, w = 5, d = 16;
  const ref::Rotation grid =
      ref::rotation_from_angles(ref::rope_angles(ref::RopeLayout::RetNet, h, w, d));
  const ref::Rotation none = ref::rotation_from_angles(MatD::Zero(h * w, d / 2));
  for (const RopeFamily& f : rope_families()) {
    const test::Qkv in = test::random_qkv(h * w, d, d, kSeed + 23);
    const MatD rotated = f.weights(Convention::Code, in.q, in.k, 0.25, grid, nullptr);
    const VecD sums = rotated.rowwise().sum();
    EXPECT_GT((sums.array() - 1.0).abs().maxCoeff(), 1e-2)
        << f.name << ": rows of the RoPE-numerator form sum to 1 on random inputs";
    // Negative control: the unrotated paper form is exactly row-stochastic, and the code form
    // sums to S / (S + N eps) (MALA: z / (z + 1e-6)), within 1e-6 of 1 here.
    const MatD plain = f.weights(Convention::Paper, in.q, in.k, 0.25, none, nullptr);
    EXPECT_TRUE(test::rows_sum_to_one(plain, 1e-13, std::string(f.name) + "@paper unrotated"));
    const MatD plain_code = f.weights(Convention::Code, in.q, in.k, 0.25, none, nullptr);
    const double gap = (plain_code.rowwise().sum().array() - 1.0).abs().maxCoeff();
    EXPECT_LT(gap, 1e-5) << f.name;
    EXPECT_GT(gap, 0.0) << f.name << ": the code convention's eps left no trace";
  }
}

TEST(FieldRope, AngleLayoutsOfTheReleasedCodes) {
  // MLLA: channel-wide; head 1 of 2 with d = 8 holds pairs 4..7 of k_max = 4: columns, theta_0..3.
  const MatD mlla = ref::rope_angles(ref::RopeLayout::Mlla, 2, 3, 8, 1, 2);
  const int t = 1 * 3 + 2;  // row 1, column 2
  for (int p = 0; p < 4; ++p) EXPECT_DOUBLE_EQ(mlla(t, p), 2.0 * std::pow(10000.0, -p / 4.0)) << p;
  const MatD head0 = ref::rope_angles(ref::RopeLayout::Mlla, 2, 3, 8, 0, 2);
  for (int p = 0; p < 4; ++p) EXPECT_DOUBLE_EQ(head0(t, p), 1.0 * std::pow(10000.0, -p / 4.0)) << p;
  // MALA / RALA: per head, f = d/4 frequencies on linspace(0, 1, f): rows, then columns.
  const MatD retnet = ref::rope_angles(ref::RopeLayout::RetNet, 2, 3, 8, 0, 1);
  EXPECT_DOUBLE_EQ(retnet(t, 0), 1.0);
  EXPECT_DOUBLE_EQ(retnet(t, 1), 1.0 * 1e-4);
  EXPECT_DOUBLE_EQ(retnet(t, 2), 2.0);
  EXPECT_DOUBLE_EQ(retnet(t, 3), 2.0 * 1e-4);
  EXPECT_THROW((void)ref::rope_angles(ref::RopeLayout::RetNet, 2, 3, 6), UsageError);
}

// ----------------------------------------------------------------------------- PolaFormer
TEST(FieldPolaFormer, MatchesIndependentAndOutputsAreWV) {
  for (Convention c : kConventions) {
    for (int n : kN) {
      for (int d : kD) {
        for (double m : kMagnitudes) {
          const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d) + 1;
          const test::Qkv in = test::random_qkv(n, d, d + 1, seed);
          const MatD q = m * in.q, k = m * in.k;
          const VecD a = (test::random_matrix(d, 1, seed + 5).array().exp()).matrix();  // > 0
          // exponents 1 + 4 sigmoid(x), up to 5: magnitudes up to (1e8)^5 stay finite
          const VecD p =
              (1.0 + 4.0 / (1.0 + (-test::random_matrix(d, 1, seed + 6).array()).exp())).matrix();
          const std::string at = where(std::string("polaformer@") + to_string(c), n, d, seed, m);
          const double eps = c == Convention::Paper ? 0.0 : 1e-6;
          std::vector<int> deg_same, deg_opposite;
          const ref::PolaMaps maps =
              ref::polaformer_weights(c, q, k, a, p, &deg_same, &deg_opposite);
          const MatD fk = signed_features(k, a, p, false);
          for (bool opposite : {false, true}) {
            const MatD fq = signed_features(q, a, p, opposite);
            MatD want = normalised(fq, fk, eps);
            // The paper form's degenerate rows: S zero or below 1e-12 |f(q)| |sum f(k)| (signed
            // powers up to 5 spread magnitudes so far that this happens at 1e8).
            std::vector<int> tiny;
            const VecD ksum = fk.colwise().sum().transpose();
            for (Eigen::Index i = 0; i < fq.rows(); ++i) {
              const double S = fq.row(i) * ksum;
              if (c == Convention::Paper &&
                  !(std::abs(S) > 1e-12 * fq.row(i).norm() * ksum.norm())) {
                tiny.push_back(static_cast<int>(i));
                want.row(i).setZero();
              }
            }
            EXPECT_EQ(opposite ? deg_opposite : deg_same, tiny) << at;
            EXPECT_TRUE(relatively_near(opposite ? maps.opposite : maps.same, want, kTol,
                                        at + (opposite ? " opposite" : " same")));
          }
          EXPECT_TRUE(relatively_near(ref::polaformer_outputs(c, q, k, in.v, a, p),
                                      ref::polaformer_apply(maps, in.v), 1e-11, at + " O = W V"));
        }
      }
    }
  }
}

TEST(FieldPolaFormer, MapsAreRowStochasticInThePaperFormOnly) {
  const int n = 50, d = 16;
  const test::Qkv in = test::random_qkv(n, d, d, kSeed + 31);
  const VecD a = VecD::Constant(d, 0.7), p = VecD::Constant(d, 3.0);
  const ref::PolaMaps paper = ref::polaformer_weights(Convention::Paper, in.q, in.k, a, p);
  EXPECT_TRUE(test::rows_sum_to_one(paper.same, 1e-13, "polaformer@paper same"));
  EXPECT_TRUE(test::rows_sum_to_one(paper.opposite, 1e-13, "polaformer@paper opposite"));
  EXPECT_GE(paper.same.minCoeff(), 0.0);
  EXPECT_GE(paper.opposite.minCoeff(), 0.0);
  // The two maps differ (else the polarity split would be idle).
  EXPECT_GT((paper.same - paper.opposite).cwiseAbs().maxCoeff(), 1e-3);
  // Negative control: the code's N eps joins the denominator; on tiny queries (S ~ N eps) the
  // rows are visibly short of 1.
  const ref::PolaMaps code = ref::polaformer_weights(Convention::Code, 1e-3 * in.q, in.k, a, p);
  EXPECT_GT((1.0 - code.same.rowwise().sum().array()).maxCoeff(), 1e-2);
  EXPECT_LE(code.same.rowwise().sum().maxCoeff(), 1.0);
}

TEST(FieldPolaFormer, ZeroQueryIsDegenerateInThePaperFormAndZeroInTheCode) {
  test::Qkv in = test::random_qkv(7, 3, 3, kSeed + 37);
  in.q.row(2).setZero();
  const VecD a = VecD::Ones(3), p = VecD::Constant(3, 2.0);
  std::vector<int> same, opposite;
  const ref::PolaMaps paper =
      ref::polaformer_weights(Convention::Paper, in.q, in.k, a, p, &same, &opposite);
  EXPECT_EQ(same, std::vector<int>{2});
  EXPECT_EQ(opposite, std::vector<int>{2});
  EXPECT_TRUE(paper.same.row(2).isZero(0.0));
  std::vector<int> code_rows;
  const ref::PolaMaps code =
      ref::polaformer_weights(Convention::Code, in.q, in.k, a, p, &code_rows);
  EXPECT_TRUE(code_rows.empty());
  EXPECT_TRUE(code.same.row(2).isZero(0.0));
  EXPECT_THROW((void)ref::polaformer_weights(Convention::Code, in.q, in.k, VecD::Ones(2), p),
               UsageError);
  EXPECT_THROW((void)ref::polaformer_weights(Convention::Code, in.q, in.k, VecD::Zero(3), p),
               UsageError);
}

// ----------------------------------------------------------------------------- Agent attention
TEST(FieldAgent, MatchesIndependentAndOutputsAreWV) {
  for (int n : kN) {
    for (int d : kD) {
      for (double m : {1.0, 1e-8, 30.0}) {  // softmax logits: large magnitudes saturate to one-hot
        for (int agents : {1, 4}) {
          const std::uint64_t seed = kSeed + static_cast<std::uint64_t>(n * 100 + d) + 2;
          const test::Qkv in = test::random_qkv(n, d, d + 2, seed);
          const MatD q = m * in.q, k = m * in.k;
          const MatD A = m * test::random_matrix(agents, d, seed + 9);
          const MatD b1 = test::random_matrix(agents, n, seed + 10, 0.0, 0.1);
          const MatD b2 = test::random_matrix(n, agents, seed + 11, 0.0, 0.1);
          const double s = 1.0 / std::sqrt(static_cast<double>(d));
          const std::string at = where("agent agents=" + std::to_string(agents), n, d, seed, m);
          const MatD w = ref::agent_weights(q, k, A, s, b1, b2);
          const MatD want =
              softmax_rows(s * q * A.transpose() + b2) * softmax_rows(s * A * k.transpose() + b1);
          EXPECT_TRUE(relatively_near(w, want, kTol, at + " W"));
          EXPECT_TRUE(relatively_near(ref::agent_outputs(q, k, in.v, A, s, b1, b2),
                                      ref::apply_weights(w, in.v), 1e-11, at + " O = W V"));
          EXPECT_TRUE(test::rows_sum_to_one(w, 1e-13, at));
        }
      }
    }
  }
}

int numerical_rank(const MatD& w) {
  const Eigen::JacobiSVD<MatD> svd(w);
  const VecD sv = svd.singularValues();
  int r = 0;
  for (Eigen::Index i = 0; i < sv.size(); ++i) r += sv(i) > 1e-10 * sv(0) ? 1 : 0;
  return r;
}

TEST(FieldAgent, RankIsAtMostTheNumberOfAgents) {
  const int prefix = 1, gh = 6, gw = 6, n = prefix + gh * gw, d = 16;
  const test::Qkv in = test::random_qkv(n, d, d, kSeed + 41);
  const MatD A = ref::pooled_agents(in.q, prefix, gh, gw, 2, 2);
  const MatD w = ref::agent_weights(in.q, in.k, A, 0.25);
  EXPECT_LE(numerical_rank(w), 4);
  EXPECT_EQ(numerical_rank(w), 4);
  // Negative control: the same queries and keys through one softmax are of full rank.
  const MatD full = softmax_rows(0.25 * in.q * in.k.transpose());
  EXPECT_GT(numerical_rank(full), 4);
}

TEST(FieldAgent, PooledAgentsBinAsAdaptiveAveragePooling) {
  // 1 prefix token, a 5 x 5 grid of token indices, pooled to 2 x 2: torch's bins are rows (and
  // columns) 0..2 and 2..4, overlapping on 2.
  MatD q(26, 1);
  q(0, 0) = 1000.0;  // the prefix token is never pooled
  for (int t = 0; t < 25; ++t) q(1 + t, 0) = t;
  const MatD a = ref::pooled_agents(q, 1, 5, 5, 2, 2);
  auto mean = [&](int r0, int r1, int c0, int c1) {
    double s = 0.0;
    for (int r = r0; r <= r1; ++r) {
      for (int c = c0; c <= c1; ++c) s += r * 5 + c;
    }
    return s / ((r1 - r0 + 1) * (c1 - c0 + 1));
  };
  EXPECT_DOUBLE_EQ(a(0, 0), mean(0, 2, 0, 2));
  EXPECT_DOUBLE_EQ(a(1, 0), mean(0, 2, 2, 4));
  EXPECT_DOUBLE_EQ(a(2, 0), mean(2, 4, 0, 2));
  EXPECT_DOUBLE_EQ(a(3, 0), mean(2, 4, 2, 4));
  EXPECT_THROW((void)ref::pooled_agents(q, 0, 5, 5, 2, 2), UsageError);
  EXPECT_THROW((void)ref::agent_weights(q, q, MatD::Zero(2, 3), 1.0), UsageError);
  EXPECT_THROW((void)ref::agent_weights(q, q, MatD::Zero(2, 1), 1.0, MatD::Zero(2, 5)), UsageError);
}

}  // namespace
}  // namespace attnscope
