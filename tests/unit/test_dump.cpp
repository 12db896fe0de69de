// DumpReader / DumpWriter: round trips (float32, float16, optional datasets), streaming reads of a
// layer subset, every malformed file -> the right InputError, and atomic writes.
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"
#include "scratch_dir.hpp"

#include "random_inputs.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace attnscope {
namespace {

namespace fs = std::filesystem;

/// float16 keeps 11 significant bits: rounding to nearest moves a normal value by at most
/// 2^-11 of itself, a subnormal one by at most half the subnormal step 2^-24.
constexpr double kHalfRelTol = 0x1.0p-11;
constexpr double kHalfAbsTol = 0x1.0p-25;

DumpAttributes small_attrs() {
  DumpAttributes a;
  a.model_name = "test_model";
  a.num_layers = 3;
  a.num_heads = 2;
  a.head_dim = 5;
  a.grid = TokenGrid{1, 2, 3};
  a.num_tokens = a.grid.tokens();  // 7
  a.scale = 1.0 / std::sqrt(5.0);
  return a;
}

MatF random_mat(int rows, int cols, test::Normal& rng, double scale = 1.0) {
  MatF m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(scale * rng());
  return m;
}

ImageQKV random_image(const DumpAttributes& a, int image, std::uint64_t seed) {
  test::Normal rng(seed * 1000 + static_cast<std::uint64_t>(image));
  ImageQKV img;
  img.image = image;
  img.heads = a.num_heads;
  for (int l = 0; l < a.num_layers; ++l) img.layers.push_back(l);
  for (int s = 0; s < a.num_layers * a.num_heads; ++s) {
    img.q.push_back(random_mat(a.num_tokens, a.head_dim, rng));
    img.k.push_back(random_mat(a.num_tokens, a.head_dim, rng, 3.0));
    img.v.push_back(random_mat(a.num_tokens, a.head_dim, rng, 0.01));
  }
  return img;
}

class DumpTest : public test::ScratchDirTest {
 protected:
  /// Writes `n` random images with the given options; returns them.
  std::vector<ImageQKV> write_dump(const std::string& p, const DumpAttributes& a, int n,
                                   DumpWriterOptions o = {}) {
    std::vector<ImageQKV> imgs;
    DumpWriter w(p, a, o);
    for (int i = 0; i < n; ++i) {
      imgs.push_back(random_image(a, i, 7));
      w.append(imgs.back());
    }
    w.close();
    return imgs;
  }

  std::string valid_dump(const std::string& name = "valid.h5", int images = 3) {
    const std::string p = path(name);
    write_dump(p, small_attrs(), images);
    return p;
  }

  std::vector<std::string> files_in_dir() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

};

// --- raw HDF5 edits that make a valid file malformed -------------------------------------------

class RawFile {
 public:
  explicit RawFile(const std::string& p) : id_(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(id_, 0) << "cannot open " << p;
  }
  ~RawFile() { H5Fclose(id_); }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  hid_t id() const { return id_; }

  void delete_attr(const char* name) { EXPECT_GE(H5Adelete(id_, name), 0) << name; }
  void set_attr(const char* name, hid_t type, const void* value) {
    if (H5Aexists(id_, name) > 0) delete_attr(name);
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(id_, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(a, type, value), 0) << name;
    H5Aclose(a);
    H5Sclose(s);
  }
  void set_int(const char* name, std::int64_t v) { set_attr(name, H5T_NATIVE_INT64, &v); }
  void set_double(const char* name, double v) { set_attr(name, H5T_NATIVE_DOUBLE, &v); }
  void set_fixed_string(const char* name, const std::string& v) {
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, v.size() + 4);  // padded with NULs, as numpy's bytes_ would be
    std::string buf = v + std::string(4, '\0');
    set_attr(name, t, buf.data());
    H5Tclose(t);
  }
  /// A fixed-length string attribute on the group `group` ("/layers/1").
  void set_group_string(const std::string& group, const char* name, const std::string& v) {
    const hid_t g = H5Gopen2(id_, group.c_str(), H5P_DEFAULT);
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, v.size() + 1);
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(g, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(a, t, v.c_str()), 0) << group << " " << name;
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
    H5Gclose(g);
  }
  void unlink(const std::string& obj) {
    EXPECT_GE(H5Ldelete(id_, obj.c_str(), H5P_DEFAULT), 0) << obj;
  }
  /// Replaces a dataset by a new one of the given type and shape (filled with zeros).
  void replace(const std::string& obj, hid_t type, const std::vector<hsize_t>& dims) {
    if (H5Lexists(id_, obj.c_str(), H5P_DEFAULT) > 0) unlink(obj);
    const hid_t s = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t d = H5Dcreate2(id_, obj.c_str(), type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(d, 0) << obj;
    H5Dclose(d);
    H5Sclose(s);
  }

 private:
  hid_t id_;
};

