// The dump reader's fast paths: float16 read as raw bits and widened by half_to_float must give
// exactly what HDF5's own half-to-float conversion gives, for every bit pattern; reading without
// V must give the same Q and K as reading with it; blocks read straight from the file (by the
// reader, or later by the thread that computes the head) must give HDF5's values and errors, at
// the places the chunk index gives.
#include "scratch_dir.hpp"
#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/half.hpp"
#include "hdf5_util.hpp"

#include "random_inputs.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace attnscope {
namespace {

namespace fs = std::filesystem;

constexpr std::uint32_t kPatterns = 1U << 16;

/// IEEE half in little-endian order, built the way h5py builds numpy.float16.
hid_t make_half_type() {
  const hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  H5Tset_fields(t, 15, 10, 5, 0, 10);
  H5Tset_size(t, 2);
  H5Tset_ebias(t, 15);
  return t;
}

/// HDF5's own conversion of every half bit pattern (index = pattern) to native float.
std::vector<float> hdf5_widened_patterns() {
  std::vector<float> buf(kPatterns);  // H5Tconvert converts in place: room for the wider type
  auto* bits = reinterpret_cast<std::uint16_t*>(buf.data());
  for (std::uint32_t p = 0; p < kPatterns; ++p) bits[p] = static_cast<std::uint16_t>(p);
  const hid_t half = make_half_type();
  const herr_t rc = H5Tconvert(half, H5T_NATIVE_FLOAT, kPatterns, buf.data(), nullptr, H5P_DEFAULT);
  H5Tclose(half);
  EXPECT_GE(rc, 0) << "H5Tconvert half -> float failed";
  return buf;
}

bool is_half_finite(std::uint32_t p) { return ((p >> 10) & 0x1fU) != 0x1fU; }

std::string hex(std::uint32_t x) {
  char s[16];
  std::snprintf(s, sizeof s, "0x%08x", x);
  return s;
}

TEST(HalfToFloat, MatchesHdf5ForEveryBitPattern) {
  const std::vector<float> want = hdf5_widened_patterns();
  int mismatches = 0;
  for (std::uint32_t p = 0; p < kPatterns; ++p) {
    const float got = half_to_float(static_cast<std::uint16_t>(p));
    const float ref = want[p];
    if (std::isnan(ref)) {  // NaN payload details are not compared, NaN-ness and sign are
      if (!std::isnan(got) || std::signbit(got) != std::signbit(ref)) ++mismatches;
      EXPECT_TRUE(std::isnan(got)) << "half " << hex(p) << ": HDF5 gives NaN, got " << got;
      continue;
    }
    if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(ref)) {
      ++mismatches;
      ADD_FAILURE() << "half " << hex(p) << ": HDF5 gives " << ref << " ("
                    << hex(std::bit_cast<std::uint32_t>(ref)) << "), half_to_float " << got << " ("
                    << hex(std::bit_cast<std::uint32_t>(got)) << ")";
      if (mismatches > 20) break;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << kPatterns << " half bit patterns";
}

TEST(HalfToFloat, TextbookValues) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0F);
  EXPECT_EQ(half_to_float(0xc000), -2.0F);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0F);         // largest half
  EXPECT_EQ(half_to_float(0x0400), 0x1.0p-14F);       // smallest normal
  EXPECT_EQ(half_to_float(0x0001), 0x1.0p-24F);       // smallest subnormal
  EXPECT_EQ(half_to_float(0x03ff), 1023 * 0x1.0p-24F);  // largest subnormal
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)) && half_to_float(0x8000) == 0.0F);
  EXPECT_EQ(half_to_float(0xfc00), -INFINITY);
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(half_to_float(0x7c01)));  // signalling payload stays NaN
}

class DumpFastRead : public test::ScratchDirTest {};

DumpAttributes attrs(int layers, int heads, int height, int width, int d) {
  DumpAttributes a;
  a.model_name = "fast_read";
  a.num_layers = layers;
  a.num_heads = heads;
  a.head_dim = d;
  a.grid = TokenGrid{1, height, width};  // prefix, height, width
  a.num_tokens = a.grid.tokens();
  a.scale = 1.0 / std::sqrt(static_cast<double>(d));
  return a;
}

