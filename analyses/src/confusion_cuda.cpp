// Confusion on the GPU (count_confusion_cuda, confusion.hpp; the pieces in confusion_cuda.hpp).
// The host side: the row bounds of candidate_margin.hpp, the heads' inputs for the kernels (the
// rows from ExactRows's inputs, confusion_exact_cuda.hpp), and the exact judging of the
// candidates the GPU proposes (confusion_candidates.cuh), with the judge count_confusion uses.
// The margin helpers and the judging are plain host code, built everywhere.
#include "attnscope/analyses/confusion_cuda.hpp"

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/candidate_margin.hpp"
#include "attnscope/device.hpp"
#include "attnscope/error.hpp"
#include "attnscope/gpu/attention.hpp"
#include "attnscope/portable_math.hpp"
#include "confusion_search.hpp"

#ifdef ATTNSCOPE_HAVE_CUDA
#include "confusion_candidates.cuh"
#include "confusion_exact_cuda.hpp"
#include "weights.cuh"
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>

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
  for (Eigen::Index j = 0; j < k.rows(); ++j)
    k_max = std::max(k_max, k.row(j).cast<double>().norm());
  const auto n = static_cast<int>(k.rows());
  const auto d = static_cast<int>(q.cols());
  for (Eigen::Index i = 0; i < q.rows(); ++i) {
    const double logit_bound =
        std::abs(scale) * q.row(i).cast<double>().norm() * k_max * kNormSlack;
    out[i] = margin::row_bound_softmax(logit_bound, n, d);
  }
}

std::vector<double> candidate_row_bounds(const ExactRows& rows, const MatF& q, const MatF& k,
                                         double scale) {
  const int n = rows.tokens();
  std::vector<double> bound(static_cast<std::size_t>(n), 0.0);
  if (gpu::score_rows_on_gpu(rows.variant())) {
    softmax_row_bounds(q, k, scale, bound.data());
    return bound;
  }
  const double fk_frobenius = robust_norm(rows.phi_k()) * kNormSlack;
  const auto r = static_cast<int>(rows.phi_q().cols());
  for (int i = 0; i < n; ++i) {
    if (rows.degenerate(i)) continue;
    bound[static_cast<std::size_t>(i)] =
        margin::row_bound_kernel(rows.row_coefficient(i), rows.row_offset(i),
                                 robust_norm(rows.phi_q().row(i)) * kNormSlack, fk_frobenius, n, r);
  }
  return bound;
}

std::vector<std::pair<int, int>> candidate_pairs_host(const MatD& w,
                                                      const std::vector<double>& row_bound,
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
      if (margin::is_candidate(eps, gram(i, i), gram(j, j), gram(i, j),
                               row_bound[static_cast<std::size_t>(i)],
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

MatD confusion_rows_cuda(const ExactRows& rows, const MatF& q, const MatF& k, double scale) {
  const std::vector<unsigned char> flags = detail::degenerate_flags(rows);
  const cuda::DeviceRows dr = detail::device_rows(rows, q, k, scale, flags);
  MatD w(rows.tokens(), rows.tokens());
  cuda::download_rows(cuda::this_thread_context(), dr, w.data());
  return w;
}

namespace {

/// The heads of one launch, all of one shape: each one's exact rows and bounds, and the device
/// inputs concatenated head after head.
std::vector<HeadConfusion> launch(const Variant& v, const std::vector<HeadInput>& heads,
                                  const std::vector<std::size_t>& members, double scale,
                                  const ConfusionOptions& opt) {
  const auto batch = static_cast<int>(members.size());
  const HeadInput& first = heads[members.front()];
  const int n = static_cast<int>(first.k->rows());
  const auto per_head = static_cast<std::size_t>(n);
  const bool softmax = gpu::score_rows_on_gpu(v);
  const auto d = static_cast<std::size_t>(first.q->cols());
  cuda::Context& ctx = cuda::this_thread_context();
  // Softmax heads need no ExactRows before their candidates are known (the bounds come from q and
  // k, the inputs go straight into pinned memory); the kernel form's features do.
  std::vector<std::unique_ptr<ExactRows>> rows(members.size());
  std::vector<double> bound(per_head * members.size());
  std::vector<unsigned char> flags(per_head * members.size(), 0);
  float* pinned =
      softmax && n >= 2 ? cuda::softmax_inputs(ctx, batch, n, static_cast<int>(d)) : nullptr;
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
        const std::vector<unsigned char> f = detail::degenerate_flags(*rows[m]);
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
      std::vector<double> fq(per_head * r * members.size()), fk(fq.size()),
          a(per_head * members.size()), b(a.size());
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

std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant& v,
                                                      const std::vector<HeadInput>& heads,
                                                      double scale, const ConfusionOptions& opt) {
  // Heads grouped by shape (N, d), each group cut into launches that fit the device's memory:
  // rows and Gram matrix, 2 N^2 doubles per head, within a quarter of the free memory.
  std::map<std::pair<Eigen::Index, Eigen::Index>, std::vector<std::size_t>> groups;
  for (std::size_t h = 0; h < heads.size(); ++h) {
    if (!heads[h].q || !heads[h].k || !heads[h].q_raw)
      throw UsageError("count_confusion_cuda_batch: a head is missing");
    groups[{heads[h].k->rows(), heads[h].k->cols()}].push_back(h);
  }
  std::vector<HeadConfusion> out(heads.size());
  for (const auto& [shape, members] : groups) {
    const std::int64_t n = shape.first;
    const int per_launch =
        margin::heads_per_launch(static_cast<std::int64_t>(members.size()),
                                 2 * n * n * static_cast<std::int64_t>(sizeof(double)) + 1024,
                                 cuda::free_memory_bytes() / 4);
    for (std::size_t first = 0; first < members.size();
         first += static_cast<std::size_t>(per_launch)) {
      const std::size_t last =
          std::min(members.size(), first + static_cast<std::size_t>(per_launch));
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

#else

MatD confusion_rows_cuda(const ExactRows&, const MatF&, const MatF&, double) {
  refuse_without_cuda();
}

std::vector<HeadConfusion> count_confusion_cuda_batch(const Variant&, const std::vector<HeadInput>&,
                                                      double, const ConfusionOptions&) {
  refuse_without_cuda();
}

HeadConfusion count_confusion_cuda(const Variant&, const MatF&, const MatF&, const MatF&, double,
                                   const ConfusionOptions&, const ExcludedTokens*) {
  refuse_without_cuda();
}

#endif

}  // namespace attnscope::analyses

/// The floating-point model this file's margins assume (portable_math.hpp), checked by the tests.
double attnscope::portable::probe::candidate_margin(double a, double b, double c) {
  return a * b + c;
}
