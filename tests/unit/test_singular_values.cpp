// singular_values (fixed-order bidiagonalisation and the Golub-Kahan tridiagonal) against Eigen's
// one-sided Jacobi SVD on awkward shapes and magnitudes; exactly known spectra; exact scaling by
// powers of two and transposition (the same bits); numerical rank of matrices built to have it,
// with a full-rank control; the values of x and [x, 1] from one QR; zero, empty and non-finite
// inputs.
#include "attnscope/singular_values.hpp"

#include "random_inputs.hpp"

#include <gtest/gtest.h>
#include <Eigen/QR>
#include <Eigen/SVD>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <limits>
#include <string>

namespace attnscope {
namespace {

constexpr double kEps = std::numeric_limits<double>::epsilon();

/// Both methods are backward stable: each value within a small multiple of n eps sigma_max.
double bound(Eigen::Index rows, Eigen::Index cols, double top) {
  return 16.0 * static_cast<double>(std::max(rows, cols)) * kEps * top;
}

void expect_close_to_jacobi(const MatD& x, const std::string& what) {
  const std::vector<double> fast = singular_values(x);
  const VecD ref = Eigen::JacobiSVD<MatD>(x).singularValues();
  ASSERT_EQ(static_cast<Eigen::Index>(fast.size()), ref.size()) << what;
  const double tol = bound(x.rows(), x.cols(), ref.size() > 0 ? ref(0) : 0.0);
  for (Eigen::Index t = 0; t < ref.size(); ++t) {
    EXPECT_NEAR(fast[static_cast<std::size_t>(t)], ref(t), tol) << what << " value " << t;
  }
}

int numerical_rank(const std::vector<double>& s, Eigen::Index rows, Eigen::Index cols) {
  if (s.empty() || !(s.front() > 0.0)) return 0;
  const double tol = s.front() * static_cast<double>(std::max(rows, cols)) * kEps;
  int r = 0;
  for (const double x : s) r += x > tol ? 1 : 0;
  return r;
}

/// A random orthogonal n x n matrix (the Q of a Gaussian matrix).
MatD orthogonal(Eigen::Index n, unsigned seed) {
  const Eigen::MatrixXd g = test::random_matrix(n, n, seed);
  return MatD(Eigen::HouseholderQR<Eigen::MatrixXd>(g).householderQ());
}

TEST(SingularValues, EqualJacobiOnAwkwardShapes) {
  const std::pair<int, int> shapes[] = {{1, 1}, {1, 5}, {5, 1},  {2, 2},   {7, 3},    {3, 7},
                                        {16, 16}, {63, 63}, {197, 64}, {65, 197}, {197, 197}};
  unsigned seed = 1;
  for (const auto& [r, c] : shapes) {
    const MatD x = test::random_matrix(r, c, seed++);
    expect_close_to_jacobi(x, std::to_string(r) + "x" + std::to_string(c));
    // Non-negative entries (attention weights): one large singular value, the rest small.
    const MatD p = x.cwiseAbs();
    expect_close_to_jacobi(p, std::to_string(r) + "x" + std::to_string(c) + " non-negative");
  }
}

TEST(SingularValues, KnownSpectraAreRecovered) {
  const Eigen::Index n = 40;
  const MatD u = orthogonal(n, 11), v = orthogonal(n, 12);
  VecD s(n);
  for (Eigen::Index t = 0; t < n; ++t) s(t) = std::pow(10.0, -0.4 * static_cast<double>(t));  // 1 to 1e-15.6
  s(n - 1) = 0.0;
  s(n - 2) = 0.0;
  const MatD x = u * s.asDiagonal() * v.transpose();
  const std::vector<double> got = singular_values(x);
  const double tol = bound(n, n, 1.0);
  for (Eigen::Index t = 0; t < n; ++t) EXPECT_NEAR(got[static_cast<std::size_t>(t)], s(t), tol) << t;
  // A wrong value is seen: the control moves one singular value by 1e-9.
  VecD s2 = s;
  s2(3) += 1e-9;
  const std::vector<double> moved = singular_values(MatD(u * s2.asDiagonal() * v.transpose()));
  EXPECT_GT(std::fabs(moved[3] - s(3)), tol);
}

TEST(SingularValues, PowersOfTwoAndTranspositionGiveTheSameBits) {
  const MatD x = test::random_matrix(37, 23, 5);
  const std::vector<double> base = singular_values(x);
  for (const int k : {-1000, -500, -3, 7, 500, 1000}) {
    const std::vector<double> scaled = singular_values(MatD(x * std::ldexp(1.0, k)));
    for (std::size_t t = 0; t < base.size(); ++t) EXPECT_EQ(scaled[t], std::ldexp(base[t], k)) << k << " " << t;
  }
  EXPECT_EQ(singular_values(MatD(x.transpose())), base);
  // The same through the QR first (a tall matrix).
  const MatD tall = test::random_matrix(90, 23, 6);
  const std::vector<double> tall_base = singular_values(tall);
  for (const int k : {-1000, -3, 1000}) {
    const std::vector<double> scaled = singular_values(MatD(tall * std::ldexp(1.0, k)));
    for (std::size_t t = 0; t < tall_base.size(); ++t) EXPECT_EQ(scaled[t], std::ldexp(tall_base[t], k)) << k << " " << t;
  }
  EXPECT_EQ(singular_values(MatD(tall.transpose())), tall_base);
  // Magnitudes that are not powers of two, near both ends of double's range.
  for (const double m : {1e-300, 1e-150, 1e150, 1e300}) {
    expect_close_to_jacobi(MatD(x * m), "scaled by " + std::to_string(m));
  }
}

TEST(SingularValues, NumericalRankOfLowRankProducts) {
  for (const int r : {1, 5, 64, 65}) {
    const MatD a = test::random_matrix(197, r, 21), b = test::random_matrix(r, 197, 22);
    const MatD x = a * b;
    EXPECT_EQ(numerical_rank(singular_values(x), 197, 197), r) << r;
  }
  // Control: a Gaussian matrix of the same size has full rank.
  EXPECT_EQ(numerical_rank(singular_values(test::random_matrix(197, 197, 23)), 197, 197), 197);
}

/// B's values by Jacobi on the dense bidiagonal, in long double, largest first.
std::vector<double> jacobi_bidiagonal(const std::vector<double>& d, const std::vector<double>& e) {
  using MatL = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic>;
  const auto n = static_cast<Eigen::Index>(d.size());
  MatL b = MatL::Zero(n, n);
  for (Eigen::Index t = 0; t < n; ++t) {
    b(t, t) = d[static_cast<std::size_t>(t)];
    if (t + 1 < n) b(t, t + 1) = e[static_cast<std::size_t>(t)];
  }
  const auto s = Eigen::JacobiSVD<MatL>(b).singularValues();
  std::vector<double> out;
  for (Eigen::Index t = 0; t < s.size(); ++t) out.push_back(static_cast<double>(s(t)));
  return out;
}

std::vector<double> sorted(std::vector<double> s) {
  std::sort(s.begin(), s.end(), std::greater<>());
  return s;
}

TEST(SingularValues, BothBidiagonalSolversOnHardBidiagonals) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0.5, 1.0);
  struct Case {
    std::string name;
    std::vector<double> d, e;
  };
  std::vector<Case> cases;
  for (const int n : {1, 2, 3, 17, 120}) {
    Case plain{"random n=" + std::to_string(n), {}, {}}, graded{"graded n=" + std::to_string(n), {}, {}};
    for (int t = 0; t < n; ++t) {
      plain.d.push_back(u(rng));
      plain.e.push_back(u(rng));
      graded.d.push_back(std::pow(0.7, t) * u(rng));  // down to 1e-19 at n = 120
      graded.e.push_back(std::pow(0.7, t) * u(rng));
    }
    cases.push_back(plain);
    cases.push_back(graded);
    if (n < 3) continue;
    Case zeros = plain;  // exact zeros on both diagonals: exact zero singular values, and splits
    zeros.name = "zeros n=" + std::to_string(n);
    zeros.d[static_cast<std::size_t>(n / 2)] = 0.0;
    if (n > 2) zeros.e[1] = 0.0;
    zeros.d.back() = 0.0;
    cases.push_back(zeros);
  }
  for (const Case& c : cases) {
    const std::vector<double> ref = jacobi_bidiagonal(c.d, c.e);
    const double tol = bound(static_cast<Eigen::Index>(c.d.size()), 1, ref.front());
    std::vector<double> qr;
    detail::bidiagonal_values_tridiagonal(c.d, c.e, qr);
    std::vector<double> dqds;
    ASSERT_TRUE(detail::bidiagonal_values_dqds(c.d, c.e, dqds)) << c.name;
    qr = sorted(qr), dqds = sorted(dqds);
    ASSERT_EQ(qr.size(), ref.size()) << c.name;
    ASSERT_EQ(dqds.size(), ref.size()) << c.name;
    for (std::size_t t = 0; t < ref.size(); ++t) {
      EXPECT_NEAR(qr[t], ref[t], tol) << c.name << " tridiagonal QR, value " << t;
      EXPECT_NEAR(dqds[t], ref[t], tol) << c.name << " dqds, value " << t;
    }
  }
}