/// One image whose Q holds `values` in file order (head, token, dim) and whose K holds them
/// reversed; the tail past the values is zero. V is a constant.
ImageQKV image_of(const DumpAttributes& a, const std::vector<float>& values) {
  ImageQKV img;
  img.image = 0;
  img.heads = a.num_heads;
  img.layers = {0};
  const Eigen::Index n = a.num_tokens, d = a.head_dim;
  std::size_t at = 0;
  for (int h = 0; h < a.num_heads; ++h) {
    MatF q = MatF::Zero(n, d), k = MatF::Zero(n, d);
    for (Eigen::Index i = 0; i < q.size(); ++i, ++at) {
      if (at < values.size()) {
        q.data()[i] = values[at];
        k.data()[i] = values[values.size() - 1 - at];
      }
    }
    img.q.push_back(q);
    img.k.push_back(k);
    img.v.push_back(MatF::Constant(n, d, 0.5F));
  }
  return img;
}

/// The dataset as HDF5 reads it into `mem_type` (conversion by HDF5), whole.
template <typename T>
std::vector<T> h5_read(const std::string& file, const char* name, hid_t mem_type, std::size_t n) {
  std::vector<T> out(n);
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
  EXPECT_GE(H5Dread(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()), 0) << file << name;
  H5Dclose(ds);
  H5Fclose(f);
  return out;
}

TEST_F(DumpFastRead, EveryFiniteHalfReadsAsHdf5ConvertsIt) {
  // Every finite half pattern (63488) fits in 4 heads x 257 tokens x 64 dims.
  const DumpAttributes a = attrs(1, 4, 16, 16, 64);
  const std::vector<float> widened = hdf5_widened_patterns();
  std::vector<float> values;
  std::vector<std::uint16_t> patterns;
  for (std::uint32_t p = 0; p < kPatterns; ++p) {
    if (!is_half_finite(p)) continue;
    values.push_back(widened[p]);
    patterns.push_back(static_cast<std::uint16_t>(p));
  }
  const std::size_t total = static_cast<std::size_t>(a.num_heads) * 257 * 64;
  ASSERT_GE(total, values.size());
  for (const int compression : {0, 1}) {
    const std::string p = path("all_halves_gzip" + std::to_string(compression) + ".h5");
    DumpWriterOptions o;
    o.dtype = DType::F16;
    o.compression = compression;
    DumpWriter w(p, a, o);
    w.append(image_of(a, values));
    w.close();

    // The file holds every pattern (the writer rounds exactly representable values to themselves).
    const hid_t half = make_half_type();
    const auto stored = h5_read<std::uint16_t>(p, "/layers/0/q", half, total);
    H5Tclose(half);
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      ASSERT_EQ(stored[i], patterns[i]) << "gzip " << compression << ": element " << i;
    }

    DumpReader r(p);
    const ImageQKV img = r.read_image(0);
    for (const char* name : {"/layers/0/q", "/layers/0/k"}) {
      const auto ref = h5_read<float>(p, name, H5T_NATIVE_FLOAT, total);
      const std::vector<MatF>& got = name[10] == 'q' ? img.q : img.k;
      int bad = 0;
      for (std::size_t i = 0; i < total; ++i) {
        const std::size_t per_head = 257 * 64;
        const float g = got[i / per_head].data()[i % per_head];
        if (std::bit_cast<std::uint32_t>(g) != std::bit_cast<std::uint32_t>(ref[i]) && ++bad <= 5) {
          ADD_FAILURE() << "gzip " << compression << " " << name << " element " << i << ": read "
                        << g << ", HDF5 converts to " << ref[i];
        }
      }
      EXPECT_EQ(bad, 0) << "gzip " << compression << " " << name;
    }
  }
}

