#include "confusion_candidates.cuh"

#include "attnscope/candidate_margin.hpp"
#include "context.cuh"

#include <cstdint>
#include <vector>

namespace attnscope::cuda {

namespace {

constexpr int kTile = 16;

/// One thread per (i, j) of a 16 x 16 tile, blockIdx.z the head; pairs i < j of non-degenerate
/// rows that pass the filter are counted, and written while the buffer has room (the count is
/// exact either way, so the host can retry with a buffer of the right size).
__global__ void candidates(const double* gram, const double* bound, const unsigned char* degenerate, int n,
                           double eps, margin::CandidatePair* out, unsigned long long capacity,
                           unsigned long long* count) {
  const int i = blockIdx.y * kTile + threadIdx.y;
  const int j = blockIdx.x * kTile + threadIdx.x;
  if (i >= n || j >= n || j <= i) return;
  const int head = blockIdx.z;
  const std::int64_t base = std::int64_t(head) * n;
  if (degenerate && (degenerate[base + i] || degenerate[base + j])) return;
  const double* g = gram + base * n;
  const double n_i = g[std::int64_t(i) * n + i], n_j = g[std::int64_t(j) * n + j];
  const double g_ij = g[std::int64_t(i) * n + j];
  if (!margin::is_candidate(eps, n_i, n_j, g_ij, bound[base + i], bound[base + j], n)) return;
  const unsigned long long slot = atomicAdd(count, 1ULL);
  if (slot < capacity) out[slot] = margin::CandidatePair{head, i, j};
}

}  // namespace

std::vector<std::vector<std::pair<int, int>>> confusion_candidates(Context& ctx, const DeviceRows& rows,
                                                                   const double* row_bound,
                                                                   const unsigned char* degenerate, double eps,
                                                                   long long capacity_hint) {
  const int n = rows.n, batch = rows.batch;
  if (batch < 1 || n < 2) return std::vector<std::vector<std::pair<int, int>>>(std::size_t(batch > 0 ? batch : 0));
  const std::int64_t per_row = std::int64_t(batch) * n;
  double* gram = ctx.gram.as<double>(std::size_t(per_row) * std::size_t(n));
  double* bound = ctx.bound.as<double>(std::size_t(per_row));
  unsigned char* flags = degenerate ? ctx.flags.as<unsigned char>(std::size_t(per_row)) : nullptr;
  auto* count = ctx.count.as<unsigned long long>(1);
  if (degenerate) {
    ctx.upload({{bound, row_bound, std::size_t(per_row) * sizeof(double)}, {flags, degenerate, std::size_t(per_row)}});
  } else {
    ctx.upload({{bound, row_bound, std::size_t(per_row) * sizeof(double)}});
  }
  products(ctx, rows.data, rows.data, gram, batch, n, n, 1.0);

  std::int64_t capacity = margin::retry_capacity(1, capacity_hint);
  const dim3 threads(kTile, kTile);
  const dim3 blocks(unsigned((n + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile), unsigned(batch));
  unsigned long long found = 0;
  std::vector<margin::CandidatePair> pairs;
  for (;;) {
    auto* out = ctx.pairs.as<margin::CandidatePair>(std::size_t(capacity));
    check(cudaMemsetAsync(count, 0, sizeof(unsigned long long), ctx.stream), "cudaMemsetAsync");
    candidates<<<blocks, threads, 0, ctx.stream>>>(gram, bound, flags, n, eps, out,
                                                   static_cast<unsigned long long>(capacity), count);
    check(cudaGetLastError(), "candidates");
    ctx.download(&found, count, sizeof found);
    if (static_cast<std::int64_t>(found) <= capacity) {
      pairs.resize(std::size_t(found));
      if (found > 0) ctx.download(pairs.data(), out, std::size_t(found) * sizeof(margin::CandidatePair));
      break;
    }
    capacity = margin::retry_capacity(static_cast<std::int64_t>(found), capacity);
  }
  return margin::split_by_head(pairs, batch);
}

}  // namespace attnscope::cuda
