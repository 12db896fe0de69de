// Brute-force sinks of one head: ExactRows' double rows, then key by key a plain loop over the
// rows for the received mean and the every-query test. For tests and benchmarks.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/sinks.hpp"

namespace attnscope::analyses {

HeadSinks head_sinks_reference(const Variant& v, const MatF& q, const MatF& k, double scale,
                               double threshold) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens();
  MatD w(n, n);
  for (int i = 0; i < n; ++i) rows.row(i, w.row(i).data());
  HeadSinks out;
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) ++out.degenerate;
  }
  out.valid_rows = n - out.degenerate;
  out.received.assign(static_cast<std::size_t>(n), 0.0);
  if (out.valid_rows == 0) return out;
  for (int j = 0; j < n; ++j) {
    double sum = 0.0;
    bool every = true;
    for (int i = 0; i < n; ++i) {
      if (rows.degenerate(i)) continue;
      sum += w(i, j);
      if (!(w(i, j) > threshold)) every = false;
    }
    out.received[static_cast<std::size_t>(j)] = sum / out.valid_rows;
    if (every) out.sink_keys.push_back(j);
  }
  return out;
}

}  // namespace attnscope::analyses