/// A random dump (N = 50, d = 7) in the given dtype, gzip level `compression` (0: none).
std::string random_dump(const std::string& p, DType dtype, int images, int compression = 1) {
  const DumpAttributes a = attrs(3, 2, 7, 7, 7);
  DumpWriterOptions o;
  o.dtype = dtype;
  o.compression = compression;
  DumpWriter w(p, a, o);
  test::Normal rng(11);
  for (int i = 0; i < images; ++i) {
    ImageQKV img;
    img.image = i;
    img.heads = a.num_heads;
    img.layers = {0, 1, 2};
    for (int s = 0; s < a.num_layers * a.num_heads; ++s) {
      for (auto* set : {&img.q, &img.k, &img.v}) {
        MatF m(a.num_tokens, a.head_dim);
        for (Eigen::Index e = 0; e < m.size(); ++e) m.data()[e] = static_cast<float>(rng());
        set->push_back(m);
      }
    }
    w.append(img);
  }
  w.close();
  return p;
}

TEST_F(DumpFastRead, WithoutVGivesTheSameQAndK) {
  for (const DType dt : {DType::F32, DType::F16}) {
    const std::string tag = dt == DType::F16 ? "float16" : "float32";
    DumpReader r(random_dump(path(tag + ".h5"), dt, 3));
    for (const std::vector<int>& layers : {std::vector<int>{}, std::vector<int>{2, 0}}) {
      for (int i = 0; i < 3; ++i) {
        const ImageQKV with = r.read_image(i, layers, true);
        const ImageQKV without = r.read_image(i, layers, false);
        const std::string where = tag + " image " + std::to_string(i) + " layers " +
                                  std::to_string(with.layers.size());
        ASSERT_EQ(without.layers, with.layers) << where;
        ASSERT_EQ(without.q.size(), with.q.size()) << where;
        ASSERT_EQ(without.v.size(), with.v.size()) << where << ": one (empty) V per slot";
        for (std::size_t s = 0; s < with.q.size(); ++s) {
          EXPECT_TRUE(without.q[s] == with.q[s]) << where << " slot " << s << ": Q";
          EXPECT_TRUE(without.k[s] == with.k[s]) << where << " slot " << s << ": K";
          EXPECT_EQ(without.v[s].size(), 0) << where << " slot " << s << ": V not read";
          EXPECT_EQ(with.v[s].rows(), 50) << where << " slot " << s << ": V read";
        }
      }
    }
  }
}

TEST_F(DumpFastRead, ForEachHeadHonoursNeedV) {
  DumpReader r(random_dump(path("loop.h5"), DType::F32, 2));
  analyses::Selection sel = analyses::resolve(r.schema(), {});
  sel.need_v = false;
  std::mutex m;
  std::map<std::tuple<int, int, int>, std::pair<MatF, MatF>> seen;  // (image, layer, head) -> Q, K
  analyses::for_each_head(r, sel, [&](const analyses::HeadView& h) {
    const std::lock_guard lock(m);
    EXPECT_EQ(h.v.size(), 0) << "image " << h.image << " layer " << h.layer << " head " << h.head;
    seen[{h.image, h.layer, h.head}] = {h.q, h.k};
  });
  ASSERT_EQ(seen.size(), 2U * 3U * 2U);
  for (const auto& [key, qk] : seen) {
    const auto [image, layer, head] = key;
    const ImageQKV full = r.read_image(image);
    EXPECT_TRUE(qk.first == full.Q(layer, head)) << "image " << image << " layer " << layer
                                                 << " head " << head << ": Q";
    EXPECT_TRUE(qk.second == full.K(layer, head)) << "image " << image << " layer " << layer
                                                  << " head " << head << ": K";
  }
}


