#include "weights.cuh"

#include "context.cuh"

#include <cuda_fp16.h>

#include <cstdint>

namespace attnscope::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void widen(const float* in, double* out, std::int64_t count) {
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < count) out[t] = double(in[t]);
}

__global__ void widen_half(const std::uint16_t* in, double* out, std::int64_t count) {
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < count) out[t] = double(__half2float(__ushort_as_half(in[t])));
}

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kThreads / kWarp;

/// Warp-wide reduction (max or sum) of one value per lane; every lane gets the result.
template <bool kMax>
__device__ double warp_reduce(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const double o = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmax(v, o) : v + o;
  }
  return v;
}

/// One warp per row of logits (`rows` rows of n), in place: exp(x - max) / sum over the kept keys
/// (all when `kept` is null), 0 elsewhere; a row that keeps no key becomes zeros. No block-wide
/// synchronisation: a row of a few hundred entries is a handful per lane.
__global__ void softmax_in_place(double* w, const unsigned char* kept, int n, std::int64_t rows) {
  const std::int64_t r = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (r >= rows) return;  // whole warps leave together
  const int lane = threadIdx.x % kWarp;
  double* row = w + r * n;
  const unsigned char* keep = kept ? kept + r * n : nullptr;
  double m = -HUGE_VAL;
  for (int j = lane; j < n; j += kWarp) {
    if (!keep || keep[j]) m = fmax(m, row[j]);
  }
  m = warp_reduce<true>(m);
  double s = 0.0;
  for (int j = lane; j < n; j += kWarp) {
    const double e = (!keep || keep[j]) ? exp(row[j] - m) : 0.0;
    row[j] = e;
    s += e;
  }
  s = warp_reduce<false>(s);
  for (int j = lane; j < n; j += kWarp) row[j] = s > 0.0 ? row[j] / s : 0.0;
}

/// w_ij = a_i p_ij + b_i over products p in place; zeros for degenerate rows.
__global__ void kernel_form(double* w, const double* a, const double* b, const unsigned char* degenerate,
                            const unsigned char* kept, int n, std::int64_t rows) {
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= rows * n) return;
  const std::int64_t row = t / n;
  w[t] = (degenerate[row] || (kept && !kept[t])) ? 0.0 : a[row] * w[t] + b[row];
}

