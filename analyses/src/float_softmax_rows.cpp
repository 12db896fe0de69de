// Float softmax rows of the per-query diagnostics (float_softmax_rows.hpp).
#include "float_softmax_rows.hpp"

#include "attnscope/family.hpp"

#include "confusion_search.hpp"

#include <algorithm>
#include <cmath>

namespace attnscope::analyses::detail {

bool takes_float_softmax(const Variant& v) {
  const ScoreFamily* score = v.score();
  return score != nullptr && score->rows_are_softmax() && v.supports();
}

FloatSoftmaxRows& thread_float_softmax_rows() {
  thread_local FloatSoftmaxRows ws;
  return ws;
}

bool float_softmax_rows(const MatF& q, const MatF& k, double scale, Eigen::Index r0,
                        bool keep_logits, FloatSoftmaxRows& ws) {
  double k_max = 0.0;
  if (!float_rows_fit(q, k, scale, ws.q_norm, k_max)) return false;
  const Eigen::Index d = q.cols(), n = k.rows(), m = q.rows() - r0;
  const double q_max =
      ws.q_norm.empty() ? 0.0 : *std::max_element(ws.q_norm.begin(), ws.q_norm.end());
  ws.delta = logit_error(scale, q_max, k_max, d);
  if (ws.delta > kDiagnosticLogitError) return false;
  ws.e.resize(m, n);
  ws.sum.resize(static_cast<std::size_t>(m));
  if (m == 0 || n == 0) return true;
  ws.keys.pack(k.data(), 1, d, d, n);  // B = k^T: element (t, j) at k[j * d + t]
  portable::gemm_packed(q.data() + r0 * d, d, ws.keys, ws.e.data(), n, m);
  if (keep_logits) ws.y.resize(m, n);
  const auto s = static_cast<float>(scale);
  // The rows' maxima (and logits, the arguments of the exponentials), then their exponentials
  // and sums (softmax_exps: each row's bits exp_floats_sum's, several rows' sums at once).
  ws.top.resize(static_cast<std::size_t>(m));
  portable::softmax_exps(ws.e.data(), n, m, n, s, ws.top.data(), ws.sum.data(), keep_logits ? ws.y.data() : nullptr, n);
  return true;
}

double exp_relative_error(double delta) { return std::expm1(delta) + 0x1.0p-22; }

double relative_weight_error(double delta) {
  const double r = exp_relative_error(delta);
  return 2.0 * r / (1.0 - r);
}

void widen_weights(const MatF& e, const std::vector<double>& sum, MatD& w) {
  w.resize(e.rows(), e.cols());
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    const FloatWeightRow row = weight_row(e, sum, i);
    double* out = w.row(i).data();
    for (Eigen::Index j = 0; j < w.cols(); ++j) out[j] = row(j);
  }
}

bool float_softmax_weights(const MatF& q, const MatF& k, double scale, MatD& w) {
  FloatSoftmaxRows& ws = thread_float_softmax_rows();
  if (!float_softmax_rows(q, k, scale, 0, false, ws)) return false;
  widen_weights(ws.e, ws.sum, w);
  return true;
}

}  // namespace attnscope::analyses::detail
