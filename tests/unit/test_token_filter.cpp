// Token filters (--exclude-tokens): the names they parse from, constant patches found on synthetic
// images with known constant patches (a patch one pixel off is kept: the negative control), the
// masks a dump stores and their checks, and a streamed confusion run with a filter against the
// brute force over the pairs of kept tokens.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/token_filter.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attnscope::analyses {
namespace {

/// The error's message, for checking what it names.
template <typename E, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error of the expected type)";
}

TEST(TokenFilter, ParsesTheThreeFiltersAndRefusesOthers) {
  EXPECT_FALSE(parse_token_filter("none").active());
  EXPECT_EQ(parse_token_filter("none").name(), "none");
  const TokenFilter constant = parse_token_filter("constant-patch");
  EXPECT_EQ(constant.kind, TokenFilter::Kind::ConstantPatch);
  EXPECT_EQ(constant.name(), "constant-patch");
  const TokenFilter mask = parse_token_filter("mask:token_masks/background");
  EXPECT_EQ(mask.kind, TokenFilter::Kind::Mask);
  EXPECT_EQ(mask.dataset, "/token_masks/background");
  EXPECT_EQ(mask.name(), "mask:/token_masks/background");
  EXPECT_EQ(parse_token_filter(mask.name()).dataset, mask.dataset) << "the name parses back";
  for (const char* bad :
       {"", "bogus", "constant_patch", "Constant-Patch", "mask:", "mask:/", "mask", "mask:a,b"}) {
    const std::string what = message_of<UsageError>([&] { (void)parse_token_filter(bad); });
    EXPECT_NE(what.find("--exclude-tokens"), std::string::npos) << "'" << bad << "': " << what;
    EXPECT_NE(what.find("constant-patch"), std::string::npos)
        << "'" << bad << "' lists the filters: " << what;
  }
}

/// A C x H x W image (row-major, channel first) of constant value `background[c]` per channel.
std::vector<float> flat_image(int channels, int height, int width,
                              const std::vector<float>& background) {
  std::vector<float> px(static_cast<std::size_t>(channels * height * width));
  for (int c = 0; c < channels; ++c) {
    std::fill_n(px.begin() + static_cast<std::ptrdiff_t>(c) * height * width, height * width,
                background[static_cast<std::size_t>(c)]);
  }
  return px;
}

float& pixel(std::vector<float>& px, int height, int width, int c, int y, int x) {
  return px[static_cast<std::size_t>((c * height + y) * width + x)];
}

TEST(ConstantPatch, FindsTheKnownPatchesAndKeepsPatchesOnePixelOff) {
  // 2 channels, a 3 x 4 grid of 2 x 3 patches (6 x 12 pixels), 2 prefix tokens.
  const TokenGrid grid{2, 3, 4};
  const int C = 2, H = 6, W = 12;
  std::vector<float> px = flat_image(C, H, W, {0.5f, -1.25f});
  // Cell (1, 2): noise. Cell (2, 3): another constant colour (still constant). Cell (0, 1): one
  // pixel off in channel 1 only. Cell (2, 0): constant in channel 0, a gradient in channel 1.
  for (int y = 2; y < 4; ++y) {
    for (int x = 6; x < 9; ++x) pixel(px, H, W, 0, y, x) = 0.1f * static_cast<float>(y * W + x);
  }
  for (int c = 0; c < C; ++c) {
    for (int y = 4; y < 6; ++y) {
      for (int x = 9; x < 12; ++x) pixel(px, H, W, c, y, x) = 3.0f + static_cast<float>(c);
    }
  }
  pixel(px, H, W, 1, 1, 5) = std::nextafter(-1.25f, 0.0f);
  for (int x = 0; x < 3; ++x) pixel(px, H, W, 1, 5, x) = static_cast<float>(x);
  const ExcludedTokens got = constant_patch_tokens(px.data(), C, H, W, grid);
  ASSERT_EQ(got.size(), 14U);
  ExcludedTokens want(14, 1);
  want[0] = want[1] = 0;  // prefix tokens are never excluded
  for (auto [r, c] : {std::pair{1, 2}, {0, 1}, {2, 0}})
    want[static_cast<std::size_t>(grid.token(r, c))] = 0;
  EXPECT_EQ(got, want);
  EXPECT_EQ(excluded_count(got), 9);

  // Every single pixel of a constant patch, in either channel, moved by one ulp: that patch (and
  // only it) is kept; the corners catch an off-by-one in the patch bounds.
  const int r = 1, c = 1;
  for (int ch = 0; ch < C; ++ch) {
    for (int y = r * 2; y < r * 2 + 2; ++y) {
      for (int x = c * 3; x < c * 3 + 3; ++x) {
        std::vector<float> off = px;
        float& p = pixel(off, H, W, ch, y, x);
        p = std::nextafter(p, 100.0f);
        ExcludedTokens expect = want;
        expect[static_cast<std::size_t>(grid.token(r, c))] = 0;
        EXPECT_EQ(constant_patch_tokens(off.data(), C, H, W, grid), expect)
            << "channel " << ch << " pixel (" << y << ", " << x << ") moved";
      }
    }
  }
}