unsigned blocks_for(std::int64_t count) { return unsigned((count + kThreads - 1) / kThreads); }
unsigned row_blocks(std::int64_t rows) { return unsigned((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

namespace {

/// Widening, logits and softmax of float q, k already on the device (qf, then kf = qf + in).
DeviceRows softmax_rows_on_device(Context& ctx, const float* qf, int batch, int n, int d, double scale) {
  const std::int64_t in = std::int64_t(batch) * n * d, out = std::int64_t(batch) * n * n;
  double* qd = ctx.fq.as<double>(std::size_t(2 * in));
  double* kd = qd + in;
  double* w = ctx.rows.as<double>(std::size_t(out));
  if (in > 0) widen<<<blocks_for(2 * in), kThreads, 0, ctx.stream>>>(qf, qd, 2 * in);
  check(cudaGetLastError(), "widen");
  products(ctx, qd, kd, w, batch, n, d, scale);
  if (out > 0) softmax_in_place<<<row_blocks(std::int64_t(batch) * n), kThreads, 0, ctx.stream>>>(w, nullptr, n, std::int64_t(batch) * n);
  check(cudaGetLastError(), "softmax_in_place");
  return {w, batch, n};
}

}  // namespace

DeviceRows softmax_rows(Context& ctx, const float* q, const float* k, int batch, int n, int d, double scale) {
  const std::int64_t in = std::int64_t(batch) * n * d;
  float* qf = ctx.q.as<float>(std::size_t(2 * in));
  float* kf = qf + in;
  ctx.upload({{qf, q, std::size_t(in) * sizeof(float)}, {kf, k, std::size_t(in) * sizeof(float)}});
  return softmax_rows_on_device(ctx, qf, batch, n, d, scale);
}

float* softmax_inputs(Context& ctx, int batch, int n, int d) {
  ctx.synchronize();
  return ctx.inputs.as<float>(std::size_t(2) * std::size_t(batch) * std::size_t(n) * std::size_t(d));
}

DeviceRows softmax_rows_pinned(Context& ctx, int batch, int n, int d, double scale) {
  const std::size_t in = std::size_t(batch) * std::size_t(n) * std::size_t(d);
  float* qf = ctx.q.as<float>(2 * in);
  const float* host = ctx.inputs.as<float>(2 * in);  // the area softmax_inputs gave (grow-only)
  if (in > 0) {
    check(cudaMemcpyAsync(qf, host, 2 * in * sizeof(float), cudaMemcpyHostToDevice, ctx.stream),
          "cudaMemcpyAsync (pinned inputs)");
  }
  return softmax_rows_on_device(ctx, qf, batch, n, d, scale);
}

DeviceRows softmax_rows_half(Context& ctx, const std::uint16_t* q, const std::uint16_t* k, int batch, int n, int d,
                             double scale) {
  const std::int64_t in = std::int64_t(batch) * n * d, out = std::int64_t(batch) * n * n;
  auto* qh = static_cast<std::uint16_t*>(ctx.q.reserve(std::size_t(2 * in) * sizeof(std::uint16_t)));
  std::uint16_t* kh = qh + in;
  double* qd = ctx.fq.as<double>(std::size_t(2 * in));
  double* kd = qd + in;
  double* w = ctx.rows.as<double>(std::size_t(out));
  ctx.upload({{qh, q, std::size_t(in) * sizeof(std::uint16_t)}, {kh, k, std::size_t(in) * sizeof(std::uint16_t)}});
  if (in > 0) widen_half<<<blocks_for(2 * in), kThreads, 0, ctx.stream>>>(qh, qd, 2 * in);
  check(cudaGetLastError(), "widen_half");
  products(ctx, qd, kd, w, batch, n, d, scale);
  if (out > 0) softmax_in_place<<<row_blocks(std::int64_t(batch) * n), kThreads, 0, ctx.stream>>>(w, nullptr, n, std::int64_t(batch) * n);
  check(cudaGetLastError(), "softmax_in_place");
  return {w, batch, n};
}

DeviceRows softmax_rows(Context& ctx, const double* q, const double* k, const unsigned char* kept, int batch, int n,
                        int d, double scale) {
  const std::int64_t in = std::int64_t(batch) * n * d, out = std::int64_t(batch) * n * n;
  double* qd = ctx.fq.as<double>(std::size_t(2 * in));
  double* kd = qd + in;
  double* w = ctx.rows.as<double>(std::size_t(out));
  unsigned char* keep = kept ? ctx.kept.as<unsigned char>(std::size_t(out)) : nullptr;
  if (kept) {
    ctx.upload({{qd, q, std::size_t(in) * sizeof(double)}, {kd, k, std::size_t(in) * sizeof(double)},
                {keep, kept, std::size_t(out)}});
  } else {
    ctx.upload({{qd, q, std::size_t(in) * sizeof(double)}, {kd, k, std::size_t(in) * sizeof(double)}});
  }
  products(ctx, qd, kd, w, batch, n, d, scale);
  if (out > 0) softmax_in_place<<<row_blocks(std::int64_t(batch) * n), kThreads, 0, ctx.stream>>>(w, keep, n, std::int64_t(batch) * n);
  check(cudaGetLastError(), "softmax_in_place");
  return {w, batch, n};
}

DeviceRows kernel_rows(Context& ctx, const double* fq, const double* fk, const double* a, const double* b,
                       const unsigned char* degenerate, int batch, int n, int r, const unsigned char* kept) {
  const std::int64_t in = std::int64_t(batch) * n * r, rows = std::int64_t(batch) * n;
  const std::int64_t out = rows * n;
  double* fqd = ctx.fq.as<double>(std::size_t(2 * in));
  double* fkd = fqd + in;
  double* ad = ctx.a.as<double>(std::size_t(2 * rows));
  double* bd = ad + rows;
  auto* flags = ctx.flags.as<unsigned char>(std::size_t(rows));
  double* w = ctx.rows.as<double>(std::size_t(out));
  unsigned char* keep = kept ? ctx.kept.as<unsigned char>(std::size_t(out)) : nullptr;
  ctx.upload({{fqd, fq, std::size_t(in) * sizeof(double)},
              {fkd, fk, std::size_t(in) * sizeof(double)},
              {ad, a, std::size_t(rows) * sizeof(double)},
              {bd, b, std::size_t(rows) * sizeof(double)},
              {flags, degenerate, std::size_t(rows)},
              {keep, kept, kept ? std::size_t(out) : 0}});
  products(ctx, fqd, fkd, w, batch, n, r, 1.0);
  if (out > 0) kernel_form<<<blocks_for(out), kThreads, 0, ctx.stream>>>(w, ad, bd, flags, keep, n, rows);
  check(cudaGetLastError(), "kernel_form");
  return {w, batch, n};
}

void outputs(Context& ctx, const DeviceRows& rows, const double* values, int dv, double* out) {
  const int n = rows.n;
  const std::int64_t in = std::int64_t(rows.batch) * n * dv;
  if (in == 0) return;
  double* vd = ctx.values.as<double>(std::size_t(2 * in));
  double* od = vd + in;
  ctx.upload({{vd, values, std::size_t(in) * sizeof(double)}});
  // Row-major O = W V is column-major O^T = V^T W^T, with V^T and W^T as V and W are stored.
  const double one = 1.0, zero = 0.0;
  check(cublas().dgemm_strided_batched(ctx.blas, CUBLAS_OP_N, CUBLAS_OP_N, dv, n, n, &one, vd, dv,
                                  static_cast<long long>(n) * dv, rows.data, n, static_cast<long long>(n) * n, &zero,
                                  od, dv, static_cast<long long>(n) * dv, rows.batch),
        "cublasDgemmStridedBatched (outputs)");
  ctx.download(out, od, std::size_t(in) * sizeof(double));
}

void download_rows(Context& ctx, const DeviceRows& rows, double* out) {
  ctx.download(out, rows.data, std::size_t(rows.batch) * std::size_t(rows.n) * std::size_t(rows.n) * sizeof(double));
}

}  // namespace attnscope::cuda
