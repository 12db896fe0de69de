// The CUDA paths of the per-head analyses (cuda_paths.hpp). The host side prepares what the
// kernels take from the family registry (features and row forms, through ExactRows, so that the
// GPU's rows and the exact judge's rows share every input) and the margins; the kernels are in
// lib/cuda/. The margin helpers and the judging of candidates are plain host code.
#include "attnscope/analyses/cuda_paths.hpp"

#include "attnscope/analyses/masking.hpp"
#include "attnscope/candidate_margin.hpp"
#include "attnscope/portable_math.hpp"
#include "attnscope/error.hpp"
#include "confusion_search.hpp"

#ifdef ATTNSCOPE_HAVE_CUDA
#include "confusion_candidates.cuh"
#include "local_mass.cuh"
#include "weights.cuh"
#endif

#include <algorithm>
#include <cmath>
#include <exception>
#include <map>
#include <memory>

namespace attnscope::analyses {

namespace {

/// Norms computed in double err by a few units of 2^-53; this covers them with room to spare.
constexpr double kNormSlack = 1.0 + 1e-12;

/// |x|_2 without underflow or overflow of the squares (Eigen's stableNorm scales by the largest
/// entry): features of 1e-300 would square to 0, and the row bound built on that norm would be 0,
/// a bound that any rounding difference between the two sides exceeds.
template <typename X>
double robust_norm(const X& x) {
  return x.stableNorm();
}

}  // namespace

void softmax_row_bounds(const MatF& q, const MatF& k, double scale, double* out) {
  double k_max = 0.0;
  for (Eigen::Index j = 0; j < k.rows(); ++j) k_max = std::max(k_max, k.row(j).cast<double>().norm());
  const auto n = static_cast<int>(k.rows());
  const auto d = static_cast<int>(q.cols());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const double logit_bound = std::abs(scale) * q.row(i).cast<double>().norm() * k_max * kNormSlack;
    out[i] = margin::row_bound_softmax(logit_bound, n, d);
  }
}

std::vector<double> candidate_row_bounds(const ExactRows& rows, const MatF& q, const MatF& k, double scale) {
  const int n = rows.tokens();
  std::vector<double> bound(static_cast<std::size_t>(n), 0.0);
  if (rows.variant().form() == Form::Score) {
    softmax_row_bounds(q, k, scale, bound.data());
    return bound;
  }
  const double fk_frobenius = robust_norm(rows.phi_k()) * kNormSlack;
  const auto r = static_cast<int>(rows.phi_q().cols());
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) continue;
    bound[static_cast<std::size_t>(i)] =
        margin::row_bound_kernel(rows.row_coefficient(i), rows.row_offset(i), robust_norm(rows.phi_q().row(i)) * kNormSlack,
                                 fk_frobenius, n, r);
  }
  return bound;
}

std::vector<std::pair<int, int>> candidate_pairs_host(const MatD& w, const std::vector<double>& row_bound,
                                                      const ExactRows& rows, double eps) {
  const int n = rows.tokens();
  if (w.rows() != n || w.cols() != n || row_bound.size() != static_cast<std::size_t>(n)) {
    throw UsageError("candidate_pairs_host: rows, bounds and head disagree in size");
  }
  const MatD gram = w * w.transpose();
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) continue;
    for (int j = i + 1; j < n; ++j) {
      if (rows.degenerate(j)) continue;
      if (margin::is_candidate(eps, gram(i, i), gram(j, j), gram(i, j), row_bound[static_cast<std::size_t>(i)],
                               row_bound[static_cast<std::size_t>(j)], n)) {
        out.emplace_back(i, j);
      }
    }
  }
  return out;
}

HeadConfusion judge_candidates(const ExactRows& rows, const MatF& q_raw,
                               const ConfusionOptions& opt,
                               const std::vector<std::pair<int, int>>& candidates,
                               const ExcludedTokens* excluded) {
  thread_local detail::PairJudge judge;
  auto row = [&rows](int i, double* out) { rows.row(i, out); };
  judge.reset(rows.tokens(), rows.tokens(), q_raw, opt, row, excluded);
  HeadConfusion out;
  for (const auto& [i, j] : candidates) {
    if (i < 0 || j <= i || j >= rows.tokens()) {
      throw UsageError("judge_candidates: pair (" + std::to_string(i) + ", " + std::to_string(j) +
                       ") is not i < j < " + std::to_string(rows.tokens()));
    }
    if (rows.degenerate(i) || rows.degenerate(j) || judge.excluded(i) || judge.excluded(j)) {
      continue;
    }
    ++out.candidates;
    if (judge.confused(i, j)) ++out.pairs;
  }
  out.degenerate_rows = rows.degenerate_count();
  out.degenerate_pairs = detail::count_degenerate_pairs(rows, q_raw, opt.query_eps, judge);
  return out;
}

