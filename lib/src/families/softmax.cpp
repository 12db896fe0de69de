// softmax: exp(s q_i.k_j) / sum_m exp(s q_i.k_m), the same in both conventions (s is the model's
// scale, normally d^-1/2). The score form: no features, no linear-time output, no low-rank form.
// Its rows (explicit, exact, float) are in softmax.hpp, defined here.
#include "attnscope/softmax.hpp"

#include "attnscope/attention_heads.hpp"
#include "attnscope/family.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/variant.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attnscope {
namespace {

class Softmax final : public ScoreFamily {
 public:
  std::string_view name() const override { return "softmax"; }
  std::string_view formula() const override {
    return "exp(s q_i.k_j) / sum_m exp(s q_i.k_m)   (Vaswani et al. 2017; InLine eq. 1)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  std::vector<MagnitudeLaw> magnitude_laws() const override { return {MagnitudeLaw::SoftmaxPower}; }
  void rows(Eigen::Ref<MatD> w, Eigen::Index r0, double scale, const Mask* mask,
            std::vector<int>& degenerate) const override {
    softmax_rows(w, r0, scale, mask, degenerate);
  }
  void exact_row(const double* qi, const double* k, int n, int d, double scale,
                 double* out) const override {
    softmax_exact_row(qi, k, n, d, scale, out);
  }
  void transpose_keys(const MatF& k, MatD& kt) const override { attnscope::transpose_keys(k, kt); }
  void exact_row_t(const double* qi, const double* kt, int n, int d, double scale,
                   double* out) const override {
    softmax_exact_row_t(qi, kt, n, d, scale, out);
  }
  void rows_float(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale,
                  MatF& w) const override {
    softmax_rows_float(q, k, scale, w);
  }
  void rows_float_factored(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& e,
                           std::vector<float>& row_factor) const override {
    softmax_rows_float_factored(q, k, scale, e, row_factor);
  }
  void head_outputs(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                    Eigen::Index ldk, const double* v, Eigen::Index ldv, Eigen::Index n,
                    Eigen::Index d, Eigen::Index dv, double scale, const Mask* mask, double* out,
                    Eigen::Index ldo, std::vector<int>* degenerate) const override {
    softmax_head_outputs(q, ldq, rows, k, ldk, v, ldv, n, d, dv, scale, mask, out, ldo, degenerate);
  }
  bool head_outputs_float(const double* q, Eigen::Index ldq, Eigen::Index rows, const double* k,
                          Eigen::Index ldk, const double* v, Eigen::Index ldv, Eigen::Index n,
                          Eigen::Index d, Eigen::Index dv, double scale, double* out,
                          Eigen::Index ldo) const override {
    return softmax_head_outputs_float(q, ldq, rows, k, ldk, v, ldv, n, d, dv, scale, out, ldo);
  }
  bool rows_are_softmax() const override { return true; }
};

double dot(const double* a, const double* b, int n) {
  double s = 0.0;
  for (int t = 0; t < n; ++t) s += a[t] * b[t];
  return s;
}

}  // namespace

const AttentionFamily& family_softmax() {
  static const Softmax family;
  return family;
}

void softmax_rows(Eigen::Ref<MatD> w, Eigen::Index r0, double scale, const Mask* mask,
                  std::vector<int>& degenerate) {
  constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
  w *= scale;
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    auto row = w.row(i).array();
    if (mask) row = mask->row(r0 + i).select(row, kMinusInf);
    const double top = row.maxCoeff();
    if (top == kMinusInf) {  // the mask keeps no key
      row.setZero();
      degenerate.push_back(static_cast<int>(r0 + i));
      continue;
    }
    for (Eigen::Index t = 0; t < row.size(); ++t) row(t) = portable::exp(row(t) - top);  // exp(-inf) = 0
    row /= row.sum();
  }
}