/// Rewrites /layers/L/q, k and v of a dump with another layout or file type (`dcpl` decides the
/// layout; `file_type` the stored type), keeping their values; `images_written` < the dataset's
/// images leaves the chunks of the rest unallocated (an extensible dataset read as fill values).
void relayout(const std::string& p, int layers, hid_t file_type, const std::function<void(hid_t, const std::vector<hsize_t>&)>& dcpl_of,
              hsize_t images_written = 0) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  for (int l = 0; l < layers; ++l) {
    for (const char* kind : {"q", "k", "v"}) {
      const std::string name = "/layers/" + std::to_string(l) + "/" + kind;
      const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
      const hid_t space = H5Dget_space(ds);
      std::vector<hsize_t> dims(static_cast<std::size_t>(H5Sget_simple_extent_ndims(space)));
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      std::size_t n = 1;
      for (hsize_t x : dims) n *= static_cast<std::size_t>(x);
      std::vector<float> values(n);
      ASSERT_GE(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0) << name;
      H5Sclose(space);
      H5Dclose(ds);
      ASSERT_GE(H5Ldelete(f, name.c_str(), H5P_DEFAULT), 0) << name;
      const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
      dcpl_of(dcpl, dims);
      std::vector<hsize_t> maxdims(dims);
      if (images_written > 0) maxdims[0] = H5S_UNLIMITED;
      const hid_t new_space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), maxdims.data());
      const hid_t out = H5Dcreate2(f, name.c_str(), file_type, new_space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      ASSERT_GE(out, 0) << name;
      hid_t file_sel = H5S_ALL, mem_sel = H5S_ALL;
      if (images_written > 0) {
        std::vector<hsize_t> count(dims);
        count[0] = images_written;
        std::vector<hsize_t> start(dims.size(), 0);
        file_sel = H5Scopy(new_space);
        H5Sselect_hyperslab(file_sel, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
        mem_sel = H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
      }
      ASSERT_GE(H5Dwrite(out, H5T_NATIVE_FLOAT, mem_sel, file_sel, H5P_DEFAULT, values.data()), 0) << name;
      if (images_written > 0) {
        H5Sclose(file_sel);
        H5Sclose(mem_sel);
      }
      H5Sclose(new_space);
      H5Pclose(dcpl);
      H5Dclose(out);
    }
  }
  H5Fclose(f);
}

