// Brute-force confusion count: every pair of every row, with the arithmetic that defines the count
// (ExactRows, squared_distance). Quadratic memory, cubic time: for tests and benchmarks.
#include "attnscope/analyses/confusion.hpp"

#include "attnscope/error.hpp"

#include <string>

namespace attnscope::analyses {

HeadConfusion count_confusion_reference(const Variant& v, const MatF& q, const MatF& q_raw,
                                        const MatF& k, double scale, const ConfusionOptions& opt,
                                        const ExcludedTokens* excluded,
                                        std::vector<std::pair<int, int>>* pairs) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens();
  const bool filtered = excluded != nullptr && !excluded->empty();
  if (filtered && excluded->size() != static_cast<std::size_t>(n)) {
    throw UsageError("confusion: the excluded tokens (" + std::to_string(excluded->size()) +
                     ") do not match the head's " + std::to_string(n) + " queries");
  }
  auto left_out = [&](int i) { return filtered && (*excluded)[static_cast<std::size_t>(i)] != 0; };
  const int d = static_cast<int>(q_raw.cols());
  MatD w(n, n);
  for (int i = 0; i < n; ++i) rows.row(i, w.row(i).data());
  const MatD qr = q_raw.cast<double>();
  const double eps2 = opt.eps * opt.eps, query_eps2 = opt.query_eps * opt.query_eps;
  HeadConfusion out;
  if (pairs != nullptr) pairs->clear();
  out.degenerate_rows = rows.degenerate_count();
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (left_out(i) || left_out(j)) continue;  // a pair with an excluded token: never counted
      const int degenerate = (rows.degenerate(i) ? 1 : 0) + (rows.degenerate(j) ? 1 : 0);
      if (degenerate == 1) continue;  // one zero row and one ordinary row: never counted
      if (degenerate == 0) ++out.candidates;
      // Degenerate rows are written as zeros: two of them are as close as guarded code makes them.
      const bool near = squared_distance(w.row(i).data(), w.row(j).data(), n) <= eps2;
      const bool differ = squared_distance(qr.row(i).data(), qr.row(j).data(), d) > query_eps2;
      if (!(near && differ)) continue;
      ++(degenerate == 2 ? out.degenerate_pairs : out.pairs);
      if (pairs != nullptr && degenerate == 0) pairs->emplace_back(i, j);
    }
  }
  return out;
}

}  // namespace attnscope::analyses
