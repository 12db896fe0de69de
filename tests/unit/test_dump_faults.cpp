// Faults around a dump: unreadable chunks (on the reading thread and on the prefetch thread),
// filters this HDF5 lacks, odd attributes and datasets, source_layers, zero images, and the
// writer (and synth) refusing what the reader would refuse.
#include "scratch_dir.hpp"
#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/feature_map.hpp"
#include "attnscope/synth.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace attnscope {
namespace {

namespace fs = std::filesystem;

class DumpFaults : public test::ScratchDirTest {
 protected:
  /// A small gzip-compressed synthetic dump: 3 layers, 2 heads, 1 + 2x3 tokens, d 4, 3 images.
  std::string synth_dump(const std::string& name, int images = 3) const {
    SynthOptions o;
    o.layers = 3;
    o.heads = 2;
    o.grid = TokenGrid{1, 2, 3};
    o.head_dim = 4;
    o.images = images;
    const std::string p = path(name);
    write_synth_dump(p, o);
    return p;
  }

};

/// Opens a file read-write with the raw C API for an edit; closed on scope exit.
class RawFile {
 public:
  explicit RawFile(const std::string& p) : id_(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(id_, 0) << "cannot open " << p;
  }
  ~RawFile() { H5Fclose(id_); }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;
  [[nodiscard]] hid_t id() const { return id_; }

  void set_attr(const char* name, hid_t type, const std::vector<hsize_t>& dims, const void* v) {
    if (H5Aexists(id_, name) > 0) H5Adelete(id_, name);
    const hid_t s = dims.empty() ? H5Screate(H5S_SCALAR)
                                 : H5Screate_simple(static_cast<int>(dims.size()), dims.data(),
                                                    nullptr);
    const hid_t a = H5Acreate2(id_, name, type, s, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(a, type, v), 0) << name;
    H5Aclose(a);
    H5Sclose(s);
  }
  void set_source_layers(const std::vector<std::int64_t>& v) {
    set_attr("source_layers", H5T_NATIVE_INT64, {v.size()}, v.data());
  }

