// Tokens an analysis leaves out (--exclude-tokens), per image of a dump.
//
// Why: on images with large flat areas (Fashion-MNIST's uniform background) the tokens of
// constant patches differ only by their position embedding, so their queries, and hence their
// attention rows, nearly coincide; counting their pairs measures the background rather than the
// attention. A filter names such tokens per image, and the analysis drops every pair involving one.
//
// Filters:
//  * none: every token takes part.
//  * constant-patch: the grid tokens whose image patch is constant: every pixel of the patch has
//    the same value in every channel (pixels compared exactly as stored in the dump's /images,
//    the normalised model input [images, C, H, W]; the patch of grid cell (r, c) is rows
//    r*H/grid_height .. (r+1)*H/grid_height - 1 and the matching columns). Prefix tokens (CLS)
//    are never excluded.
//  * mask:DATASET: a mask stored in the dump, [images, tokens] of bool or uint8, 1 = exclude
//    (DumpReader::read_token_masks; by convention under /token_masks/, docs/dump-format.md).
#pragma once

#include "attnscope/dump.hpp"
#include "attnscope/layout.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace attnscope::analyses {

/// The tokens of one image left out of every pair: excluded[t] != 0 leaves token t out. One entry
/// per token; an empty mask leaves none out.
using ExcludedTokens = std::vector<unsigned char>;

struct TokenFilter {
  enum class Kind { None, ConstantPatch, Mask };
  Kind kind = Kind::None;
  std::string dataset;  ///< Mask: the dump's dataset, "/..." (absolute)

  [[nodiscard]] bool active() const { return kind != Kind::None; }
  /// The spec that parses back to this filter: "none", "constant-patch", "mask:/token_masks/x".
  [[nodiscard]] std::string name() const;
};

/// Parses --exclude-tokens: "none", "constant-patch" or "mask:DATASET" (the leading '/' of the
/// dataset optional). UsageError naming the flag and the filters it takes otherwise.
TokenFilter parse_token_filter(std::string_view spec);

/// The grid tokens whose patch of `pixels` (C x H x W, row-major, channel first) is constant in
/// every channel; prefix tokens are kept. H and W must be multiples of the grid's height and width
/// (UsageError otherwise; excluded_tokens reports it against the dump first).
ExcludedTokens constant_patch_tokens(const float* pixels, int channels, int height, int width,
                                     const TokenGrid& grid);

/// The excluded tokens of each image of `images` (dump indices), in that order: one mask per image
/// (empty ones when the filter is none). Reads what the filter needs from the dump (one image of
/// /images at a time, or the whole mask dataset, images x tokens bytes) and checks it first:
/// InputError naming the file and dataset for a dump without /images, an image size that is not a
/// multiple of the grid, or a mask of the wrong shape, dtype or values.
std::vector<ExcludedTokens> excluded_tokens(DumpReader& reader, const TokenFilter& filter,
                                            const std::vector<int>& images);

/// The checks excluded_tokens makes of the dump, done once up front (on its first image), so that a
/// run refuses a filter its dump cannot serve before it starts.
void check_token_filter(DumpReader& reader, const TokenFilter& filter);

/// Number of excluded tokens of a mask.
[[nodiscard]] int excluded_count(const ExcludedTokens& excluded);

}  // namespace attnscope::analyses