// Uncompressed float32 blocks are read straight from the file (DumpReader::direct_reads), every
// other layout through HDF5: both give exactly the values written, and each layout takes the path
// it should (so that the comparison compares the direct reads themselves).
TEST_F(DumpFastRead, DirectReadsGiveHdf5sValuesAndOnlyWhereTheLayoutAllows) {
  constexpr int kImages = 3, kLayers = 3;
  const std::string original = random_dump(path("direct_original.h5"), DType::F32, kImages, 0);
  std::vector<ImageQKV> want;
  {
    DumpReader r(original);
    for (int i = 0; i < kImages; ++i) want.push_back(r.read_image(i));
  }
  const auto chunk = [](hsize_t images, bool split) {
    return [images, split](hid_t dcpl, const std::vector<hsize_t>& dims) {
      std::vector<hsize_t> c(dims);
      c[0] = images;
      if (split) c[1] = 1;  // one head per chunk: an image's block spans chunks
      H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    };
  };
  const auto contiguous = [](hid_t dcpl, const std::vector<hsize_t>&) { H5Pset_layout(dcpl, H5D_CONTIGUOUS); };
  const auto gzip = [](hid_t dcpl, const std::vector<hsize_t>& dims) {
    std::vector<hsize_t> c(dims);
    c[0] = 1;
    H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    H5Pset_deflate(dcpl, 1);
  };
  struct Case {
    const char* name;
    std::function<void(hid_t, const std::vector<hsize_t>&)> dcpl;
    hid_t type;
    hsize_t images_written;
    int direct_images;  // images whose blocks are read directly
  };
  const std::vector<Case> cases = {
      {"as written (a chunk per image)", nullptr, H5T_IEEE_F32LE, 0, kImages},
      {"contiguous", contiguous, H5T_IEEE_F32LE, 0, kImages},
      {"two images per chunk, the last chunk half used", chunk(2, false), H5T_IEEE_F32LE, 0, kImages},
      {"a chunk per head", chunk(1, true), H5T_IEEE_F32LE, 0, 0},
      {"gzip", gzip, H5T_IEEE_F32LE, 0, 0},
      {"big-endian float32", contiguous, H5T_IEEE_F32BE, 0, 0},
      {"the last image's chunk never written", chunk(1, false), H5T_IEEE_F32LE, 2, 2},
  };
  for (const Case& c : cases) {
    const std::string p = path(std::string("direct_") + std::to_string(&c - cases.data()) + ".h5");
    fs::copy_file(original, p, fs::copy_options::overwrite_existing);
    if (c.dcpl) relayout(p, kLayers, c.type, c.dcpl, c.images_written);
    DumpReader r(p);
    for (int i = 0; i < kImages; ++i) {
      const ImageQKV got = r.read_image(i);
      for (std::size_t s = 0; s < want[static_cast<std::size_t>(i)].q.size(); ++s) {
        const bool unwritten = c.images_written > 0 && i >= static_cast<int>(c.images_written);
        const ImageQKV& w = want[static_cast<std::size_t>(i)];
        const std::string where = std::string(c.name) + ": image " + std::to_string(i) + " slot " + std::to_string(s);
        if (unwritten) {  // HDF5's fill value
          EXPECT_TRUE(got.q[s].isZero(0.0F) && got.k[s].isZero(0.0F) && got.v[s].isZero(0.0F)) << where;
          continue;
        }
        EXPECT_TRUE(got.q[s] == w.q[s]) << where << ": Q";
        EXPECT_TRUE(got.k[s] == w.k[s]) << where << ": K";
        EXPECT_TRUE(got.v[s] == w.v[s]) << where << ": V";
      }
    }
    EXPECT_EQ(r.direct_reads(), static_cast<std::size_t>(c.direct_images) * kLayers * 3) << c.name;
    // The same blocks left for the computing threads (read_image_into with defer_direct): the
    // direct ones are recorded, not read, and read_deferred reads each head to the same values;
    // the others are read at once, as without it.
    DumpReader deferring(p);
    for (int i = 0; i < kImages; ++i) {
      ImageQKV img;
      deferring.read_image_into(img, i, {}, true, true);
      const bool direct = i < c.direct_images;
      ASSERT_EQ(img.deferred.size(), static_cast<std::size_t>(kLayers) * 3) << c.name;
      for (const DeferredBlock& b : img.deferred) EXPECT_EQ(b.fd >= 0, direct) << c.name << " " << b.dataset;
      const bool unwritten = c.images_written > 0 && i >= static_cast<int>(c.images_written);
      // read_deferred_into: a thread's own matrices get the head, the image's are not even sized.
      for (int s = 0; s < kLayers && !unwritten; ++s) {
        for (int h = 0; h < img.heads; ++h) {
          const std::size_t at = static_cast<std::size_t>(s * img.heads + h);
          const std::string where = std::string(c.name) + ", into: image " + std::to_string(i) + " slot " +
                                    std::to_string(s) + " head " + std::to_string(h);
          MatF own[3];
          MatF* const to[3] = {&own[0], &own[1], &own[2]};
          const unsigned read = img.read_deferred_into(s, h, to);
          EXPECT_EQ(read, direct ? 7U : 0U) << where;
          if (!direct) continue;
          EXPECT_EQ(img.q[at].size(), 0) << where << ": the image's Q was sized";
          const ImageQKV& w = want[static_cast<std::size_t>(i)];
          EXPECT_TRUE(own[0] == w.q[at]) << where << ": Q";
          EXPECT_TRUE(own[1] == w.k[at]) << where << ": K";
          EXPECT_TRUE(own[2] == w.v[at]) << where << ": V";
        }
      }
      for (int s = 0; s < kLayers; ++s) {
        for (int h = 0; h < img.heads; ++h) img.read_deferred(s, h);
      }
      for (std::size_t s = 0; s < img.q.size() && !unwritten; ++s) {
        const ImageQKV& w = want[static_cast<std::size_t>(i)];
        const std::string where = std::string(c.name) + ", deferred: image " + std::to_string(i) + " slot " + std::to_string(s);
        EXPECT_TRUE(img.q[s] == w.q[s]) << where << ": Q";
        EXPECT_TRUE(img.k[s] == w.k[s]) << where << ": K";
        EXPECT_TRUE(img.v[s] == w.v[s]) << where << ": V";
      }
    }
  }
}

