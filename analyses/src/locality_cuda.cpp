// Local mass on the GPU (local_mass_cuda, locality.hpp): the head's rows on the device from
// ExactRows's inputs (confusion_exact_cuda.hpp), summed over each query's window there
// (local_mass.cuh).
#include "attnscope/analyses/locality.hpp"

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/device.hpp"
#include "attnscope/error.hpp"

#ifdef ATTNSCOPE_HAVE_CUDA
#include "confusion_exact_cuda.hpp"
#include "local_mass.cuh"
#endif

#include <string>
#include <vector>

namespace attnscope::analyses {

#ifdef ATTNSCOPE_HAVE_CUDA

std::vector<double> local_mass_cuda(const Variant& v, const MatF& q, const MatF& k, double scale,
                                    const TokenGrid& grid, int window, int* degenerate) {
  if (window < 1 || window % 2 == 0) {
    throw UsageError("--window must be a positive odd number, found " + std::to_string(window));
  }
  if (grid.tokens() != k.rows()) {
    throw UsageError("locality: the grid has " + std::to_string(grid.tokens()) +
                     " tokens but the head has " + std::to_string(k.rows()));
  }
  const ExactRows rows(v, q, k, scale);
  const std::vector<unsigned char> flags = detail::degenerate_flags(rows);
  cuda::WindowLists lists;
  lists.offset.push_back(0);
  for (int i = 0; i < grid.tokens(); ++i) {
    for (int j : grid.window(i, window)) lists.index.push_back(j);
    lists.offset.push_back(static_cast<int>(lists.index.size()));
  }
  const cuda::DeviceRows dr = detail::device_rows(rows, q, k, scale, flags);
  std::vector<double> mass(static_cast<std::size_t>(rows.tokens()));
  cuda::window_mass(cuda::this_thread_context(), dr, lists, flags.data(), mass.data());
  if (degenerate) {
    *degenerate = 0;
    for (int i = grid.prefix; i < grid.tokens(); ++i) *degenerate += rows.degenerate(i) ? 1 : 0;
  }
  return mass;
}

#else

std::vector<double> local_mass_cuda(const Variant&, const MatF&, const MatF&, double,
                                    const TokenGrid&, int, int*) {
  refuse_without_cuda();
}

#endif

}  // namespace attnscope::analyses
