// A ViT exported to HDF5 by the Python side (docs/model-weights.md), read for a forward pass in C++
// (analyses/replay.hpp). Every tensor is read as float (float32 or float16 files), in PyTorch's own
// shape; the attention of every block is a variant of the family registry.
#pragma once

#include "attnscope/layout.hpp"
#include "attnscope/variant.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attnscope {

struct VitBlock {
  VecF norm1_w, norm1_b;
  MatF qkv_w;  ///< 3D x D
  VecF qkv_b;
  MatF proj_w;  ///< D x D
  VecF proj_b;
  VecF norm2_w, norm2_b;
  MatF fc1_w;  ///< M x D
  VecF fc1_b;
  MatF fc2_w;  ///< D x M
  VecF fc2_b;
  /// InLine's local residual (eq. 6), when the model has it: two grouped 1x1 convolutions
  /// (groups = heads) stored as their [out, in / heads] kernels.
  MatF lr_conv1_w;  ///< D x D/H
  VecF lr_conv1_b;
  MatF lr_conv2_w;  ///< 9D x D/H
  VecF lr_conv2_b;
};

struct VitModel {
  std::string path;
  std::string model_name;
  Variant variant;  ///< attention_family, feature_map, convention of the file
  double scale = 0.0;
  int image_size = 0, patch_size = 0, in_chans = 0, num_classes = 0;
  int embed_dim = 0, depth = 0, num_heads = 0, head_dim = 0, mlp_hidden = 0;
  TokenGrid grid;
  double layer_norm_eps = 1e-6;
  bool local_residual = false;  ///< every block has InLine's local residual
  MatF patch_w;  ///< D x (C P P), the convolution's kernel flattened in (c, y, x) order
  VecF patch_b;
  VecF cls_token;  ///< D
  MatF pos_embed;  ///< N x D
  std::vector<VitBlock> blocks;
  VecF norm_w, norm_b;
  MatF head_w;  ///< classes x D
  VecF head_b;
};

/// The /images of an image set or of a dump (and its /labels and /logits, where present), read
/// one image at a time: memory is bounded by one image whatever the file holds. /images must be
/// [images, C, H, W] with at least one image, /labels integers [images], /logits [images,
/// classes]; throws InputError naming the file, the dataset and what was expected.
class ImageRowReader {
 public:
  explicit ImageRowReader(const std::string& path);
  ~ImageRowReader();
  ImageRowReader(const ImageRowReader&) = delete;
  ImageRowReader& operator=(const ImageRowReader&) = delete;

  [[nodiscard]] int count() const;                      ///< images in the file
  [[nodiscard]] const std::vector<int>& shape() const;  ///< C, H, W
  [[nodiscard]] const std::vector<std::int64_t>& labels() const;  ///< empty when the file has none
  [[nodiscard]] int logit_classes() const;  ///< columns of /logits [n, classes], 0 without it
  /// Image `i` as C*H*W values (finite, or InputError naming the image).
  [[nodiscard]] VecF image(int i);
  /// Row `i` of /logits (finite, or InputError naming the image).
  [[nodiscard]] VecF logits(int i);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Reads a weights file. Throws InputError naming the file, the attribute or dataset and what was
/// expected (missing, wrong shape, not finite, an activation other than gelu_erf, a family the
/// registry does not know).
[[nodiscard]] VitModel load_vit(const std::string& path);

}  // namespace attnscope