TEST(ConstantPatch, AFlatImageExcludesEveryGridTokenAndNoPrefixToken) {
  for (const TokenGrid grid : {TokenGrid{1, 14, 14}, TokenGrid{0, 2, 3}, TokenGrid{2, 1, 1}}) {
    const std::vector<float> px =
        flat_image(3, grid.height * 4, grid.width * 2, {0.0f, 1.0f, -2.0f});
    const ExcludedTokens got =
        constant_patch_tokens(px.data(), 3, grid.height * 4, grid.width * 2, grid);
    EXPECT_EQ(excluded_count(got), grid.height * grid.width)
        << "grid " << grid.height << "x" << grid.width;
    for (int t = 0; t < grid.prefix; ++t)
      EXPECT_EQ(got[static_cast<std::size_t>(t)], 0) << "prefix token " << t;
  }
}

TEST(ConstantPatch, RefusesAnImageThatDoesNotSplitIntoTheGrid) {
  const std::vector<float> px(1 * 7 * 8, 0.0f);
  EXPECT_THROW((void)constant_patch_tokens(px.data(), 1, 7, 8, TokenGrid{1, 2, 2}), UsageError);
  EXPECT_THROW((void)constant_patch_tokens(px.data(), 1, 7, 8, TokenGrid{1, 14, 8}), UsageError);
}

/// A synthetic dump (CLS + 7 x 7 grid, 2 x 2 patches of a 14 x 14 one-channel image) with /images:
/// image i has a flat background and noise in the cells (r, c) with (r + c + i) % 3 != 0, so each
/// image has other constant patches; optionally without /images.
class TokenFilterDump : public test::ScratchDirTest {
 protected:
  SynthOptions opts() const {
    SynthOptions o;
    o.layers = 2;
    o.heads = 2;
    o.head_dim = 8;
    o.images = 5;
    o.seed = 4;
    o.plant_collinear = 6;
    o.plant_shifted = 6;
    o.plant_hyperplane = true;
    return o;
  }

  MatF images_of(int n) const {
    MatF px = MatF::Constant(n, 14 * 14, -0.42f);
    for (int i = 0; i < n; ++i) {
      for (int y = 0; y < 14; ++y) {
        for (int x = 0; x < 14; ++x) {
          if ((y / 2 + x / 2 + i) % 3 != 0)
            px(i, y * 14 + x) = 0.01f * static_cast<float>((y * 14 + x) * (i + 1) % 97);
        }
      }
    }
    return px;
  }

  std::string write(const std::string& name, bool with_images, int first = 0,
                    int count = -1) const {
    const SynthOptions o = opts();
    const int n = count < 0 ? o.images : count;
    DumpWriter w(path(name), o.attributes(), DumpWriterOptions{});
    for (int i = 0; i < n; ++i) w.append(synth_image(o, first + i));
    if (with_images) w.set_images(images_of(first + n).bottomRows(n), {1, 14, 14});
    w.close();
    return path(name);
  }

  /// Writes dataset `name` of `dims` into an existing file: `file_type` in the file, the values
  /// given as `mem_type`.
  static void add_dataset(const std::string& file, const std::string& name, hid_t file_type,
                          hid_t mem_type, const std::vector<hsize_t>& dims, const void* data) {
    const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0) << file;
    const hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(f, name.c_str(), file_type, space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << name;
    ASSERT_GE(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0) << name;
    H5Dclose(ds);
    H5Sclose(space);
    H5Pclose(lcpl);
    ASSERT_GE(H5Fclose(f), 0);
  }

  static std::vector<unsigned char> pattern(int images, int tokens) {
    std::vector<unsigned char> m(static_cast<std::size_t>(images * tokens));
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = (i * 7 + i / 5) % 3 == 0 ? 1 : 0;
    return m;
  }
};

TEST_F(TokenFilterDump, ConstantPatchesOfTheSelectedImagesInTheirOrder) {
  const std::string file = write("d.h5", true);
  DumpReader reader(file);
  const TokenFilter filter = parse_token_filter("constant-patch");
  const std::vector<ExcludedTokens> got = excluded_tokens(reader, filter, {3, 0, 4});
  const MatF px = images_of(5);
  const TokenGrid grid = opts().grid;
  ASSERT_EQ(got.size(), 3U);
  for (std::size_t s = 0; s < 3; ++s) {
    const int image = std::vector<int>{3, 0, 4}[s];
    const ExcludedTokens want = constant_patch_tokens(px.row(image).data(), 1, 14, 14, grid);
    EXPECT_EQ(got[s], want) << "image " << image;
    // By construction: the cells (r, c) with (r + c + image) % 3 == 0 are the constant ones.
    int constant = 0;
    for (int r = 0; r < 7; ++r) {
      for (int c = 0; c < 7; ++c) constant += (r + c + image) % 3 == 0 ? 1 : 0;
    }
    EXPECT_EQ(excluded_count(got[s]), constant) << "image " << image;
  }
  EXPECT_TRUE(excluded_tokens(reader, parse_token_filter("none"), {1, 2})[1].empty());
}

