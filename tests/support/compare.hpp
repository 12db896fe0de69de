// Matrix comparisons whose failure message names the configuration and the worst element.
#pragma once

#include "attnscope/layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace attnscope::test {

/// max |got - want| <= tol * max(1, max |want|), both finite, same shape.
template <typename Got>
::testing::AssertionResult matrices_near(const Got& got_in, const MatD& want, double tol,
                                         const std::string& config) {
  const MatD got = got_in.template cast<double>();
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure() << config << ": shape " << got.rows() << "x" << got.cols()
                                         << ", expected " << want.rows() << "x" << want.cols();
  }
  const double scale = std::max(1.0, want.size() ? want.cwiseAbs().maxCoeff() : 0.0);
  double worst = -1.0;
  Eigen::Index wi = 0, wj = 0;
  for (Eigen::Index i = 0; i < got.rows(); ++i) {
    for (Eigen::Index j = 0; j < got.cols(); ++j) {
      double e = std::abs(got(i, j) - want(i, j));
      if (!std::isfinite(e)) e = std::numeric_limits<double>::infinity();  // NaN or Inf fails
      if (e > worst) {
        worst = e;
        wi = i;
        wj = j;
      }
    }
  }
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  std::ostringstream os;
  os.precision(17);
  os << config << ": worst element (" << wi << ", " << wj << ") got " << got(wi, wj) << " want "
     << want(wi, wj) << ", |diff| " << worst << " > tol " << tol << " x scale " << scale;
  return ::testing::AssertionFailure() << os.str();
}

/// Every row not in `skip` sums to 1 within tol * max(1, sum |w_ij|); rows in `skip` are all 0.
template <typename W>
::testing::AssertionResult rows_sum_to_one(const W& w_in, double tol, const std::string& config,
                                           const std::vector<int>& skip = {}) {
  const MatD w = w_in.template cast<double>();
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    const bool degenerate = std::find(skip.begin(), skip.end(), i) != skip.end();
    const double sum = w.row(i).sum();
    const double target = degenerate ? 0.0 : 1.0;
    const double bound = tol * std::max(1.0, w.row(i).cwiseAbs().sum());
    if (!(std::abs(sum - target) <= bound) || (degenerate && !w.row(i).isZero(0.0))) {
      std::ostringstream os;
      os.precision(17);
      os << config << ": row " << i << (degenerate ? " (degenerate)" : "") << " sums to " << sum
         << ", expected " << target << " within " << bound;
      return ::testing::AssertionFailure() << os.str();
    }
  }
  return ::testing::AssertionSuccess();
}

/// Text of an index list, for messages.
inline std::string list(const std::vector<int>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace attnscope::test