#ifdef ATTNSCOPE_HAVE_CUDA

namespace {

std::vector<unsigned char> degenerate_flags(const ExactRows& rows) {
  std::vector<unsigned char> flags(static_cast<std::size_t>(rows.tokens()));
  for (int i = 0; i < rows.tokens(); ++i) flags[static_cast<std::size_t>(i)] = rows.degenerate(i) ? 1 : 0;
  return flags;
}

/// The head's rows on the device, from the same inputs as ExactRows's: softmax from q and k as
/// they are (widened on the device), the kernel form from ExactRows's features and row forms.
cuda::DeviceRows device_rows(const ExactRows& rows, const MatF& q, const MatF& k, double scale,
                             const std::vector<unsigned char>& flags) {
  cuda::Context& ctx = cuda::this_thread_context();
  const int n = rows.tokens();
  if (rows.variant().form() == Form::Score) {
    return cuda::softmax_rows(ctx, q.data(), k.data(), 1, n, static_cast<int>(q.cols()), scale);
  }
  std::vector<double> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    a[static_cast<std::size_t>(i)] = rows.row_coefficient(i);
    b[static_cast<std::size_t>(i)] = rows.row_offset(i);
  }
  return cuda::kernel_rows(ctx, rows.phi_q().data(), rows.phi_k().data(), a.data(), b.data(), flags.data(), 1, n,
                           static_cast<int>(rows.phi_q().cols()));
}

/// Row forms of the kernel form, as attention.cpp's kernel_rows computes them: from S_i over all
/// keys, or over the kept keys and their count under a mask.
struct RowForms {
  std::vector<double> a, b;
  std::vector<unsigned char> degenerate;
};

RowForms row_forms(const Variant& v, const MatD& fq, const MatD& fk, const Mask* mask) {
  const Eigen::Index n = fq.rows();
  RowForms out;
  out.a.assign(static_cast<std::size_t>(n), 0.0);
  out.b.assign(static_cast<std::size_t>(n), 0.0);
  out.degenerate.assign(static_cast<std::size_t>(n), 0);
  const VecD key_sum = fk.colwise().sum().transpose();
  const double key_sum_norm = key_sum.norm();
  MatD kept_sums;
  if (mask) kept_sums.noalias() = mask->cast<double>().matrix() * fk;
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto qi = fq.row(i);
    const RowForm rn = mask ? kernel_row_form(v, qi.dot(kept_sums.row(i)), static_cast<int>(mask->row(i).count()),
                                              qi.norm() * kept_sums.row(i).norm())
                            : kernel_row_form(v, qi.dot(key_sum.transpose()), static_cast<int>(fk.rows()),
                                              qi.norm() * key_sum_norm);
    const auto r = static_cast<std::size_t>(i);
    out.degenerate[r] = rn.degenerate ? 1 : 0;
    if (!rn.degenerate) out.a[r] = rn.a, out.b[r] = rn.b;
  }
  return out;
}

void check_head(const Variant& v, const MatD& q, const MatD& k, const Mask* mask) {
  std::string why;
  if (!v.supports(&why)) throw UsageError(why);
  if (k.rows() < 1) throw UsageError(v.name() + ": no keys");
  if (q.cols() != k.cols() || q.rows() != k.rows()) {
    throw UsageError(v.name() + ": the GPU path takes q and k of one shape, found " + std::to_string(q.rows()) +
                     " x " + std::to_string(q.cols()) + " and " + std::to_string(k.rows()) + " x " +
                     std::to_string(k.cols()));
  }
  if (mask && (mask->rows() != q.rows() || mask->cols() != k.rows())) {
    throw UsageError(v.name() + ": mask is " + std::to_string(mask->rows()) + " x " + std::to_string(mask->cols()) +
                     ", expected " + std::to_string(q.rows()) + " x " + std::to_string(k.rows()));
  }
}

