// Per-layer family parameters of a dump: what a family's formula needs beyond q, k, v, as the
// model computed it (docs/dump-format.md "Family parameters"): RoPE cosines and sines, PolaFormer's
// feature scale and exponent, Agent attention's position biases and agents.
//
//   /layers/L/family_params/NAME   float32 [heads, rows, cols] (or [heads, cols]: rows = 1)
//   /layers/L/agents               q's dtype [images, heads, agents, head_dim] (Agent attention)
//
// Reading is separate from the dump reader: a file without these groups reads as before, and
// these functions only open what they are asked for. Every failure is one InputError naming the
// file, the dataset and what was expected against what was found.
#pragma once

#include "attnscope/layout.hpp"

#include <string>
#include <vector>

namespace attnscope {

/// One parameter array of a layer: `heads` matrices of rows x cols, in double (exact from float32).
struct FamilyParam {
  std::string name;
  std::vector<MatD> per_head;
};

/// Names of the datasets in /layers/L/family_params, sorted; empty when the group is absent.
[[nodiscard]] std::vector<std::string> family_param_names(const std::string& path, int layer);

/// /layers/L/family_params/NAME, which must be float32 with `heads` as its first dimension and,
/// where rows or cols is >= 0, that many rows (second dimension; 1 for a 2-D dataset) and
/// columns (last dimension). Values must be finite.
[[nodiscard]] FamilyParam read_family_param(const std::string& path, int layer,
                                            const std::string& name, int heads, long rows = -1,
                                            long cols = -1);

/// A string attribute of /layers/L/family_params (e.g. "rope_layout"), or `fallback` when the
/// group or the attribute is absent.
[[nodiscard]] std::string family_param_attribute(const std::string& path, int layer,
                                                 const std::string& name,
                                                 const std::string& fallback = "");

/// Whether /layers/L/agents exists.
[[nodiscard]] bool has_layer_agents(const std::string& path, int layer);

/// /layers/L/agents of one image: [heads] matrices agents x head_dim (float16 or float32 data).
[[nodiscard]] std::vector<MatD> read_layer_agents(const std::string& path, int layer, long image,
                                                  int heads, int head_dim);

}  // namespace attnscope
