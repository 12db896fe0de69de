// The local term's depthwise kernel (docs/dump-format.md, "The local term's kernel"): where a
// module's local term (/layers/L/local) is a depthwise convolution of V's grid, the dump may
// record the convolution itself, so that analyses can fold it into the attention map.
//
//   /layers/L/local_kernel  float32 [heads, head_dim, kh, kw]            the same for every image
//                           float32 [images, heads, head_dim, kh, kw]    per image (InLine)
//                           float32 [images, heads, windows, head_dim, kh, kw]  per image and
//                                                                        window (InLine-Swin)
//       attributes padding_height, padding_width: zero padding, 2 * padding + 1 = kh (kw)
//   /layers/L/local_bias    float32 [heads, head_dim]                    optional
//
// Channel t of head h is channel t of the head's head_dim columns of v and local. The convolution
// runs over the layer's grid (prefix tokens neither filtered nor given a local term) or, with
// windows, over each window's grid in the window's token order; stride 1, the output on the input
// grid. Every failure is one InputError naming the file, the dataset and the expected against the
// found type, shape or value.
#pragma once

#include "attnscope/geometry.hpp"
#include "attnscope/layout.hpp"

#include <string>
#include <vector>

namespace attnscope {

/// One image's kernels of one layer, in double (exact from float32).
struct LocalKernel {
  int height = 0, width = 0;          ///< kh, kw
  int pad_height = 0, pad_width = 0;  ///< (kh - 1) / 2, (kw - 1) / 2
  /// [head][unit]: head_dim x (kh * kw), one row per channel, the kernel's taps row by row; one
  /// unit without windows, `windows` with them (the same matrix in each for a static kernel).
  std::vector<std::vector<MatD>> taps;
  std::vector<VecD> bias;  ///< per head, head_dim entries; empty when the dump has no local_bias

  /// The head's one kernel over its channels: kh x kw, the mean of its channels' kernels.
  [[nodiscard]] MatD head_mean(int head, int unit) const;
};

/// Whether /layers/L/local_kernel exists.
[[nodiscard]] bool has_local_kernel(const std::string& path, int layer);

/// /layers/L/local_kernel (and local_bias) of one image (`image`: the file's own index) for a layer
/// of geometry `geo`; validated against it (heads, head_dim, windows, images in the file, padding,
/// finite values).
[[nodiscard]] LocalKernel read_local_kernel(const std::string& path, int layer, long image,
                                            const LayerGeometry& geo);

}  // namespace attnscope