MatD with_ones(const MatD& x) {
  MatD out(x.rows(), x.cols() + 1);
  out << x, MatD::Ones(x.rows(), 1);
  return out;
}

void expect_values_close(const std::vector<double>& got, const MatD& x, const std::string& what) {
  if (x.cols() == 0) {  // (JacobiSVD does not take an empty matrix)
    EXPECT_TRUE(got.empty()) << what;
    return;
  }
  const VecD ref = Eigen::JacobiSVD<MatD>(x).singularValues();
  ASSERT_EQ(static_cast<Eigen::Index>(got.size()), ref.size()) << what;
  const double tol = bound(x.rows(), x.cols(), ref.size() > 0 ? ref(0) : 0.0);
  for (Eigen::Index t = 0; t < ref.size(); ++t) {
    EXPECT_NEAR(got[static_cast<std::size_t>(t)], ref(t), tol) << what << " value " << t;
  }
}

// The pair from one QR of [x, 1] (tall x) and from two separate reductions (other shapes): each
// against Jacobi on its own matrix, keys of real scale and far from it, centred columns (where
// the ones column is orthogonal to x) and a column that is itself constant (rank-deficient [x, 1]).
TEST(SingularValues, WithOnesGivesTheValuesOfBothMatrices) {
  const std::pair<int, int> shapes[] = {{197, 64}, {197, 32}, {40, 3}, {10, 0}, {5, 4}, {64, 64}, {3, 7}};
  unsigned seed = 31;
  for (const auto& [r, c] : shapes) {
    const MatD x = test::random_matrix(r, c, seed++);
    const std::string name = std::to_string(r) + "x" + std::to_string(c);
    for (const double m : {1.0, 1e50, 1e-50, 1e-300, 1e300}) {  // the extremes: each on its own
      const MatD xm = x * m;
      const SingularPair both = singular_values_with_ones(xm);
      expect_values_close(both.x, xm, name + " x" + std::to_string(m));
      expect_values_close(both.with_ones, with_ones(xm), name + " [x, 1]" + std::to_string(m));
    }
    if (c < 2) continue;
    MatD centred = x.rowwise() - x.colwise().mean();
    centred.col(1).setConstant(3.0);  // [x, 1] loses a rank
    const SingularPair both = singular_values_with_ones(centred);
    expect_values_close(both.x, centred, name + " centred");
    expect_values_close(both.with_ones, with_ones(centred), name + " centred [x, 1]");
    if (r > c) {
      EXPECT_LT(both.with_ones.back(), bound(r, c + 1, both.with_ones.front())) << name;
    }
  }
  MatD bad = test::random_matrix(100, 4, 3);
  bad(7, 2) = std::numeric_limits<double>::quiet_NaN();
  const SingularPair nan = singular_values_with_ones(bad);
  ASSERT_EQ(nan.x.size(), 4U);
  ASSERT_EQ(nan.with_ones.size(), 5U);
  for (const double s : nan.x) EXPECT_TRUE(std::isnan(s));
  for (const double s : nan.with_ones) EXPECT_TRUE(std::isnan(s));
}

TEST(SingularValues, ZeroEmptyAndNonFinite) {
  EXPECT_TRUE(singular_values(MatD(0, 4)).empty());
  EXPECT_EQ(singular_values(MatD::Zero(3, 5)), std::vector<double>(3, 0.0));
  MatD x = test::random_matrix(4, 4, 9);
  x(2, 1) = std::numeric_limits<double>::quiet_NaN();
  for (const double s : singular_values(x)) EXPECT_TRUE(std::isnan(s));
  x(2, 1) = std::numeric_limits<double>::infinity();
  for (const double s : singular_values(x)) EXPECT_TRUE(std::isnan(s));
}

}  // namespace
}  // namespace attnscope
