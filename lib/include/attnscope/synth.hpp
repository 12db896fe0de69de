// Synthetic dumps: Q, K, V with a known structure, for demos and for tests that must find what was
// planted.
//
// Model of one head (layer l, head h): every grid token t carries a smooth positional code g_t
// (random Fourier features of its grid position, so g_t . g_u decays with grid distance), and
//   q_t = a_l g_t + n_t,   k_t = a_l g_t + m_t,   v_t = w_t,
// with n, m, w standard Gaussian per image and a_l falling from 1 (layer 0) to 0.5 (last layer):
// softmax rows are far from uniform and put more mass near the query on the grid in early layers.
// Prefix tokens get no positional code.
//
// Planted structure, per (image, layer, head), on disjoint token pairs (i, j), i != j:
//   duplicate   q_j = q_i exactly                     (same row under every family)
//   collinear   q_j = c q_i, c in {1/2, 2}             (same row under linear attention with a
//               positively homogeneous map: identity, relu; exact in float32 and float16 because
//               c is a power of two)
//   shifted     q_j = q_i + t x, with K x = 1           (same softmax row: logits move by s t for
//               every key; needs the hyperplane)
//   hyperplane  every key projected onto {k : k . x = 1}, x fixed per (layer, head), so
//               rank([K, 1]) = rank(K) = d (K x = 1 is solvable; exact up to float rounding)
//
// Every value is a pure function of (seed, image, layer, head): images can be generated in any
// order or in parallel and are identical on every platform (own Box-Muller on std::mt19937_64).
#pragma once

#include "attnscope/dump.hpp"
#include "attnscope/layout.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace attnscope {

struct SynthOptions {
  int layers = 4;
  int heads = 3;
  TokenGrid grid{1, 7, 7};  ///< prefix, height, width: N = 50 tokens
  int head_dim = 16;
  int images = 32;
  DType dtype = DType::F32;
  std::uint64_t seed = 0;
  int compression = 1;  ///< gzip level 0-9
  // Recorded as the dump's attributes (the data are the same whatever they say).
  std::string model_name = "synthetic";
  std::string family = "softmax";
  std::string convention = "paper";
  std::string feature_map = "none";
  // Planted structure: pairs per (image, layer, head).
  int plant_duplicates = 0;
  int plant_collinear = 0;
  int plant_shifted = 0;  ///< requires plant_hyperplane
  bool plant_hyperplane = false;

  [[nodiscard]] int tokens() const { return grid.tokens(); }
  [[nodiscard]] double scale() const;
  /// The dump attributes these options describe.
  [[nodiscard]] DumpAttributes attributes() const;
  /// Throws UsageError naming the first bad option (sizes, pairs that do not fit, ...).
  void validate() const;
};

enum class PlantKind { Duplicate, Collinear, Shifted };

struct PlantedPair {
  int i = 0, j = 0;  ///< token indices, i != j; q_j is derived from q_i
  PlantKind kind = PlantKind::Duplicate;
  double factor = 1;  ///< c for collinear (q_j = c q_i), t for shifted (q_j = q_i + t x)
};

/// The pairs planted in (image, layer, head), duplicates first, then collinear, then shifted.
[[nodiscard]] std::vector<PlantedPair> planted_pairs(const SynthOptions& o, int image, int layer,
                                                     int head);

/// x with K x = 1 for every image's keys of (layer, head); empty when no hyperplane is planted.
[[nodiscard]] VecD hyperplane_normal(const SynthOptions& o, int layer, int head);

/// One image, all layers and heads, as the dump would hold it in float32.
[[nodiscard]] ImageQKV synth_image(const SynthOptions& o, int image);

/// Writes the whole dump (atomically, see DumpWriter). Validates the options first.
/// on_image(i), if given, runs after image i is written (progress).
void write_synth_dump(const std::string& path, const SynthOptions& o,
                      const std::function<void(int)>& on_image = {});

[[nodiscard]] std::string to_string(PlantKind k);

}  // namespace attnscope