TEST_F(TokenFilterDump, SeveralFilesReadAsOneDumpGiveEachImageItsOwnMask) {
  const std::string whole = write("whole.h5", true);
  const std::string a = write("a.h5", true, 0, 2), b = write("b.h5", true, 2, 3);
  const std::vector<unsigned char> mask = pattern(5, 50);
  add_dataset(whole, "/token_masks/m", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {5, 50}, mask.data());
  add_dataset(a, "/token_masks/m", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {2, 50}, mask.data());
  add_dataset(b, "/token_masks/m", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {3, 50}, mask.data() + 2 * 50);
  DumpReader one(whole), two(std::vector<std::string>{a, b});
  for (const char* spec : {"constant-patch", "mask:token_masks/m"}) {
    const TokenFilter filter = parse_token_filter(spec);
    EXPECT_EQ(excluded_tokens(one, filter, {4, 1, 2}), excluded_tokens(two, filter, {4, 1, 2}))
        << spec;
  }
  const std::vector<ExcludedTokens> got =
      excluded_tokens(two, parse_token_filter("mask:/token_masks/m"), {3});
  EXPECT_EQ(got[0], ExcludedTokens(mask.begin() + 3 * 50, mask.begin() + 4 * 50));
}

TEST_F(TokenFilterDump, ADumpWithoutImagesIsNamedWithTheDataset) {
  const std::string file = write("no_images.h5", false);
  DumpReader reader(file);
  const std::string what = message_of<InputError>(
      [&] { check_token_filter(reader, parse_token_filter("constant-patch")); });
  EXPECT_NE(what.find(file), std::string::npos) << what;
  EXPECT_NE(what.find("/images"), std::string::npos) << what;
  EXPECT_NE(what.find("found none"), std::string::npos) << what;
  EXPECT_NO_THROW(check_token_filter(reader, parse_token_filter("none")));
}

TEST_F(TokenFilterDump, MasksOfUint8AndBoolAreReadAndBadOnesNamed) {
  const std::string file = write("m.h5", false);
  const std::vector<unsigned char> mask = pattern(5, 50);
  add_dataset(file, "/token_masks/u8", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {5, 50}, mask.data());
  // h5py's numpy.bool_: an enum over int8 with FALSE = 0, TRUE = 1.
  const hid_t boolean = H5Tenum_create(H5T_STD_I8LE);
  const signed char no = 0, yes = 1;
  H5Tenum_insert(boolean, "FALSE", &no);
  H5Tenum_insert(boolean, "TRUE", &yes);
  add_dataset(file, "/token_masks/bool", boolean, boolean, {5, 50}, mask.data());
  H5Tclose(boolean);
  add_dataset(file, "/bad/shape", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {5, 49}, mask.data());
  add_dataset(file, "/bad/flat", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {250}, mask.data());
  const std::vector<std::int32_t> ints(mask.begin(), mask.end());
  add_dataset(file, "/bad/int32", H5T_STD_I32LE, H5T_NATIVE_INT32, {5, 50}, ints.data());
  const std::vector<float> floats(mask.begin(), mask.end());
  add_dataset(file, "/bad/float", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {5, 50}, floats.data());
  add_dataset(file, "/bad/int8", H5T_STD_I8LE, H5T_NATIVE_SCHAR, {5, 50}, mask.data());
  std::vector<unsigned char> two = mask;
  two[static_cast<std::size_t>(1 * 50 + 3)] = 2;
  add_dataset(file, "/bad/value", H5T_STD_U8LE, H5T_NATIVE_UCHAR, {5, 50}, two.data());

  DumpReader reader(file);
  EXPECT_EQ(reader.read_token_masks("/token_masks/u8"), mask);
  EXPECT_EQ(reader.read_token_masks("token_masks/bool"), mask);
  const TokenFilter u8 = parse_token_filter("mask:token_masks/u8");
  const std::vector<ExcludedTokens> got = excluded_tokens(reader, u8, {2});
  EXPECT_EQ(got[0], ExcludedTokens(mask.begin() + 100, mask.begin() + 150));

  struct Bad {
    const char* dataset;
    const char* says;
  };
  for (const Bad& bad :
       {Bad{"/bad/shape", "expected shape [5, 50]"}, Bad{"/bad/flat", "found [250]"},
        Bad{"/bad/int32", "expected dtype bool or uint8"},
        Bad{"/bad/float", "expected dtype bool or uint8"},
        Bad{"/bad/int8", "expected dtype bool or uint8"},
        Bad{"/bad/value", "2 at image 1, token 3"}, Bad{"/token_masks/absent", "found none"},
        Bad{"/bad", "expected a dataset"}}) {
    const TokenFilter filter = parse_token_filter(std::string("mask:") + bad.dataset);
    const std::string what = message_of<InputError>([&] { check_token_filter(reader, filter); });
    EXPECT_NE(what.find(file), std::string::npos) << bad.dataset << ": " << what;
    EXPECT_NE(what.find(bad.dataset), std::string::npos) << bad.dataset << ": " << what;
    EXPECT_NE(what.find(bad.says), std::string::npos) << bad.dataset << ": " << what;
  }
}