/// The head's weights on the device (left in the thread's context); degenerate rows listed.
cuda::DeviceRows device_weights(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
                                std::vector<int>& degenerate) {
  check_head(v, q, k, mask);
  cuda::Context& ctx = cuda::this_thread_context();
  const int n = static_cast<int>(q.rows());
  std::vector<unsigned char> kept;
  if (mask) {
    kept.resize(static_cast<std::size_t>(n) * static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) kept[static_cast<std::size_t>(i) * n + j] = (*mask)(i, j) ? 1 : 0;
    }
  }
  degenerate.clear();
  if (v.form() == Form::Score) {
    for (int i = 0; mask && i < n; ++i) {
      if (!mask->row(i).any()) degenerate.push_back(i);
    }
    return cuda::softmax_rows(ctx, q.data(), k.data(), mask ? kept.data() : nullptr, 1, n, static_cast<int>(q.cols()),
                              scale);
  }
  const KernelFeatures f = kernel_features(v, q, k, scale);
  const RowForms rf =
      row_forms(v, f.norm_q(), f.norm_k(), mask);  // S_i from g where the family has its own
  for (int i = 0; i < n; ++i) {
    if (rf.degenerate[static_cast<std::size_t>(i)]) degenerate.push_back(i);
  }
  return cuda::kernel_rows(ctx, f.q.data(), f.k.data(), rf.a.data(), rf.b.data(), rf.degenerate.data(), 1, n,
                           static_cast<int>(f.q.cols()), mask ? kept.data() : nullptr);
}

template <typename Derived>
void require_finite(const Eigen::DenseBase<Derived>& x, const Variant& v, const char* what) {
  if (!x.allFinite()) {
    throw NumericalError(v.name() + ": " + what + " overflow double (inputs too large in magnitude)");
  }
}

}  // namespace

MatD attention_weights_cuda(const Variant& v, const MatD& q, const MatD& k, double scale, const Mask* mask,
                            Diagnostics* diag) {
  std::vector<int> degenerate;
  const cuda::DeviceRows dr = device_weights(v, q, k, scale, mask, degenerate);
  MatD w(q.rows(), k.rows());
  cuda::download_rows(cuda::this_thread_context(), dr, w.data());
  require_finite(w, v, "attention weights");
  if (diag) diag->degenerate_rows = std::move(degenerate);
  return w;
}

MaskCell mask_head_cuda(const Variant& v, const MatD& q, const MatD& k, const MatD& values, double scale,
                        const Mask& mask) {
  cuda::Context& ctx = cuda::this_thread_context();
  const auto dv = static_cast<int>(values.cols());
  Diagnostics plain, masked;
  const cuda::DeviceRows dr = device_weights(v, q, k, scale, nullptr, plain.degenerate_rows);
  MatD w(q.rows(), k.rows()), o(q.rows(), values.cols()), o_masked(q.rows(), values.cols());
  cuda::download_rows(ctx, dr, w.data());
  require_finite(w, v, "attention weights");
  cuda::outputs(ctx, dr, values.data(), dv, o.data());
  const cuda::DeviceRows dm = device_weights(v, q, k, scale, &mask, masked.degenerate_rows);
  cuda::outputs(ctx, dm, values.data(), dv, o_masked.data());
  require_finite(o_masked, v, "attention outputs");
  return mask_statistics(w, o, o_masked, plain, masked, mask);
}

MatD confusion_rows_cuda(const ExactRows& rows, const MatF& q, const MatF& k, double scale) {
  const std::vector<unsigned char> flags = degenerate_flags(rows);
  const cuda::DeviceRows dr = device_rows(rows, q, k, scale, flags);
  MatD w(rows.tokens(), rows.tokens());
  cuda::download_rows(cuda::this_thread_context(), dr, w.data());
  return w;
}