// h5::chunk_location (the chunk index, through the checked driver) finds every chunk where HDF5's
// walk of the chunks (H5Dget_chunk_info_by_coord) finds it, in each chunked layout, reads nothing
// into the buffer it is handed, and says false for a chunk never written; a file opened without
// the checked driver is known as such (DumpReader then takes the walk).
TEST_F(DumpFastRead, ChunkLocationsFromTheIndexAreTheChunkWalks) {
  constexpr int kImages = 5, kLayers = 3;
  const std::string original = random_dump(path("located_original.h5"), DType::F32, kImages, 0);
  const auto chunk = [](hsize_t images) {
    return [images](hid_t dcpl, const std::vector<hsize_t>& dims) {
      std::vector<hsize_t> c(dims);
      c[0] = images;
      H5Pset_chunk(dcpl, static_cast<int>(c.size()), c.data());
    };
  };
  struct Case {
    const char* name;
    std::function<void(hid_t, const std::vector<hsize_t>&)> dcpl;
    hsize_t images_written;
  };
  const std::vector<Case> cases = {{"as written (a chunk per image)", nullptr, 0},
                                   {"two images per chunk", chunk(2), 0},
                                   {"the last two images never written", chunk(1), 3}};
  int located = 0;
  for (const Case& c : cases) {
    const std::string p = path(std::string("located_") + std::to_string(&c - cases.data()) + ".h5");
    fs::copy_file(original, p, fs::copy_options::overwrite_existing);
    if (c.dcpl) relayout(p, kLayers, H5T_IEEE_F32LE, c.dcpl, c.images_written);
    const h5::Handle fapl = h5::checked_read_fapl();
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, fapl.get());
    ASSERT_GE(f, 0) << p;
    ASSERT_TRUE(h5::reads_through_checked_driver(f)) << c.name;
    for (int l = 0; l < kLayers; ++l) {
      for (const char* kind : {"q", "k", "v"}) {
        const std::string name = "/layers/" + std::to_string(l) + "/" + kind;
        const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
        const hid_t dcpl = H5Dget_create_plist(ds);
        std::vector<hsize_t> dims(4), cdims(4);
        const hid_t space = H5Dget_space(ds);
        H5Sget_simple_extent_dims(space, dims.data(), nullptr);
        H5Sclose(space);
        ASSERT_EQ(H5Pget_chunk(dcpl, 4, cdims.data()), 4) << name;
        H5Pclose(dcpl);
        std::size_t chunk_bytes = sizeof(float);
        for (hsize_t x : cdims) chunk_bytes *= static_cast<std::size_t>(x);
        std::vector<unsigned char> buf(chunk_bytes, 0xA5);
        for (hsize_t first = 0; first < dims[0]; first += cdims[0]) {
          const std::vector<hsize_t> coord = {first, 0, 0, 0};
          unsigned walk_filters = 0;
          haddr_t walk_addr = HADDR_UNDEF;
          hsize_t walk_size = 0;
          const bool walked = H5Dget_chunk_info_by_coord(ds, coord.data(), &walk_filters, &walk_addr, &walk_size) >= 0 &&
                              walk_addr != HADDR_UNDEF;
          H5Eclear2(H5E_DEFAULT);
          haddr_t addr = HADDR_UNDEF;
          std::size_t bytes = 0;
          unsigned filters = 99;
          const bool found = h5::chunk_location(ds, coord.data(), buf.data(), &addr, &bytes, &filters);
          const std::string where = std::string(c.name) + " " + name + " chunk at image " + std::to_string(first);
          EXPECT_EQ(found, walked) << where;
          if (found && walked) {
            ++located;
            EXPECT_EQ(addr, walk_addr) << where;
            EXPECT_EQ(bytes, static_cast<std::size_t>(walk_size)) << where;
            EXPECT_EQ(filters, walk_filters) << where;
          }
          EXPECT_TRUE(std::all_of(buf.begin(), buf.end(), [](unsigned char b) { return b == 0xA5; }))
              << where << ": the buffer was written";
        }
        H5Dclose(ds);
      }
    }
    H5Fclose(f);
  }
  EXPECT_EQ(located, (5 + 3 + 3) * kLayers * 3);  // chunks per case: 5, 3 (2+2+1), 3 written of 5
  const hid_t plain = H5Fopen(original.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(plain, 0);
  EXPECT_FALSE(h5::reads_through_checked_driver(plain));
  H5Fclose(plain);
}