void softmax_exact_row(const double* qi, const double* k, int n, int d, double scale, double* out) {
  // Four keys at a time: four independent sums, each still accumulated in index order exactly as
  // dot() does, so the logits are dot()'s without waiting on one chain of dependent additions.
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    const double* k0 = k + static_cast<std::ptrdiff_t>(j) * d;
    const double *k1 = k0 + d, *k2 = k1 + d, *k3 = k2 + d;
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    for (int t = 0; t < d; ++t) {
      const double a = qi[t];
      s0 += a * k0[t];
      s1 += a * k1[t];
      s2 += a * k2[t];
      s3 += a * k3[t];
    }
    out[j] = scale * s0;
    out[j + 1] = scale * s1;
    out[j + 2] = scale * s2;
    out[j + 3] = scale * s3;
  }
  for (; j < n; ++j) out[j] = scale * dot(qi, k + static_cast<std::ptrdiff_t>(j) * d, d);
  double max_logit = -HUGE_VAL;
  for (int t = 0; t < n; ++t) max_logit = std::max(max_logit, out[t]);
  double sum = 0.0;
  for (int t = 0; t < n; ++t) sum += (out[t] = portable::exp(out[t] - max_logit));
  for (int t = 0; t < n; ++t) out[t] /= sum;
}

void transpose_keys(const MatF& k, MatD& kt) {
  const Eigen::Index n = k.rows(), d = k.cols();
  kt.resize(d, n);
  portable::transpose(k.data(), d, n, d, kt.data(), n);
}

void softmax_exact_row_t(const double* qi, const double* kt, int n, int d, double scale, double* out) {
  // out[j] runs through softmax_exact_row's sum for key j: 0, then + qi[t] * k_j[t] for t = 0, 1,
  // ... (a rounded product, then a rounded sum: the build never contracts them).
  std::fill_n(out, n, 0.0);
  for (int t = 0; t < d; ++t) {
    const double a = qi[t];
    const double* kr = kt + static_cast<std::ptrdiff_t>(t) * n;
    for (int j = 0; j < n; ++j) out[j] += a * kr[j];
  }
  for (int j = 0; j < n; ++j) out[j] = scale * out[j];
  double max_logit = -HUGE_VAL;
  for (int t = 0; t < n; ++t) max_logit = std::max(max_logit, out[t]);
  portable::exp_doubles(out, n, max_logit);  // portable::exp(out[t] - max_logit), the same bits
  double sum = 0.0;
  for (int t = 0; t < n; ++t) sum += out[t];
  for (int t = 0; t < n; ++t) out[t] /= sum;
}

void softmax_rows_float_factored(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& e,
                                 std::vector<float>& row_factor) {
  e.resize(q.rows(), k.rows());
  const Eigen::Index n = e.cols(), d = q.cols();
  // k^T packed once per head for the packed product's larger register tile (12 x 2 vectors on
  // AVX-512): the same chain of fused steps per entry as gemm_nt, so the same bits, about 1.3x
  // faster (bench_portable: BM_GemmNtDeit against BM_GemmPacked/64/197).
  thread_local portable::PackedMatrix<float> keys;
  keys.pack(k.data(), 1, k.outerStride(), d, n);  // B = k^T: element (t, j) at k[j * stride + t]
  portable::gemm_packed(q.data(), q.outerStride(), keys, e.data(), n, q.rows());
  const auto s = static_cast<float>(scale);
  // The rows' maxima, then their exponentials and sums (softmax_exps: each row's bits
  // exp_floats_sum's, several rows' sums at once).
  thread_local std::vector<float> tops;
  thread_local std::vector<double> sums;
  tops.resize(static_cast<std::size_t>(e.rows()));
  sums.resize(static_cast<std::size_t>(e.rows()));
  portable::softmax_exps(e.data(), n, e.rows(), n, s, tops.data(), sums.data());
  // The factor is the sum's rounded reciprocal, not a division per entry (a vector division costs
  // about ten multiplications): within 1.5 u of the quotient, inside the float rows' 16 u budget
  // (confusion_softmax.cpp's margin argument).
  row_factor.resize(static_cast<std::size_t>(e.rows()));
  for (Eigen::Index i = 0; i < e.rows(); ++i) {
    row_factor[static_cast<std::size_t>(i)] = 1.0F / static_cast<float>(sums[static_cast<std::size_t>(i)]);
  }
}

void softmax_rows_float(Eigen::Ref<const MatF> q, Eigen::Ref<const MatF> k, double scale, MatF& w) {
  thread_local std::vector<float> factor;
  softmax_rows_float_factored(q, k, scale, w, factor);
  for (Eigen::Index i = 0; i < w.rows(); ++i) {
    const float f = factor[static_cast<std::size_t>(i)];
    float* row = w.row(i).data();
    for (Eigen::Index t = 0; t < w.cols(); ++t) row[t] *= f;
  }
}

}  // namespace attnscope