namespace {

/// The heads of one launch, all of one shape: each one's exact rows and bounds, and the device
/// inputs concatenated head after head.
std::vector<HeadConfusion> launch(const Variant& v, const std::vector<HeadInput>& heads,
                                  const std::vector<std::size_t>& members, double scale, const ConfusionOptions& opt) {
  const auto batch = static_cast<int>(members.size());
  const HeadInput& first = heads[members.front()];
  const int n = static_cast<int>(first.k->rows());
  const auto per_head = static_cast<std::size_t>(n);
  const bool softmax = v.form() == Form::Score;
  const auto d = static_cast<std::size_t>(first.q->cols());
  cuda::Context& ctx = cuda::this_thread_context();
  // Softmax heads need no ExactRows before their candidates are known (the bounds come from q and
  // k, the inputs go straight into pinned memory); the kernel form's features do.
  std::vector<std::unique_ptr<ExactRows>> rows(members.size());
  std::vector<double> bound(per_head * members.size());
  std::vector<unsigned char> flags(per_head * members.size(), 0);
  float* pinned = softmax && n >= 2 ? cuda::softmax_inputs(ctx, batch, n, static_cast<int>(d)) : nullptr;
  const std::size_t in = per_head * d * members.size();
  // Each head's checks (ExactRows's, in its order), bounds, flags and inputs, on the OpenMP
  // threads; the error of the first head in order that fails is the one rethrown.
  std::vector<std::exception_ptr> errors(members.size());
#pragma omp parallel for schedule(dynamic)
  for (std::size_t m = 0; m < members.size(); ++m) {
    try {
      const HeadInput& h = heads[members[m]];
      if (softmax) {
        ExactRows::validate(v, *h.q, *h.k, scale);
      } else {
        rows[m] = std::make_unique<ExactRows>(v, *h.q, *h.k, scale);
      }
      if (n < 2) continue;
      double* b = bound.data() + m * per_head;
      if (softmax) {
        softmax_row_bounds(*h.q, *h.k, scale, b);
        std::copy_n(h.q->data(), per_head * d, pinned + m * per_head * d);
        std::copy_n(h.k->data(), per_head * d, pinned + in + m * per_head * d);
      } else {
        const std::vector<double> rb = candidate_row_bounds(*rows[m], *h.q, *h.k, scale);
        std::copy(rb.begin(), rb.end(), b);
        const std::vector<unsigned char> f = degenerate_flags(*rows[m]);
        std::copy(f.begin(), f.end(), flags.begin() + static_cast<std::ptrdiff_t>(m * per_head));
      }
    } catch (...) {
      errors[m] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  std::vector<std::vector<std::pair<int, int>>> candidates(members.size());
  if (n >= 2) {
    cuda::DeviceRows dr;
    if (softmax) {
      dr = cuda::softmax_rows_pinned(ctx, batch, n, static_cast<int>(d), scale);
    } else {
      const auto r = static_cast<std::size_t>(rows.front()->phi_q().cols());
      std::vector<double> fq(per_head * r * members.size()), fk(fq.size()), a(per_head * members.size()), b(a.size());
      for (std::size_t m = 0; m < members.size(); ++m) {
        std::copy_n(rows[m]->phi_q().data(), per_head * r, fq.data() + m * per_head * r);
        std::copy_n(rows[m]->phi_k().data(), per_head * r, fk.data() + m * per_head * r);
        for (int i = 0; i < n; ++i) {
          a[m * per_head + static_cast<std::size_t>(i)] = rows[m]->row_coefficient(i);
          b[m * per_head + static_cast<std::size_t>(i)] = rows[m]->row_offset(i);
        }
      }
      dr = cuda::kernel_rows(ctx, fq.data(), fk.data(), a.data(), b.data(), flags.data(), batch, n,
                             static_cast<int>(r));
    }
    candidates = cuda::confusion_candidates(ctx, dr, bound.data(), flags.data(), opt.eps);
  }
  // The judging is the CPU's exact arithmetic, head by head, on the OpenMP threads (each thread
  // its own judge); a softmax head's ExactRows lives only while its candidates are judged. A
  // softmax head without candidates has no degenerate rows (no mask here) and so counts nothing.
  std::vector<HeadConfusion> out(members.size());
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic)
  for (std::size_t m = 0; m < members.size(); ++m) {
    try {
      const HeadInput& h = heads[members[m]];
      if (softmax && candidates[m].empty()) continue;
      if (softmax) {
        const ExactRows head_rows(v, *h.q, *h.k, scale);
        out[m] = judge_candidates(head_rows, *h.q_raw, opt, candidates[m], h.excluded);
      } else {
        out[m] = judge_candidates(*rows[m], *h.q_raw, opt, candidates[m], h.excluded);
      }
    } catch (...) {
#pragma omp critical(attnscope_cuda_judge_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  return out;
}

}  // namespace

std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant& v, const std::vector<HeadInput>& heads,
                                                      double scale, const ConfusionOptions& opt) {
  // Heads grouped by shape (N, d), each group cut into launches that fit the device's memory:
  // rows and Gram matrix, 2 N^2 doubles per head, within a quarter of the free memory.
  std::map<std::pair<Eigen::Index, Eigen::Index>, std::vector<std::size_t>> groups;
  for (std::size_t h = 0; h < heads.size(); ++h) {
    if (!heads[h].q || !heads[h].k || !heads[h].q_raw) throw UsageError("count_confusion_cuda_batch: a head is missing");
    groups[{heads[h].k->rows(), heads[h].k->cols()}].push_back(h);
  }
  std::vector<HeadConfusion> out(heads.size());
  for (const auto& [shape, members] : groups) {
    const std::int64_t n = shape.first;
    const int per_launch = margin::heads_per_launch(static_cast<std::int64_t>(members.size()),
                                                    2 * n * n * static_cast<std::int64_t>(sizeof(double)) + 1024,
                                                    cuda::free_memory_bytes() / 4);
    for (std::size_t first = 0; first < members.size(); first += static_cast<std::size_t>(per_launch)) {
      const std::size_t last = std::min(members.size(), first + static_cast<std::size_t>(per_launch));
      const std::vector<std::size_t> part(members.begin() + static_cast<std::ptrdiff_t>(first),
                                          members.begin() + static_cast<std::ptrdiff_t>(last));
      const std::vector<HeadConfusion> got = launch(v, heads, part, scale, opt);
      for (std::size_t m = 0; m < part.size(); ++m) out[part[m]] = got[m];
    }
  }
  return out;
}

HeadConfusion count_confusion_cuda(const Variant& v, const MatF& q, const MatF& q_raw,
                                   const MatF& k, double scale, const ConfusionOptions& opt,
                                   const ExcludedTokens* excluded) {
  return count_confusion_cuda_batch(v, {HeadInput{&q, &q_raw, &k, excluded}}, scale, opt).front();
}

std::vector<double> local_mass_cuda(const Variant& v, const MatF& q, const MatF& k, double scale,
                                    const TokenGrid& grid, int window, int* degenerate) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("--window must be a positive odd number, found " + std::to_string(window));
  }
  if (grid.tokens() != k.rows()) {
    throw UsageError("locality: the grid has " + std::to_string(grid.tokens()) + " tokens but the head has " +
                     std::to_string(k.rows()));
  }
  const ExactRows rows(v, q, k, scale);
  const std::vector<unsigned char> flags = degenerate_flags(rows);
  cuda::WindowLists lists;
  lists.offset.push_back(0);
  for (int i = 0; i < grid.tokens(); ++i) {
    for (int j : grid.window(i, window)) lists.index.push_back(j);
    lists.offset.push_back(static_cast<int>(lists.index.size()));
  }
  const cuda::DeviceRows dr = device_rows(rows, q, k, scale, flags);
  std::vector<double> mass(static_cast<std::size_t>(rows.tokens()));
  cuda::window_mass(cuda::this_thread_context(), dr, lists, flags.data(), mass.data());
  if (degenerate) {
    *degenerate = 0;
    for (int i = grid.prefix; i < grid.tokens(); ++i) *degenerate += rows.degenerate(i) ? 1 : 0;
  }
  return mass;
}

