// Token filters (token_filter.hpp): parsing, constant patches, and the masks of a dump's images.
#include "attnscope/analyses/token_filter.hpp"

#include "attnscope/error.hpp"

#include <algorithm>
#include <cstddef>
#include <string>

namespace attnscope::analyses {

namespace {

constexpr std::string_view kMaskPrefix = "mask:";

[[noreturn]] void refuse(std::string_view spec, const std::string& why) {
  throw UsageError("--exclude-tokens: " + why + ", found '" + std::string(spec) +
                   "' (expected none, constant-patch or mask:DATASET)");
}

}  // namespace

std::string TokenFilter::name() const {
  switch (kind) {
    case Kind::None:
      return "none";
    case Kind::ConstantPatch:
      return "constant-patch";
    case Kind::Mask:
      return std::string(kMaskPrefix) + dataset;
  }
  return "none";
}

TokenFilter parse_token_filter(std::string_view spec) {
  TokenFilter f;
  if (spec == "none") return f;
  if (spec == "constant-patch") {
    f.kind = TokenFilter::Kind::ConstantPatch;
    return f;
  }
  if (spec.substr(0, kMaskPrefix.size()) == kMaskPrefix) {
    std::string dataset(spec.substr(kMaskPrefix.size()));
    if (dataset.empty() || dataset == "/") refuse(spec, "mask: needs a dataset of the dump");
    if (dataset.find_first_of(" \t\n,") != std::string::npos)
      refuse(spec, "a dataset name has no spaces or commas");
    f.kind = TokenFilter::Kind::Mask;
    f.dataset = dataset.front() == '/' ? dataset : "/" + dataset;
    return f;
  }
  refuse(spec, "unknown token filter");
}

ExcludedTokens constant_patch_tokens(const float* pixels, int channels, int height, int width,
                                     const TokenGrid& grid) {
  if (grid.height < 1 || grid.width < 1 || channels < 1 || height % grid.height != 0 ||
      width % grid.width != 0 || height < grid.height || width < grid.width) {
    throw UsageError("constant_patch_tokens: an image of " + std::to_string(channels) + " x " +
                     std::to_string(height) + " x " + std::to_string(width) +
                     " does not split into a " + std::to_string(grid.height) + " x " +
                     std::to_string(grid.width) + " grid of patches");
  }
  const int ph = height / grid.height, pw = width / grid.width;
  const auto plane = static_cast<std::size_t>(height) * static_cast<std::size_t>(width);
  ExcludedTokens out(static_cast<std::size_t>(grid.tokens()), 0);
  for (int r = 0; r < grid.height; ++r) {
    for (int c = 0; c < grid.width; ++c) {
      bool constant = true;
      for (int ch = 0; ch < channels && constant; ++ch) {
        const float* p = pixels + static_cast<std::size_t>(ch) * plane;
        const float first = p[static_cast<std::size_t>(r * ph) * static_cast<std::size_t>(width) +
                              static_cast<std::size_t>(c * pw)];
        for (int y = r * ph; y < (r + 1) * ph && constant; ++y) {
          const float* row = p + static_cast<std::size_t>(y) * static_cast<std::size_t>(width);
          constant = std::all_of(row + c * pw, row + (c + 1) * pw,
                                 [first](float x) { return x == first; });
        }
      }
      out[static_cast<std::size_t>(grid.token(r, c))] = constant ? 1 : 0;
    }
  }
  return out;
}

std::vector<ExcludedTokens> excluded_tokens(DumpReader& reader, const TokenFilter& filter,
                                            const std::vector<int>& images) {
  std::vector<ExcludedTokens> out(images.size());
  const DumpSchema& schema = reader.schema();
  const TokenGrid& grid = schema.attrs.grid;
  switch (filter.kind) {
    case TokenFilter::Kind::None:
      return out;
    case TokenFilter::Kind::Mask: {
      const std::vector<unsigned char> all = reader.read_token_masks(filter.dataset);
      const auto n = static_cast<std::size_t>(grid.tokens());
      for (std::size_t i = 0; i < images.size(); ++i) {
        const auto first =
            all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(images[i]) * n);
        out[i].assign(first, first + static_cast<std::ptrdiff_t>(n));
      }
      return out;
    }
    case TokenFilter::Kind::ConstantPatch: {
      if (!schema.has_images) {
        throw InputError(
            schema.path, "/images",
            "a dataset [images, C, H, W] (the model's input; --exclude-tokens constant-patch "
            "finds constant patches in it)",
            "none");
      }
      std::vector<int> shape;
      for (std::size_t i = 0; i < images.size(); ++i) {
        const VecF pixels = reader.read_input_image(images[i], &shape);
        if (shape[1] % grid.height != 0 || shape[2] % grid.width != 0 || shape[1] < grid.height ||
            shape[2] < grid.width) {
          throw InputError(schema.path, "/images",
                           "an image height and width that are multiples of the patch grid's " +
                               std::to_string(grid.height) + " x " + std::to_string(grid.width),
                           std::to_string(shape[1]) + " x " + std::to_string(shape[2]));
        }
        out[i] = constant_patch_tokens(pixels.data(), shape[0], shape[1], shape[2], grid);
      }
      return out;
    }
  }
  return out;
}

void check_token_filter(DumpReader& reader, const TokenFilter& filter) {
  if (reader.schema().num_images > 0) (void)excluded_tokens(reader, filter, {0});
}

int excluded_count(const ExcludedTokens& excluded) {
  return static_cast<int>(
      std::count_if(excluded.begin(), excluded.end(), [](unsigned char x) { return x != 0; }));
}

}  // namespace attnscope::analyses