/// Runs `body`; it must throw InputError naming `file` and `object` with `text` in the message,
/// and HDF5 must print nothing itself.
void expect_input_error(const std::string& file, const std::string& object, const std::string& text,
                        const std::function<void()>& body, const std::string& config) {
  ::testing::internal::CaptureStderr();
  try {
    body();
    const std::string err = ::testing::internal::GetCapturedStderr();
    ADD_FAILURE() << config << ": no InputError";
  } catch (const InputError& e) {
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(e.file(), file) << config << ": " << e.what();
    EXPECT_EQ(e.object(), object) << config << ": " << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
        << config << ": '" << text << "' not in: " << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << config << ": not one line";
    EXPECT_EQ(err, "") << config << ": something printed on stderr";
  } catch (const std::exception& e) {
    ::testing::internal::GetCapturedStderr();
    ADD_FAILURE() << config << ": wrong exception type: " << e.what();
  }
}

void open_only(const std::string& p) { DumpReader r(p); }

void read_everything(const std::string& p) {
  DumpReader r(p);
  for (int i = 0; i < r.schema().num_images; ++i) (void)r.read_image(i);
}

// --- round trips ---------------------------------------------------------------------------------

TEST_F(DumpTest, RoundTripFloat32IsExact) {
  const DumpAttributes a = small_attrs();
  const std::string p = path("f32.h5");
  const auto imgs = write_dump(p, a, 4);
  DumpReader r(p);
  const DumpSchema& s = r.schema();
  EXPECT_EQ(s.num_images, 4);
  EXPECT_EQ(s.dtype, DType::F32);
  EXPECT_EQ(s.attrs.model_name, "test_model");
  EXPECT_EQ(s.attrs.num_layers, 3);
  EXPECT_EQ(s.attrs.num_heads, 2);
  EXPECT_EQ(s.attrs.head_dim, 5);
  EXPECT_EQ(s.attrs.num_tokens, 7);
  EXPECT_EQ(s.attrs.grid.prefix, 1);
  EXPECT_EQ(s.attrs.grid.height, 2);
  EXPECT_EQ(s.attrs.grid.width, 3);
  EXPECT_EQ(s.attrs.scale, a.scale);
  EXPECT_EQ(s.attrs.attention_family, "softmax");
  EXPECT_FALSE(s.has_labels || s.has_logits || s.has_images);
  for (int i = 3; i >= 0; --i) {  // any order
    const ImageQKV got = r.read_image(i);
    ASSERT_EQ(got.layers, (std::vector<int>{0, 1, 2}));
    ASSERT_EQ(got.heads, 2);
    for (std::size_t slot = 0; slot < got.q.size(); ++slot) {
      const auto& want = imgs[static_cast<std::size_t>(i)];
      EXPECT_TRUE(got.q[slot] == want.q[slot]) << "image " << i << " slot " << slot;
      EXPECT_TRUE(got.k[slot] == want.k[slot]) << "image " << i << " slot " << slot;
      EXPECT_TRUE(got.v[slot] == want.v[slot]) << "image " << i << " slot " << slot;
    }
  }
}

