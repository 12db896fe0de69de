#include "local_mass.cuh"

#include "context.cuh"

#include <cstdint>

namespace attnscope::cuda {

namespace {

__global__ void window_sums(const double* rows, const int* offset, const int* index, const unsigned char* degenerate,
                            int n, std::int64_t total, double* mass) {
  const std::int64_t t = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= total) return;
  const int i = int(t % n);
  const int begin = offset[i], end = offset[i + 1];
  if (begin == end || (degenerate && degenerate[t])) {
    mass[t] = nan("");
    return;
  }
  const double* row = rows + t * n;
  double s = 0.0;
  for (int w = begin; w < end; ++w) s += row[index[w]];
  mass[t] = s;
}

}  // namespace

void window_mass(Context& ctx, const DeviceRows& rows, const WindowLists& windows, const unsigned char* degenerate,
                 double* mass) {
  const int n = rows.n;
  const std::int64_t total = std::int64_t(rows.batch) * n;
  if (total == 0) return;
  const std::size_t n_offsets = windows.offset.size(), n_index = windows.index.size();
  int* offset = ctx.windows.as<int>(n_offsets + n_index);
  int* index = offset + n_offsets;
  unsigned char* flags = degenerate ? ctx.flags.as<unsigned char>(std::size_t(total)) : nullptr;
  double* out = ctx.mass.as<double>(std::size_t(total));
  if (degenerate) {
    ctx.upload({{offset, windows.offset.data(), n_offsets * sizeof(int)},
                {index, windows.index.data(), n_index * sizeof(int)},
                {flags, degenerate, std::size_t(total)}});
  } else {
    ctx.upload({{offset, windows.offset.data(), n_offsets * sizeof(int)}, {index, windows.index.data(), n_index * sizeof(int)}});
  }
  constexpr int kThreads = 256;
  window_sums<<<unsigned((total + kThreads - 1) / kThreads), kThreads, 0, ctx.stream>>>(rows.data, offset, index, flags,
                                                                                       n, total, out);
  check(cudaGetLastError(), "window_sums");
  ctx.download(mass, out, std::size_t(total) * sizeof(double));
}

}  // namespace attnscope::cuda