/// Writes `value` at (image, head, token, dim) of /layers/`layer`/`kind`.
void poke(const std::string& p, int layer, const char* kind, const std::vector<hsize_t>& at, float value) {
  const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << p;
  const std::string name = "/layers/" + std::to_string(layer) + "/" + kind;
  const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
  const hid_t space = H5Dget_space(ds);
  const std::vector<hsize_t> one(at.size(), 1);
  H5Sselect_hyperslab(space, H5S_SELECT_SET, at.data(), nullptr, one.data(), nullptr);
  const hsize_t n = 1;
  const hid_t mem = H5Screate_simple(1, &n, nullptr);
  EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &value), 0) << name;
  H5Sclose(mem);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
}

// A NaN in a head read by its computing thread is the same InputError, word for word, as when the
// reader reads it: file, dataset, image, head, token and dim. Heads before it read as usual.
TEST_F(DumpFastRead, ADeferredHeadWithANanIsTheReadersInputError) {
  const std::string p = random_dump(path("deferred_nan.h5"), DType::F32, 2, 0);
  poke(p, 1, "k", {1, 1, 5, 3}, std::numeric_limits<float>::quiet_NaN());
  DumpReader r(p);
  std::string want;
  try {
    (void)r.read_image(1);
  } catch (const InputError& e) {
    want = e.what();
  }
  ASSERT_NE(want.find("/layers/1/k"), std::string::npos) << want;
  ImageQKV img;
  r.read_image_into(img, 1, {}, true, true);  // finds nothing wrong: nothing read yet
  for (int s = 0; s < 3; ++s) {
    for (int h = 0; h < img.heads; ++h) {
      if (s == 1 && h == 1) {
        try {
          img.read_deferred(s, h);
          ADD_FAILURE() << "the NaN was not found";
        } catch (const InputError& e) {
          EXPECT_EQ(std::string(e.what()), want);
        }
      } else {
        EXPECT_NO_THROW(img.read_deferred(s, h)) << "slot " << s << " head " << h;
      }
    }
  }
}

// A file cut short while a reader has it open (another process truncating it): the direct read
// finds the end of the file and says so, naming the file and dataset; nothing crashes.
TEST_F(DumpFastRead, AFileTruncatedUnderTheReaderIsAnInputError) {
  const std::string p = random_dump(path("truncated_later.h5"), DType::F32, 3, 0);
  DumpReader r(p);
  ASSERT_NO_THROW((void)r.read_image(0));
  ASSERT_GT(r.direct_reads(), 0U) << "the direct path is the one under test";
  ImageQKV deferred;
  r.read_image_into(deferred, 2, {}, true, true);  // before the cut: only where the heads lie
  fs::resize_file(p, fs::file_size(p) / 3);
  try {
    (void)r.read_image(2);
    FAIL() << "reading past the end of the truncated file succeeded";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(p), std::string::npos) << what;
    EXPECT_NE(what.find("/layers/"), std::string::npos) << what;
  }
  // The same for a head left to its computing thread: the cut falls in the last layer's blocks.
  try {
    deferred.read_deferred(2, 1);
    FAIL() << "a deferred read past the end of the truncated file succeeded";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(p), std::string::npos) << what;
    EXPECT_NE(what.find("/layers/2/"), std::string::npos) << what;
    EXPECT_NE(what.find("the end of the file"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace attnscope