/// Brute force over one head: the pairs i < j of kept tokens, decided with the definitions of
/// confusion.hpp (rows within eps, raw queries apart; two degenerate rows: raw queries apart).
HeadConfusion kept_pairs(const Variant& v, const MatF& q, const MatF& k, double scale,
                         const ExcludedTokens& excluded, const ConfusionOptions& opt) {
  const ExactRows rows(v, q, k, scale);
  const int n = rows.tokens(), d = static_cast<int>(q.cols());
  const MatD qd = q.cast<double>();
  HeadConfusion out;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (excluded[static_cast<std::size_t>(i)] || excluded[static_cast<std::size_t>(j)]) continue;
      const bool differ =
          squared_distance(qd.row(i).data(), qd.row(j).data(), d) > opt.query_eps * opt.query_eps;
      if (rows.degenerate(i) && rows.degenerate(j)) {
        out.degenerate_pairs += differ ? 1 : 0;
      } else if (!rows.degenerate(i) && !rows.degenerate(j)) {
        const VecD a = rows.row(i), b = rows.row(j);
        out.pairs += differ && squared_distance(a.data(), b.data(), n) <= opt.eps * opt.eps ? 1 : 0;
      }
    }
  }
  return out;
}

TEST_F(TokenFilterDump, StreamedRunCountsExactlyThePairsOfKeptTokens) {
  const std::string file = write("run.h5", true);
  const SynthOptions o = opts();
  std::int64_t removed = 0, kept = 0;
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala"}) {
    const std::vector<Variant> vs{parse_variant(spec)};
    for (bool reference : {false, true}) {
      DumpReader reader(file);
      const Selection sel = resolve(reader.schema(), Selection{});
      ConfusionOptions opt;
      opt.exclude = parse_token_filter("constant-patch");
      std::vector<ConfusionImage> images;
      confusion_images(reader, sel, vs, opt, reference,
                       [&](ConfusionImage&& img) { images.push_back(std::move(img)); });
      ASSERT_EQ(images.size(), 5U) << spec;
      const MatF px = images_of(5);
      ConfusionOptions plain;
      for (const ConfusionImage& img : images) {
        const ExcludedTokens excluded =
            constant_patch_tokens(px.row(img.image).data(), 1, 14, 14, o.grid);
        EXPECT_EQ(img.excluded_tokens, excluded_count(excluded)) << spec << " image " << img.image;
        const ImageQKV qkv = reader.read_image(img.image, {}, false);
        for (int slot = 0; slot < o.layers * o.heads; ++slot) {
          const int layer = slot / o.heads, head = slot % o.heads;
          const std::string at = std::string(spec) + (reference ? " --reference" : "") + " image " +
                                 std::to_string(img.image) + " layer " + std::to_string(layer) +
                                 " head " + std::to_string(head);
          const HeadConfusion want =
              kept_pairs(vs[0], qkv.Q(layer, head), qkv.K(layer, head), o.scale(), excluded, opt);
          const HeadConfusion& got = img.heads[0][static_cast<std::size_t>(slot)];
          EXPECT_EQ(got.pairs, want.pairs) << at;
          EXPECT_EQ(got.degenerate_pairs, want.degenerate_pairs) << at;
          const HeadConfusion all = count_confusion(vs[0], qkv.Q(layer, head), qkv.Q(layer, head),
                                                    qkv.K(layer, head), o.scale(), plain);
          EXPECT_EQ(got.degenerate_rows, all.degenerate_rows)
              << at << ": degenerate rows counted whatever the filter";
          removed += all.pairs - got.pairs;
          kept += got.pairs;
        }
      }
    }
  }
  // The check can fail: the planted pairs give confused pairs on both sides of the filter.
  EXPECT_GT(removed, 0) << "pairs with a constant-patch token";
  EXPECT_GT(kept, 0) << "pairs of kept tokens";
}

}  // namespace
}  // namespace attnscope::analyses