#else

namespace {

[[noreturn]] void no_cuda() {
  throw UsageError("--device cuda: this attnscope was built without CUDA (configure with -DATTNSCOPE_CUDA=AUTO or ON "
                   "where a CUDA toolkit is installed)");
}

}  // namespace

MatD attention_weights_cuda(const Variant&, const MatD&, const MatD&, double, const Mask*, Diagnostics*) { no_cuda(); }

MaskCell mask_head_cuda(const Variant&, const MatD&, const MatD&, const MatD&, double, const Mask&) { no_cuda(); }

MatD confusion_rows_cuda(const ExactRows&, const MatF&, const MatF&, double) { no_cuda(); }

std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant&, const std::vector<HeadInput>&, double,
                                                      const ConfusionOptions&) {
  no_cuda();
}

HeadConfusion count_confusion_cuda(const Variant&, const MatF&, const MatF&, const MatF&, double,
                                   const ConfusionOptions&, const ExcludedTokens*) {
  no_cuda();
}

std::vector<double> local_mass_cuda(const Variant&, const MatF&, const MatF&, double, const TokenGrid&, int, int*) {
  no_cuda();
}

#endif

}  // namespace attnscope::analyses

/// The floating-point model this file's margins assume (portable_math.hpp), checked by the tests.
double attnscope::portable::probe::candidate_margin(double a, double b, double c) { return a * b + c; }