 private:
  hid_t id_;
};

/// `body` must throw InputError with `object` and `text` in its one-line message, and nothing may
/// appear on stderr (HDF5's error stack included).
void expect_quiet_input_error(const std::string& object, const std::string& text,
                              const std::function<void()>& body, const std::string& config) {
  ::testing::internal::CaptureStderr();
  std::string what;
  bool input_error = false;
  try {
    body();
  } catch (const InputError& e) {
    input_error = true;
    what = e.what();
    EXPECT_EQ(e.object(), object) << config << ": " << what;
  } catch (const std::exception& e) {
    what = std::string("wrong exception type: ") + e.what();
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(input_error) << config << ": " << (what.empty() ? "no exception" : what);
  EXPECT_NE(what.find(text), std::string::npos) << config << ": '" << text << "' not in: " << what;
  EXPECT_EQ(what.find('\n'), std::string::npos) << config << ": not one line";
  EXPECT_EQ(err, "") << config << ": something printed on stderr";
}

/// Flips the bytes inside the stored (compressed) chunk of `image` of `dataset`.
void corrupt_chunk(const std::string& p, const std::string& dataset, hsize_t image) {
  haddr_t addr = 0;
  hsize_t size = 0;
  {
    RawFile f(p);
    const hid_t ds = H5Dopen2(f.id(), dataset.c_str(), H5P_DEFAULT);
    const hsize_t offset[4] = {image, 0, 0, 0};
    unsigned mask = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(ds, offset, &mask, &addr, &size), 0);
    H5Dclose(ds);
  }
  ASSERT_GT(size, 8U);
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  for (hsize_t i = 2; i + 2 < size; ++i) {
    f.seekg(static_cast<std::streamoff>(addr + i));
    char c = 0;
    f.get(c);
    f.seekp(static_cast<std::streamoff>(addr + i));
    f.put(static_cast<char>(c ^ 0x5a));
  }
}

// --- unreadable data -------------------------------------------------------------------------

TEST_F(DumpFaults, CorruptChunkIsOneQuietLineWithHdf5sDiagnosis) {
  const std::string p = synth_dump("corrupt.h5");
  corrupt_chunk(p, "/layers/1/q", 1);
  DumpReader r(p);
  (void)r.read_image(0);  // other chunks stay readable
  expect_quiet_input_error(
      "/layers/1/q", "found a read error (inflate() failed)", [&] { (void)r.read_image(1); },
      "read on the opening thread");
}

TEST_F(DumpFaults, CorruptChunkReadOnAnotherThreadIsQuietToo) {
  const std::string p = synth_dump("corrupt.h5");
  corrupt_chunk(p, "/layers/2/k", 2);
  DumpReader r(p);
  // A thread that never called HDF5 before: silencing and the error stack are per thread.
  std::string what;
  ::testing::internal::CaptureStderr();
  std::thread([&] {
    try {
      (void)r.read_image(2);
    } catch (const InputError& e) {
      what = e.what();
    }
  }).join();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(what.find("/layers/2/k: expected readable data at image 2, found a read error "
                      "(inflate() failed)"),
            std::string::npos)
      << what;
  EXPECT_EQ(err, "");
  // The streaming loop reads on its own prefetch thread.
  expect_quiet_input_error(
      "/layers/2/k", "(inflate() failed)",
      [&] {
        const analyses::Selection sel = analyses::resolve(r.schema(), {});
        analyses::for_each_head(r, sel, [](const analyses::HeadView&) {});
      },
      "for_each_head");
}

TEST_F(DumpFaults, FilterThisHdf5LacksIsReportedWhenOpening) {
  const std::string p = synth_dump("filter.h5");
  {
    // A dataset declared with filter 32000 (lzf, which h5py provides and libhdf5 does not),
    // optional so that HDF5 lets us write it without the filter.
    RawFile f(p);
    H5Ldelete(f.id(), "/layers/0/v", H5P_DEFAULT);
    const hsize_t dims[4] = {3, 2, 7, 4};
    const hid_t s = H5Screate_simple(4, dims, nullptr);
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk[4] = {1, 2, 7, 4};
    H5Pset_chunk(dcpl, 4, chunk);
    ASSERT_GE(H5Pset_filter(dcpl, 32000, H5Z_FLAG_OPTIONAL, 0, nullptr), 0);
    const hid_t d =
        H5Dcreate2(f.id(), "/layers/0/v", H5T_IEEE_F32LE, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ASSERT_GE(d, 0);
    H5Dclose(d);
    H5Pclose(dcpl);
    H5Sclose(s);
  }
  ASSERT_LE(H5Zfilter_avail(32000), 0) << "this HDF5 provides filter 32000: the test needs one it lacks";
  expect_quiet_input_error(
      "/layers/0/v", "filter 32000", [&] { DumpReader r(p); }, "filter 32000 on open");
}

// --- odd attributes and datasets -------------------------------------------------------------

TEST_F(DumpFaults, ScalarQIsNamedAsAScalar) {
  const std::string p = synth_dump("scalar.h5");
  {
    RawFile f(p);
    H5Ldelete(f.id(), "/layers/0/q", H5P_DEFAULT);
    const hid_t s = H5Screate(H5S_SCALAR);
    H5Dclose(H5Dcreate2(f.id(), "/layers/0/q", H5T_IEEE_F32LE, s, H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT));
    H5Sclose(s);
  }
  expect_quiet_input_error(
      "/layers/0/q", "expected a 4-D dataset [images, heads, tokens, dim], found a scalar",
      [&] { DumpReader r(p); }, "scalar q");
}

TEST_F(DumpFaults, UnsignedAttributesAreReportedWithTheirTrueValue) {
  for (const std::uint64_t v : {std::uint64_t{18446744073709551615U},
                                std::uint64_t{9223372036854775813U}, std::uint64_t{1} << 31}) {
    const std::string p = synth_dump("u64_" + std::to_string(v) + ".h5");
    RawFile(p).set_attr("num_heads", H5T_NATIVE_UINT64, {}, &v);
    expect_quiet_input_error(
        "attribute 'num_heads'", "expected an integer below 2^30, found " + std::to_string(v),
        [&] { DumpReader r(p); }, "num_heads = " + std::to_string(v));
  }
  const std::string ok = synth_dump("u64_ok.h5");
  const std::uint64_t two = 2;
  RawFile(ok).set_attr("num_heads", H5T_NATIVE_UINT64, {}, &two);
  EXPECT_EQ(DumpReader(ok).schema().attrs.num_heads, 2);
}

TEST_F(DumpFaults, LayerGroupsBeyondNumLayersAreWarnedOnce) {
  const std::string p = synth_dump("extra.h5");
  {
    RawFile f(p);
    ASSERT_GE(H5Ocopy(f.id(), "/layers/2", f.id(), "/layers/3", H5P_DEFAULT, H5P_DEFAULT), 0);
    ASSERT_GE(H5Ocopy(f.id(), "/layers/2", f.id(), "/layers/7", H5P_DEFAULT, H5P_DEFAULT), 0);
  }
  std::vector<std::string> heard;
  set_dump_warning_handler([&heard](const std::string& m) { heard.push_back(m); });
  DumpReader r(p);
  set_dump_warning_handler({});
  EXPECT_EQ(r.schema().attrs.num_layers, 3);
  ASSERT_EQ(r.schema().warnings.size(), 1U);
  EXPECT_EQ(heard, r.schema().warnings);
  const std::string& w = r.schema().warnings.front();
  EXPECT_NE(w.find(p + ": /layers/3, /layers/7: not among the num_layers = 3"), std::string::npos)
      << w;
  EXPECT_TRUE(DumpReader(synth_dump("plain.h5")).schema().warnings.empty());
}

TEST_F(DumpFaults, ZeroImagesOpenButEveryReadSaysNoImages) {
  const std::string p = path("zero.h5");
  {
    DumpAttributes a;
    a.num_layers = 1;
    a.num_heads = 1;
    a.head_dim = 2;
    a.grid = TokenGrid{1, 1, 2};
    a.num_tokens = 3;
    DumpWriter w(p, a, {});
    w.close();
  }
  DumpReader r(p);
  EXPECT_EQ(r.schema().num_images, 0);
  expect_quiet_input_error(
      "/layers/0/q", "expected at least one image, found no images",
      [&] { (void)r.read_image(0); }, "read_image on zero images");
}

// --- source_layers -----------------------------------------------------------------------------

TEST_F(DumpFaults, SourceLayersMapDumpLayersToTheModels) {
  const std::string p = synth_dump("source.h5");
  RawFile(p).set_source_layers({5, 0, 2});
  DumpReader r(p);
  const DumpSchema& s = r.schema();
  EXPECT_EQ(s.source_layers, (std::vector<int>{5, 0, 2}));
  EXPECT_EQ(s.model_layer(0), 5);
  EXPECT_EQ(s.model_layer(1), 0);
  EXPECT_EQ(s.model_layer(2), 2);
  EXPECT_EQ(s.dump_layer(5), 0);
  EXPECT_EQ(s.dump_layer(2), 2);
  EXPECT_EQ(s.dump_layer(1), -1);
  const DumpReader plain(synth_dump("plain.h5"));
  EXPECT_TRUE(plain.schema().source_layers.empty());
  EXPECT_EQ(plain.schema().model_layer(2), 2);
  EXPECT_EQ(plain.schema().dump_layer(2), 2);
}

TEST_F(DumpFaults, BadSourceLayersAreNamed) {
  struct Case {
    std::vector<std::int64_t> v;
    const char* text;
  };
  const std::vector<Case> cases{{{0, 1}, "num_layers = 3), found 2 values"},
                                {{0, 1, 2, 3}, "found 4 values"},
                                {{2, 0, 2}, "expected distinct layer indices, found layer 2"},
                                {{0, -1, 2}, "found -1"},
                                {{0, 1, std::int64_t{1} << 40}, "found 1099511627776"}};
  int n = 0;
  for (const Case& c : cases) {
    const std::string p = synth_dump("bad_source" + std::to_string(n++) + ".h5");
    RawFile(p).set_source_layers(c.v);
    expect_quiet_input_error(
        "attribute 'source_layers'", c.text, [&] { DumpReader r(p); }, c.text);
  }
  const std::string p = synth_dump("string_source.h5");
  {
    RawFile f(p);
    const hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 4);
    f.set_attr("source_layers", t, {3}, "ab\0\0cd\0\0ef\0");
    H5Tclose(t);
  }
  expect_quiet_input_error(
      "attribute 'source_layers'", "expected an integer, found string", [&] { DumpReader r(p); },
      "strings");
}

// --- what is written is what can be read -------------------------------------------------------

TEST_F(DumpFaults, WriterRefusesWhatTheReaderRefuses) {
  DumpAttributes a;
  a.num_layers = 1;
  a.num_heads = 1;
  a.head_dim = 2;
  a.grid = TokenGrid{0, 1, 2};
  a.num_tokens = 2;
  DumpAttributes big = a;
  big.num_layers = 1 << 30;
  EXPECT_THROW(DumpWriter(path("big.h5"), big, {}), InputError);
  DumpAttributes linear_none = a;
  linear_none.attention_family = "linear";
  linear_none.feature_map = "none";
  try {
    DumpWriter w(path("linear.h5"), linear_none, {});
    ADD_FAILURE() << "linear with feature_map none was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.object(), "attribute 'feature_map'") << e.what();
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(DumpFaults, SynthRefusesOptionsThatMakeAnUnreadableDump) {
  const auto refused = [](const std::function<void(SynthOptions&)>& edit, const std::string& text) {
    SynthOptions o;
    edit(o);
    try {
      o.validate();
      ADD_FAILURE() << text << ": accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  refused([](SynthOptions& o) { o.layers = 2000000000; }, "--layers");
  refused([](SynthOptions& o) { o.heads = 1 << 30; }, "--heads");
  refused([](SynthOptions& o) { o.family = "linear"; }, "--family, --feature-map");
  refused([](SynthOptions& o) { o.feature_map = "relu"; }, "--family, --feature-map");
  refused([](SynthOptions& o) { o.images = 0; }, "images must be >= 1");
  SynthOptions ok;
  ok.family = "linear";
  ok.feature_map = "relu";
  EXPECT_NO_THROW(ok.validate());
}

// --- memory that grows as d^2 ------------------------------------------------------------------

TEST(FeatureMapMemory, AnUnallocatableAffineMatrixIsNamedWithItsSize) {
  MatD A;
  VecD b;
  const int d = 1 << 20;  // 8 TiB of doubles
  try {
    draw_affine_params(1, d, A, b);
    ADD_FAILURE() << "a 2^20 x 2^20 matrix was allocated";
  } catch (const std::bad_alloc&) {
    ADD_FAILURE() << "a bare bad_alloc";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("1048576 x 1048576"), std::string::npos) << what;
    EXPECT_NE(what.find("8796093022208 bytes"), std::string::npos) << what;
    EXPECT_NE(what.find("relu_affine"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace attnscope
