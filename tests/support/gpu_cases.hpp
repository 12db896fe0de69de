// Heads on which the GPU paths must give what the CPU gives: awkward sizes, a pair planted
// exactly at the eps threshold, same and scaled raw queries, degenerate (ReLU-killed) rows,
// identical keys and huge magnitudes, for every family of the registry. Shared by the GPU tests
// (tests/cuda/) and the host emulation of the GPU's filter (tests/unit/test_candidate_margin.cpp).
// Also the host's model of the GPU's rows: what the kernels compute, in another summation order.
#pragma once

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/candidate_margin.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "variant_specs.hpp"

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

namespace attnscope::test {

struct HeadCase {
  std::string label;  ///< what the case is, with variant, N, d and seed
  Variant variant;
  MatF q, k;
  double scale = 1.0;
  double eps = 1e-3;
};

inline MatF normal_f(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed, double mean = 0.0) {
  return random_matrix(rows, cols, seed, mean).cast<float>();
}

/// The smallest eps whose square (as the judge computes eps * eps) reaches `d2`: the pair at
/// squared distance d2 is then confused, and would not be with the next smaller double.
inline double eps_at(double d2) {
  double e = std::sqrt(d2);
  while (e * e < d2) e = std::nextafter(e, HUGE_VAL);
  while (e > 0.0 && std::nextafter(e, 0.0) * std::nextafter(e, 0.0) >= d2) e = std::nextafter(e, 0.0);
  return e;
}

inline std::string case_label(const std::string& what, const Variant& v, Eigen::Index n, Eigen::Index d,
                              std::uint64_t seed) {
  std::ostringstream os;
  os << what << " variant=" << v.name() << " N=" << n << " d=" << d << " seed=" << seed;
  return os.str();
}

/// Pairs (2p, 2p+1), p < pairs, planted as q_{2p+1} = q_{2p} + t dir, then eps set exactly at
/// pair 0's exact distance (analyses::eps_at): pair 0 sits on the threshold, the others on
/// either side of it. Query 2 pairs repeats the last query when there is room (same raw query).
inline HeadCase planted_case(const std::string& spec, int n, int d, std::uint64_t seed, int pairs = 4) {
  const Variant v = parse_variant(spec, Convention::Paper, seed);
  const double mean = input_mean(v);
  HeadCase c{case_label("planted at the threshold", v, n, d, seed), v, normal_f(n, d, seed, mean),
             normal_f(n, d, seed + 1, mean), 1.0 / std::sqrt(static_cast<double>(d)), 1e-3};
  const MatF dir = normal_f(1, d, seed + 2);
  const int planted = std::min(pairs, n / 2);
  for (int p = 0; p < planted; ++p) {
    c.q.row(2 * p + 1) = (c.q.row(2 * p).cast<double>() + 2e-3 * dir.cast<double>()).cast<float>();
  }
  if (2 * planted + 1 < n) c.q.row(2 * planted) = c.q.row(n - 1);
  if (planted > 0) {
    try {
      const analyses::ExactRows rows(v, c.q, c.k, c.scale);
      if (!rows.degenerate(0) && !rows.degenerate(1)) {
        const VecD a = rows.row(0), b = rows.row(1);
        const double d2 = analyses::squared_distance(a.data(), b.data(), n);
        if (d2 > 0.0) c.eps = eps_at(d2);
      }
    } catch (const NumericalError&) {
      // The head is out of range for this family: both paths must say so; eps stays.
    }
  }
  return c;
}

/// Every family's variants at the planted sizes, awkward sizes for a few, and the special heads.
inline std::vector<HeadCase> gpu_cases() {
  std::vector<HeadCase> out;
  std::uint64_t seed = 700;
  for (const std::string& spec : all_variant_specs()) {
    for (auto [n, d] : {std::pair{50, 7}, {197, 64}}) out.push_back(planted_case(spec, n, d, ++seed));
  }
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala", "cosformer"}) {
    for (auto [n, d] : {std::pair{1, 1}, {2, 1}, {63, 60}, {3, 7}}) out.push_back(planted_case(spec, n, d, ++seed));
  }
  for (const char* spec : {"softmax", "linear:relu", "linear:elu1", "inline", "mala"}) {
    const Variant v = parse_variant(spec, Convention::Paper, 3);
    // Identical keys: every pair of distinct queries is confused.
    out.push_back({case_label("identical keys", v, 50, 7, 3), v, normal_f(50, 7, 3), normal_f(1, 7, 4).replicate(50, 1),
                   0.4, 1e-3});
    // Huge magnitudes: softmax rows are one-hot (its bounds are infinite: every pair is judged);
    // families whose features would overflow must refuse the head on both paths alike.
    out.push_back({case_label("huge magnitudes", v, 40, 5, 5), v, MatF(normal_f(40, 5, 5) * 1e15f),
                   MatF(normal_f(40, 5, 6) * 1e15f), 1.0, 1e-3});
  }
  // ReLU-killed queries: degenerate rows, two of them with the same raw query.
  for (const char* spec : {"linear:relu", "linear:relu@code", "mala:relu"}) {
    const Variant v = parse_variant(spec);
    const int n = 50, d = 7;
    MatF q = normal_f(n, d, 31);
    const MatF k = normal_f(n, d, 32).cwiseAbs();
    for (int i = 0; i < 6; ++i) q.row(i) = -q.row(i).cwiseAbs() - MatF::Constant(1, d, 0.25f);
    q.row(1) = q.row(0);
    out.push_back({case_label("ReLU-killed queries", v, n, d, 31), v, q, k, 0.3, 1e-3});
  }
  return out;
}

/// The GPU's rows as the kernels compute them, on the host in another summation order (Eigen's
/// products): softmax from q, k widened to double, logits s q.k, max, exp, sum, division; the
/// kernel form from ExactRows's features and row forms. Within candidate_row_bounds of ExactRows.
inline MatD gpu_model_rows(const analyses::ExactRows& rows, const MatF& q, const MatF& k, double scale) {
  const int n = rows.tokens();
  MatD w(n, n);
  if (!rows.variant().linear_time_outputs()) {
    w = scale * (q.cast<double>() * k.cast<double>().transpose());
    for (int i = 0; i < n; ++i) {
      const double m = w.row(i).maxCoeff();
      w.row(i) = (w.row(i).array() - m).exp().matrix();
      w.row(i) /= w.row(i).sum();
    }
    return w;
  }
  w = rows.phi_q() * rows.phi_k().transpose();
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) {
      w.row(i).setZero();
    } else {
      w.row(i) = (rows.row_coefficient(i) * w.row(i).array() + rows.row_offset(i)).matrix();
    }
  }
  return w;
}

}  // namespace attnscope::test