TEST_F(DumpTest, RoundTripFloat16WithinRounding) {
  const DumpAttributes a = small_attrs();
  const std::string p = path("f16.h5");
  DumpWriterOptions o;
  o.dtype = DType::F16;
  const auto imgs = write_dump(p, a, 2, o);
  DumpReader r(p);
  EXPECT_EQ(r.schema().dtype, DType::F16);
  int checked = 0;
  for (int i = 0; i < 2; ++i) {
    const ImageQKV got = r.read_image(i);
    for (std::size_t slot = 0; slot < got.q.size(); ++slot) {
      for (auto [g, w] :
           {std::pair{&got.q[slot], &imgs[i].q[slot]}, std::pair{&got.k[slot], &imgs[i].k[slot]},
            std::pair{&got.v[slot], &imgs[i].v[slot]}}) {
        for (Eigen::Index e = 0; e < g->size(); ++e) {
          const double want = w->data()[e], have = g->data()[e];
          const double tol = std::max(std::abs(want) * kHalfRelTol, kHalfAbsTol);
          ASSERT_LE(std::abs(have - want), tol)
              << "image " << i << " slot " << slot << " element " << e << " want " << want;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 3 * 2 * 3 * 7 * 5);
}

TEST_F(DumpTest, Float16KeepsRepresentableValuesAndSpecialsExactly) {
  DumpAttributes a = small_attrs();
  a.num_layers = 1;
  a.num_heads = 1;
  a.grid = TokenGrid{0, 1, 2};
  a.num_tokens = 2;
  a.head_dim = 4;
  ImageQKV img;
  img.heads = 1;
  img.layers = {0};
  MatF q(2, 4);
  // 65504 = largest half, 2^-24 = smallest subnormal, 2^-14 = smallest normal, ties round to even.
  q << 65504.0f, 0x1.0p-24f, 0x1.0p-14f, -1.5f, 1.0f + 0x1.0p-11f, 1.0f + 0x1.8p-10f, 0.0f, -0.0f;
  img.q = {q};
  img.k = {q};
  img.v = {q};
  const std::string p = path("exact16.h5");
  DumpWriterOptions o;
  o.dtype = DType::F16;
  DumpWriter w(p, a, o);
  w.append(img);
  w.close();
  DumpReader r(p);
  const MatF got = r.read_image(0).Q(0, 0);
  MatF want = q;
  want(1, 0) = 1.0f;              // tie between 1 and 1 + 2^-10: even is 1
  want(1, 1) = 1.0f + 0x1.0p-9f;  // tie between 1 + 2^-10 and 1 + 2^-9: even is 1 + 2^-9
  EXPECT_TRUE(got == want) << "got\n" << got << "\nwant\n" << want;
}

TEST_F(DumpTest, Float16OverflowIsRefusedAndLeavesNoFile) {
  const DumpAttributes a = small_attrs();
  ImageQKV img = random_image(a, 0, 1);
  img.k[3](2, 1) = 70000.0f;
  const std::string p = path("overflow.h5");
  DumpWriterOptions o;
  o.dtype = DType::F16;
  {
    DumpWriter w(p, a, o);
    EXPECT_THROW(w.append(img), NumericalError);
  }
  EXPECT_TRUE(files_in_dir().empty()) << files_in_dir().front();
}

TEST_F(DumpTest, OptionalDatasetsRoundTrip) {
  const DumpAttributes a = small_attrs();
  const int L = a.num_layers, H = a.num_heads, N = a.num_tokens, d = a.head_dim, n = 3;
  const std::string p = path("optional.h5");
  test::Normal rng(11);
  DumpWriterOptions o;
  o.with_attn = true;
  o.with_out = true;
  std::vector<std::vector<MatF>> attn(n), out(n);
  std::vector<std::int64_t> labels{5, -1, 999};
  const MatF logits = random_mat(n, 4, rng);
  const MatF images = random_mat(n, 3 * 2 * 2, rng);
  {
    DumpWriter w(p, a, o);
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < L * H; ++s) {
        attn[i].push_back(random_mat(N, N, rng));
        out[i].push_back(random_mat(N, d, rng));
      }
      w.append(random_image(a, i, 3), &attn[i], &out[i]);
    }
    w.set_labels(labels);
    w.set_logits(logits);
    w.set_images(images, {3, 2, 2});
    w.close();
  }
  DumpReader r(p);
  const DumpSchema& s = r.schema();
  EXPECT_TRUE(s.has_labels && s.has_logits && s.has_images);
  EXPECT_EQ(s.layer_has_attn, std::vector<bool>(L, true));
  EXPECT_EQ(s.layer_has_out, std::vector<bool>(L, true));
  for (int i = 0; i < n; ++i) {
    for (int l = 0; l < L; ++l) {
      for (int h = 0; h < H; ++h) {
        const auto slot = static_cast<std::size_t>(l * H + h);
        EXPECT_TRUE(*r.read_attn(i, l, h) == attn[i][slot]) << "attn " << i << " " << l << " " << h;
        EXPECT_TRUE(*r.read_out(i, l, h) == out[i][slot]) << "out " << i << " " << l << " " << h;
      }
    }
  }
  EXPECT_EQ(r.read_labels(), labels);
  EXPECT_TRUE(r.read_logits() == logits);
  std::vector<int> shape;
  EXPECT_TRUE(r.read_images(&shape) == images);
  EXPECT_EQ(shape, (std::vector<int>{3, 2, 2}));
  const auto sets = r.datasets();
  ASSERT_EQ(sets.size(), static_cast<std::size_t>(L * 5 + 3));
  EXPECT_EQ(sets[3].name, "/layers/0/attn");
  EXPECT_EQ(sets[3].shape, (std::vector<std::uint64_t>{3, 2, 7, 7}));
  EXPECT_EQ(sets[0].chunks, (std::vector<std::uint64_t>{1, 2, 7, 5}));
  EXPECT_EQ(sets[0].filters, "shuffle+gzip(1)");
  EXPECT_EQ(sets.back().name, "/images");
}

TEST_F(DumpTest, AbsentOptionalDatasetsReadAsEmpty) {
  DumpReader r(valid_dump());
  EXPECT_FALSE(r.read_attn(0, 1, 1).has_value());
  EXPECT_FALSE(r.read_out(0, 1, 1).has_value());
  EXPECT_TRUE(r.read_labels().empty());
  EXPECT_EQ(r.read_logits().size(), 0);
  EXPECT_EQ(r.read_images(nullptr).size(), 0);
}

TEST_F(DumpTest, UncompressedWritesNoFilters) {
  const std::string p = path("raw.h5");
  DumpWriterOptions o;
  o.compression = 0;
  const auto imgs = write_dump(p, small_attrs(), 2, o);
  DumpReader r(p);
  EXPECT_EQ(r.datasets()[0].filters, "none");
  EXPECT_TRUE(r.read_image(1).V(2, 1) == imgs[1].V(2, 1));
}

TEST_F(DumpTest, StreamsAChosenLayerSubset) {
  const DumpAttributes a = small_attrs();
  const std::string p = path("subset.h5");
  const auto imgs = write_dump(p, a, 3);
  DumpReader r(p);
  const ImageQKV got = r.read_image(2, {2, 0});
  ASSERT_EQ(got.layers, (std::vector<int>{2, 0}));
  ASSERT_EQ(got.q.size(), 2U * 2U);
  for (int slot = 0; slot < 2; ++slot) {
    const int layer = got.layers[static_cast<std::size_t>(slot)];
    for (int h = 0; h < 2; ++h) {
      EXPECT_TRUE(got.Q(slot, h) == imgs[2].Q(layer, h)) << "layer " << layer << " head " << h;
      EXPECT_TRUE(got.K(slot, h) == imgs[2].K(layer, h)) << "layer " << layer << " head " << h;
      EXPECT_TRUE(got.V(slot, h) == imgs[2].V(layer, h)) << "layer " << layer << " head " << h;
    }
  }
  EXPECT_THROW((void)r.read_image(3), UsageError);
  EXPECT_THROW((void)r.read_image(0, {3}), UsageError);
  EXPECT_THROW((void)r.read_attn(0, 0, 2), UsageError);
}

// --- atomic writes -------------------------------------------------------------------------------

TEST_F(DumpTest, WriterDestroyedUnclosedLeavesNoFile) {
  const DumpAttributes a = small_attrs();
  const std::string p = path("unclosed.h5");
  {
    DumpWriter w(p, a, {});
    w.append(random_image(a, 0, 1));
    EXPECT_FALSE(fs::exists(p)) << "the final name must appear only on close()";
  }
  EXPECT_TRUE(files_in_dir().empty()) << files_in_dir().front();
}

TEST_F(DumpTest, WriterFailingInItsConstructorLeavesNoFile) {
  // One image of one layer would be a 4 GiB chunk, which HDF5 refuses after the file exists.
  DumpAttributes a = small_attrs();
  a.num_layers = 1;
  a.num_heads = 1;
  a.grid = TokenGrid{0, 1024, 1024};
  a.num_tokens = a.grid.tokens();
  a.head_dim = 1024;
  EXPECT_THROW(DumpWriter(path("huge.h5"), a, {}), Error);
  EXPECT_TRUE(files_in_dir().empty()) << files_in_dir().front();
}

TEST_F(DumpTest, WriterReplacesAnOldFileOnlyOnClose) {
  const std::string p = valid_dump("replace.h5", 3);
  const DumpAttributes a = small_attrs();
  {
    DumpWriter w(p, a, {});
    w.append(random_image(a, 0, 2));
  }
  EXPECT_EQ(DumpReader(p).schema().num_images, 3) << "an unclosed writer must not touch the file";
  {
    DumpWriter w(p, a, {});
    w.append(random_image(a, 0, 2));
    w.close();
  }
  EXPECT_EQ(DumpReader(p).schema().num_images, 1);
  EXPECT_EQ(files_in_dir().size(), 1U);
}

TEST_F(DumpTest, WriterRefusesMismatchedOptionalCountsOnClose) {
  const DumpAttributes a = small_attrs();
  const std::string p = path("labels.h5");
  {
    DumpWriter w(p, a, {});
    w.append(random_image(a, 0, 2));
    w.set_labels({1, 2});
    EXPECT_THROW(w.close(), Error);
  }
  EXPECT_TRUE(files_in_dir().empty());
}

TEST_F(DumpTest, WriterRefusesInvalidAttributesAndImages) {
  DumpAttributes a = small_attrs();
  a.num_tokens = 8;
  EXPECT_THROW(DumpWriter(path("bad.h5"), a, {}), InputError);
  a = small_attrs();
  DumpWriter w(path("bad2.h5"), a, {});
  ImageQKV img = random_image(a, 0, 1);
  img.layers.pop_back();
  EXPECT_THROW(w.append(img), Error);
  img = random_image(a, 0, 1);
  img.v[1] = MatF::Zero(7, 4);
  EXPECT_THROW(w.append(img), Error);
}

TEST_F(DumpTest, WriterIntoMissingFolderIsAnInputError) {
  const std::string p = path("no/such/folder/x.h5");
  expect_input_error(
      p, "", "writable", [&] { DumpWriter w(p, small_attrs(), {}); }, "missing folder");
}

// --- malformed files
// -------------------------------------------------------------------------------

TEST_F(DumpTest, MissingFile) {
  const std::string p = path("absent.h5");
  expect_input_error(
      p, "", "existing file", [&] { open_only(p); }, "missing file");
}

TEST_F(DumpTest, NotAnHdf5File) {
  const std::string p = path("text.h5");
  std::ofstream(p) << "this is not HDF5\n";
  expect_input_error(
      p, "", "HDF5", [&] { open_only(p); }, "text file");
  const std::string empty = path("empty.h5");
  std::ofstream{empty};
  expect_input_error(
      empty, "", "HDF5", [&] { open_only(empty); }, "empty file");
  expect_input_error(
      dir_.string(), "", "regular file", [&] { open_only(dir_.string()); }, "a folder");
}

TEST_F(DumpTest, EveryMissingAttributeIsNamed) {
  for (const char* name :
       {"format", "format_version", "model_name", "attention_family", "convention", "feature_map",
        "scale", "num_layers", "num_heads", "head_dim", "num_tokens", "grid_height", "grid_width",
        "prefix_tokens"}) {
    const std::string p = valid_dump(std::string("noattr_") + name + ".h5");
    RawFile(p).delete_attr(name);
    expect_input_error(
        p, std::string("attribute '") + name + "'", "found none", [&] { open_only(p); },
        std::string("missing ") + name);
  }
}

TEST_F(DumpTest, WrongAttributeTypes) {
  struct Case {
    const char* name;
    std::function<void(RawFile&)> edit;
    const char* text;
  };
  const std::vector<Case> cases{
      {"num_heads", [](RawFile& f) { f.set_fixed_string("num_heads", "2"); },
       "expected an integer, found string"},
      {"head_dim", [](RawFile& f) { f.set_double("head_dim", 5.0); },
       "expected an integer, found float64"},
      {"scale", [](RawFile& f) { f.set_int("scale", 1); }, "expected a float, found int64"},
      {"format", [](RawFile& f) { f.set_int("format", 1); }, "expected a string, found int64"},
      {"format", [](RawFile& f) { f.set_fixed_string("format", "other-dump"); }, "'other-dump'"},
      {"format_version", [](RawFile& f) { f.set_int("format_version", 2); }, "expected 1, found 2"},
      {"attention_family", [](RawFile& f) { f.set_fixed_string("attention_family", "cosine"); },
       "'cosine'"},
      {"convention", [](RawFile& f) { f.set_fixed_string("convention", "xyz"); }, "'xyz'"},
      {"scale", [](RawFile& f) { f.set_double("scale", -1.0); }, "positive"},
      {"num_layers", [](RawFile& f) { f.set_int("num_layers", 0); }, "positive"},
      {"prefix_tokens", [](RawFile& f) { f.set_int("prefix_tokens", -1); }, ">= 0"},
  };
  int n = 0;
  for (const Case& c : cases) {
    const std::string p = valid_dump("type" + std::to_string(n++) + ".h5");
    {
      RawFile f(p);
      c.edit(f);
    }
    expect_input_error(
        p, std::string("attribute '") + c.name + "'", c.text, [&] { open_only(p); },
        std::string("edited ") + c.name);
  }
}

TEST_F(DumpTest, FixedLengthStringsAreAccepted) {
  const std::string p = valid_dump();
  {
    RawFile f(p);
    f.set_fixed_string("format", "attnscope-dump");
    f.set_fixed_string("model_name", "fixed_name");
  }
  DumpReader r(p);
  EXPECT_EQ(r.schema().attrs.model_name, "fixed_name");
}

// A layer group's attention_family, feature_map and convention override the root's for that
// layer only; the rest of the dump reads as before.
TEST_F(DumpTest, PerLayerFamilyOverridesTheRoot) {
  const std::string p = valid_dump();
  {
    RawFile f(p);
    f.set_group_string("/layers/1", "attention_family", "inline");
    f.set_group_string("/layers/1", "feature_map", "identity");
    f.set_group_string("/layers/1", "convention", "code");
  }
  DumpReader r(p);
  const DumpSchema& s = r.schema();
  EXPECT_EQ(s.layer_variant(0).name(), s.attrs.variant().name());
  EXPECT_EQ(s.layer_variant(1).name(), "inline:identity@code");
  EXPECT_EQ(s.layer_variant(2).name(), s.attrs.variant().name());
  EXPECT_TRUE(s.variants_differ());
  EXPECT_FALSE(s.variants_differ({0, 2}));
  EXPECT_FALSE(DumpReader(valid_dump("plain.h5")).schema().variants_differ());
}

TEST_F(DumpTest, PerLayerFamilyNamingNoVariantIsAnInputError) {
  const std::string p = valid_dump();
  RawFile(p).set_group_string("/layers/2", "attention_family", "nosuchfamily");
  expect_input_error(
      p, "/layers/2 attribute 'attention_family'", "found 'nosuchfamily:none@paper'",
      [&] { open_only(p); }, "family nosuchfamily on layer 2");
}

TEST_F(DumpTest, LocalTermIsReadAndItsShapeChecked) {
  const std::string p = valid_dump();
  const DumpAttributes a = small_attrs();
  const std::vector<hsize_t> shape = {3, 2, 7, 5};
  RawFile(p).replace("/layers/1/local", H5T_NATIVE_FLOAT, shape);
  {
    DumpReader r(p);
    EXPECT_EQ(r.schema().layer_has_local, (std::vector<bool>{false, true, false}));
    const std::optional<MatF> m = r.read_local(2, 1, 1);
    ASSERT_TRUE(m.has_value());
    EXPECT_EQ(m->rows(), a.num_tokens);
    EXPECT_EQ(m->cols(), a.head_dim);
    EXPECT_EQ(m->cwiseAbs().maxCoeff(), 0.0f);
    EXPECT_FALSE(r.read_local(0, 0, 0).has_value());
  }
  RawFile(p).replace("/layers/1/local", H5T_NATIVE_FLOAT, {3, 2, 7, 4});
  expect_input_error(
      p, "/layers/1/local", "[3, 2, 7, 5]", [&] { open_only(p); }, "local of head_dim 4");
}

TEST_F(DumpTest, InconsistentNumTokens) {
  const std::string p = valid_dump();
  RawFile(p).set_int("num_tokens", 8);
  expect_input_error(
      p, "attribute 'num_tokens'", "prefix_tokens + grid_height * grid_width = 7",
      [&] { open_only(p); }, "num_tokens 8 for 1 + 2x3");
}

TEST_F(DumpTest, MissingLayerGroup) {
  const std::string p = valid_dump();
  RawFile(p).unlink("/layers/1");
  expect_input_error(
      p, "/layers/1", "layer group", [&] { open_only(p); }, "no /layers/1");
  const std::string p2 = valid_dump("more_layers.h5");
  RawFile(p2).set_int("num_layers", 4);
  expect_input_error(
      p2, "/layers/3", "num_layers = 4", [&] { open_only(p2); }, "num_layers 4");
  const std::string p3 = valid_dump("no_layers.h5");
  RawFile(p3).unlink("/layers");
  expect_input_error(
      p3, "/layers", "a group", [&] { open_only(p3); }, "no /layers");
}

TEST_F(DumpTest, MissingQKV) {
  for (const char* name : {"q", "k", "v"}) {
    const std::string obj = std::string("/layers/2/") + name;
    const std::string p = valid_dump(std::string("no_") + name + ".h5");
    RawFile(p).unlink(obj);
    expect_input_error(
        p, obj, "expected a dataset, found none", [&] { open_only(p); }, "missing " + obj);
  }
}

TEST_F(DumpTest, AGroupWhereADatasetBelongs) {
  const std::string p = valid_dump();
  {
    RawFile f(p);
    f.unlink("/layers/0/k");
    H5Gclose(H5Gcreate2(f.id(), "/layers/0/k", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  }
  expect_input_error(
      p, "/layers/0/k", "a dataset", [&] { open_only(p); }, "group as k");
}

TEST_F(DumpTest, WrongRankAndShape) {
  struct Case {
    std::vector<hsize_t> dims;
    const char* found;
  };
  const std::vector<Case> cases{{{3, 2, 7}, "[3, 2, 7]"},
                                {{3, 2, 7, 5, 1}, "[3, 2, 7, 5, 1]"},
                                {{3, 3, 7, 5}, "[3, 3, 7, 5]"},
                                {{3, 2, 8, 5}, "[3, 2, 8, 5]"},
                                {{3, 2, 7, 4}, "[3, 2, 7, 4]"}};
  int n = 0;
  for (const Case& c : cases) {
    const std::string p = valid_dump("shape" + std::to_string(n++) + ".h5");
    RawFile(p).replace("/layers/1/v", H5T_IEEE_F32LE, c.dims);
    expect_input_error(
        p, "/layers/1/v", std::string("expected shape [3, 2, 7, 5], found ") + c.found,
        [&] { open_only(p); }, std::string("v shape ") + c.found);
  }
}

TEST_F(DumpTest, UnsupportedDtypes) {
  const std::vector<std::pair<hid_t, const char*>> types{
      {H5T_STD_I32LE, "int32"}, {H5T_IEEE_F64LE, "float64"}, {H5T_STD_U8LE, "uint8"}};
  int n = 0;
  for (const auto& [type, name] : types) {
    const std::string p = valid_dump("dtype" + std::to_string(n++) + ".h5");
    RawFile(p).replace("/layers/0/q", type, {3, 2, 7, 5});
    expect_input_error(
        p, "/layers/0/q", std::string("expected dtype float32 or float16, found ") + name,
        [&] { open_only(p); }, std::string("q as ") + name);
  }
}

TEST_F(DumpTest, MixedDtypesAcrossDatasets) {
  const std::string p = valid_dump();
  {
    RawFile f(p);
    // A half type built like h5py's numpy.float16.
    const hid_t half = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(half, 15, 10, 5, 0, 10);
    H5Tset_size(half, 2);
    H5Tset_ebias(half, 15);
    f.replace("/layers/2/k", half, {3, 2, 7, 5});
    H5Tclose(half);
  }
  expect_input_error(
      p, "/layers/2/k", "found float16", [&] { open_only(p); }, "k float16");
}

TEST_F(DumpTest, MismatchedImagesAcrossLayers) {
  const std::string p = valid_dump();
  RawFile(p).replace("/layers/2/q", H5T_IEEE_F32LE, {4, 2, 7, 5});
  expect_input_error(
      p, "/layers/2/q", "expected shape [3, 2, 7, 5], found [4, 2, 7, 5]", [&] { open_only(p); },
      "4 images in layer 2");
}

TEST_F(DumpTest, BadOptionalDatasetShapes) {
  const std::string p = valid_dump();
  RawFile(p).replace("/labels", H5T_STD_I64LE, {2});
  expect_input_error(
      p, "/labels", "found [2]", [&] { open_only(p); }, "labels [2]");
  const std::string p2 = valid_dump("attn.h5");
  RawFile(p2).replace("/layers/1/attn", H5T_IEEE_F32LE, {3, 2, 7, 5});
  expect_input_error(
      p2, "/layers/1/attn", "expected shape [3, 2, 7, 7]", [&] { open_only(p2); },
      "attn [3, 2, 7, 5]");
}

TEST_F(DumpTest, NanAndInfAreReportedWithTheirPlace) {
  const DumpAttributes a = small_attrs();
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::infinity()}) {
    for (const DType dt : {DType::F32, DType::F16}) {
      const std::string tag =
          std::string(std::isnan(bad) ? "nan" : "inf") + (dt == DType::F16 ? "16" : "32");
      const std::string p = path(tag + ".h5");
      DumpWriterOptions o;
      o.dtype = dt;
      {
        DumpWriter w(p, a, o);
        for (int i = 0; i < 3; ++i) {
          ImageQKV img = random_image(a, i, 5);
          if (i == 2) img.k[1 * 2 + 1](4, 3) = bad;  // layer 1, head 1, token 4, dim 3
          w.append(img);
        }
        w.close();
      }
      DumpReader r(p);
      EXPECT_NO_THROW((void)r.read_image(1)) << tag;
      EXPECT_NO_THROW((void)r.read_image(2, {0, 2})) << tag << ": layer 1 is not read";
      const std::string where =
          std::string(std::isnan(bad) ? "NaN" : "Inf") + " at image 2, head 1, token 4, dim 3";
      expect_input_error(
          p, "/layers/1/k", where, [&] { (void)r.read_image(2); }, tag);
    }
  }
}

TEST_F(DumpTest, TruncatedFilesAreCleanErrors) {
  const std::string src = valid_dump("full.h5", 6);
  const auto size = fs::file_size(src);
  for (const std::uintmax_t keep :
       {std::uintmax_t{4}, std::uintmax_t{100}, size / 3, size / 2, size - 1}) {
    const std::string p = path("cut" + std::to_string(keep) + ".h5");
    fs::copy_file(src, p);
    fs::resize_file(p, keep);
    const std::string config =
        "truncated to " + std::to_string(keep) + " of " + std::to_string(size);
    ::testing::internal::CaptureStderr();
    try {
      read_everything(p);
      ::testing::internal::GetCapturedStderr();
      ADD_FAILURE() << config << ": read without error";
    } catch (const InputError& e) {
      const std::string err = ::testing::internal::GetCapturedStderr();
      EXPECT_EQ(e.file(), p) << config << ": " << e.what();
      EXPECT_EQ(err, "") << config;
    } catch (const std::exception& e) {
      ::testing::internal::GetCapturedStderr();
      ADD_FAILURE() << config << ": wrong exception: " << e.what();
    }
  }
}

TEST_F(DumpTest, ErrorMessageNamesFileObjectExpectedAndFound) {
  const InputError e("a.h5", "/layers/0/q", "float32", "int32");
  EXPECT_STREQ(e.what(), "a.h5: /layers/0/q: expected float32, found int32");
  EXPECT_EQ(e.file(), "a.h5");
  EXPECT_EQ(e.object(), "/layers/0/q");
  const InputError no_object("b.h5", "", "an HDF5 file", "text");
  EXPECT_STREQ(no_object.what(), "b.h5: expected an HDF5 file, found text");
}

}  // namespace
}  // namespace attnscope
