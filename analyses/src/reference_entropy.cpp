// Brute-force attention entropy: ExactRows' double rows, two plain passes per row, std::log. For
// tests and benchmarks.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/entropy.hpp"

#include <cmath>
#include <limits>

namespace attnscope::analyses {

EntropyRows attention_entropy_reference(const Variant& v, const MatF& q, const MatF& k,
                                        double scale, const EntropyOptions& opt) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens();
  EntropyRows out;
  out.entropy.assign(static_cast<std::size_t>(n), std::numeric_limits<double>::quiet_NaN());
  out.negative_mass = out.entropy;
  VecD w(n);
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) {
      ++out.degenerate;
      continue;
    }
    rows.row(i, w.data());
    bool any_negative = false;
    double total_abs = 0.0, negative = 0.0;
    for (int j = 0; j < n; ++j) {
      if (w(j) < 0.0) {
        any_negative = true;
        negative += -w(j);
      }
      total_abs += std::fabs(w(j));
    }
    double h = 0.0;
    for (int j = 0; j < n; ++j) {
      const double p = any_negative ? std::fabs(w(j)) / total_abs : w(j);
      if (p > 0.0) h += -p * std::log(p + opt.log_eps);
    }
    out.entropy[static_cast<std::size_t>(i)] = h;
    out.negative_mass[static_cast<std::size_t>(i)] = negative;
    if (any_negative) ++out.negative_rows;
  }
  const double log_n = max_entropy(n);
  out.normalised = out.entropy;
  for (double& h : out.normalised) {
    if (!std::isnan(h)) h = log_n > 0.0 ? h / log_n : 0.0;
  }
  return out;
}

}  // namespace attnscope::analyses
