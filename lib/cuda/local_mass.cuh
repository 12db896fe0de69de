// Local attention mass on the device: the sum of each row over its query's k x k grid window
// (locality.hpp), in double, from rows computed by weights.cuh.
#pragma once

#include "weights.cuh"

#include <vector>

namespace attnscope::cuda {

/// The windows of every query as a CSR list: query i's keys are index[offset[i] .. offset[i+1]);
/// a query with an empty list (a prefix token) gets NaN.
struct WindowLists {
  std::vector<int> offset;  ///< n + 1 entries
  std::vector<int> index;
};

/// mass[b * n + i] = sum of rows[b][i][j] over i's window; NaN for rows flagged in `degenerate`
/// (batch x n, may be null) and for queries without a window. `mass` has batch x n entries.
void window_mass(Context& ctx, const DeviceRows& rows, const WindowLists& windows, const unsigned char* degenerate,
                 double* mass);

}  // namespace attnscope::cuda
