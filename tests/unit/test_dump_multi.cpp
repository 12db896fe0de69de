// DumpReader over several files: one image sequence in the order given (images, the model's own
// tensors, labels, logits and input images), files that disagree refused naming both, errors of an
// image naming the file that holds it, shards out of order refused, and the chunk cache setting.
#include "scratch_dir.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"

#include "random_inputs.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <hdf5.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace attnscope {
namespace {

DumpAttributes attrs() {
  DumpAttributes a;
  a.model_name = "multi";
  a.num_layers = 2;
  a.num_heads = 2;
  a.head_dim = 3;
  a.grid = TokenGrid{1, 2, 2};
  a.num_tokens = a.grid.tokens();  // 5
  a.scale = 0.5;
  return a;
}

MatF random_mat(int rows, int cols, test::Normal& rng) {
  MatF m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(rng());
  return m;
}

/// What one file holds, kept to compare with what the reader returns.
struct Written {
  std::vector<ImageQKV> images;
  std::vector<std::vector<MatF>> attn, out;
  std::vector<std::int64_t> labels;
  MatF logits, inputs;
};

class DumpMulti : public test::ScratchDirTest {
 protected:
  /// Writes `n` images (seeded by `seed`) with attn, out, labels, logits and input images.
  Written write(const std::string& p, int n, std::uint64_t seed, DumpAttributes a = attrs(),
                DumpWriterOptions o = with_everything()) {
    Written w;
    test::Normal rng(seed);
    DumpWriter dw(p, a, o);
    const int N = a.num_tokens, d = a.head_dim, slots = a.num_layers * a.num_heads;
    for (int i = 0; i < n; ++i) {
      ImageQKV img;
      img.image = i;
      img.heads = a.num_heads;
      for (int l = 0; l < a.num_layers; ++l) img.layers.push_back(l);
      std::vector<MatF> attn, out;
      for (int s = 0; s < slots; ++s) {
        img.q.push_back(random_mat(N, d, rng));
        img.k.push_back(random_mat(N, d, rng));
        img.v.push_back(random_mat(N, d, rng));
        attn.push_back(random_mat(N, N, rng));
        out.push_back(random_mat(N, d, rng));
      }
      dw.append(img, o.with_attn ? &attn : nullptr, o.with_out ? &out : nullptr);
      w.images.push_back(img);
      w.attn.push_back(attn);
      w.out.push_back(out);
      w.labels.push_back(static_cast<std::int64_t>(seed * 100 + static_cast<std::uint64_t>(i)));
    }
    w.logits = random_mat(n, 4, rng);
    w.inputs = random_mat(n, 1 * 2 * 2, rng);
    dw.set_labels(w.labels);
    dw.set_logits(w.logits);
    dw.set_images(w.inputs, {1, 2, 2});
    dw.close();
    return w;
  }
  static DumpWriterOptions with_everything() {
    DumpWriterOptions o;
    o.with_attn = true;
    o.with_out = true;
    return o;
  }
};

/// Runs `body`; it must throw InputError whose message holds every one of `parts`.
void expect_input_error(const std::function<void()>& body, const std::vector<std::string>& parts) {
  try {
    body();
    ADD_FAILURE() << "no InputError; expected one naming " << parts.front();
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(what.find(p), std::string::npos) << "'" << p << "' not in: " << what;
    }
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

TEST_F(DumpMulti, FilesAreOneImageSequenceInTheOrderGiven) {
  const std::vector<std::string> files{path("a.h5"), path("b.h5"), path("c.h5")};
  const std::vector<Written> w{write(files[0], 2, 1), write(files[1], 3, 2), write(files[2], 1, 3)};
  DumpReader r(files);
  const DumpSchema& s = r.schema();
  EXPECT_EQ(s.num_images, 6);
  EXPECT_EQ(s.files, files);
  EXPECT_EQ(s.file_images, (std::vector<int>{2, 3, 1}));
  EXPECT_EQ(s.path, files[0] + ", " + files[1] + ", " + files[2]);
  EXPECT_TRUE(s.has_labels && s.has_logits && s.has_images);
  // Sequence index -> (file, image within it); read out of order, so files are left and revisited.
  const std::vector<std::pair<int, int>> where{{0, 0}, {0, 1}, {1, 0}, {1, 1}, {1, 2}, {2, 0}};
  for (int image : {5, 0, 3, 1, 4, 2, 5}) {
    const auto [f, i] = where[static_cast<std::size_t>(image)];
    const ImageQKV got = r.read_image(image);
    const ImageQKV& want = w[static_cast<std::size_t>(f)].images[static_cast<std::size_t>(i)];
    EXPECT_EQ(got.image, image);
    for (std::size_t slot = 0; slot < want.q.size(); ++slot) {
      EXPECT_TRUE(got.q[slot] == want.q[slot]) << "image " << image << " slot " << slot;
      EXPECT_TRUE(got.k[slot] == want.k[slot]) << "image " << image << " slot " << slot;
      EXPECT_TRUE(got.v[slot] == want.v[slot]) << "image " << image << " slot " << slot;
    }
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        const std::size_t slot = static_cast<std::size_t>(l * 2 + h);
        const auto& ww = w[static_cast<std::size_t>(f)];
        EXPECT_TRUE(*r.read_attn(image, l, h) == ww.attn[static_cast<std::size_t>(i)][slot])
            << "attn image " << image;
        EXPECT_TRUE(*r.read_out(image, l, h) == ww.out[static_cast<std::size_t>(i)][slot])
            << "out image " << image;
      }
    }
  }
  std::vector<std::int64_t> labels;
  for (const Written& x : w) labels.insert(labels.end(), x.labels.begin(), x.labels.end());
  EXPECT_EQ(r.read_labels(), labels);
  const MatF logits = r.read_logits();
  ASSERT_EQ(logits.rows(), 6);
  EXPECT_TRUE(logits.topRows(2) == w[0].logits);
  EXPECT_TRUE(logits.middleRows(2, 3) == w[1].logits);
  EXPECT_TRUE(logits.bottomRows(1) == w[2].logits);
  std::vector<int> shape;
  const MatF inputs = r.read_images(&shape);
  EXPECT_EQ(shape, (std::vector<int>{1, 2, 2}));
  ASSERT_EQ(inputs.rows(), 6);
  EXPECT_TRUE(inputs.middleRows(2, 3) == w[1].inputs);
  EXPECT_THROW((void)r.read_image(6), UsageError);
  // Each file's datasets, named with their file.
  const std::vector<DatasetInfo> sets = r.datasets();
  EXPECT_EQ(sets.front().name, files[0] + ":/layers/0/q");
  EXPECT_EQ(sets.back().name, files[2] + ":/images");
}

TEST_F(DumpMulti, OneFileKeepsItsOwnName) {
  write(path("a.h5"), 2, 1);
  DumpReader r(std::vector<std::string>{path("a.h5")});
  EXPECT_EQ(r.schema().path, path("a.h5"));
  EXPECT_EQ(r.schema().num_images, 2);
  EXPECT_EQ(r.datasets().front().name, "/layers/0/q");
}

TEST_F(DumpMulti, ChunkCacheSettingKeepsTheData) {
  const std::vector<std::string> files{path("a.h5"), path("b.h5")};
  const Written a = write(files[0], 2, 1), b = write(files[1], 2, 2);
  DumpReader r(files);
  for (std::size_t bytes : {std::size_t{0}, std::size_t{100}, std::size_t{64} << 20}) {
    r.set_chunk_cache(bytes);
    EXPECT_EQ(r.chunk_cache(), bytes);
    EXPECT_TRUE(r.read_image(3).k[1] == b.images[1].k[1]) << bytes << " bytes";
    EXPECT_TRUE(r.read_image(0).k[1] == a.images[0].k[1]) << bytes << " bytes";
  }
}

struct Mismatch {
  const char* what;  // expected in the message
  std::function<void(DumpAttributes&, DumpWriterOptions&)> change;
  const char* first_value;
  const char* second_value;
};

TEST_F(DumpMulti, FilesThatDisagreeAreRefusedNamingBothAndTheValues) {
  const std::vector<Mismatch> cases{
      {"num_heads", [](DumpAttributes& a, DumpWriterOptions&) { a.num_heads = 3; }, "2", "3"},
      {"head_dim", [](DumpAttributes& a, DumpWriterOptions&) { a.head_dim = 4; }, "3", "4"},
      {"model_name", [](DumpAttributes& a, DumpWriterOptions&) { a.model_name = "other"; }, "'multi'", "'other'"},
      {"scale", [](DumpAttributes& a, DumpWriterOptions&) { a.scale = 0.25; }, "0.5", "0.25"},
      {"grid_height",
       [](DumpAttributes& a, DumpWriterOptions&) {
         a.grid = TokenGrid{3, 1, 2};  // the same 5 tokens, another layout
         a.num_tokens = 5;
       },
       "2", "1"},
      {"convention", [](DumpAttributes& a, DumpWriterOptions&) { a.convention = "code"; }, "paper", "code"},
      {"dtype", [](DumpAttributes&, DumpWriterOptions& o) { o.dtype = DType::F16; }, "float32", "float16"},
      {"/layers/*/attn", [](DumpAttributes&, DumpWriterOptions& o) { o.with_attn = false; }, "[yes, yes]", "[no, no]"},
  };
  const std::string first = path("first.h5");
  write(first, 1, 1);
  int k = 0;
  for (const Mismatch& c : cases) {
    DumpAttributes a = attrs();
    DumpWriterOptions o = DumpMulti::with_everything();
    c.change(a, o);
    const std::string second = path("second" + std::to_string(k++) + ".h5");
    write(second, 1, 2, a, o);
    SCOPED_TRACE(c.what);
    expect_input_error([&] { DumpReader r(std::vector<std::string>{first, second}); },
                       {first, second, c.what, std::string("expected ") + c.first_value,
                        std::string("found ") + c.second_value});
  }
}

TEST_F(DumpMulti, ABadSecondFileIsNamed) {
  const std::string a = path("a.h5"), b = path("b.h5");
  write(a, 2, 1);
  expect_input_error([&] { DumpReader r(std::vector<std::string>{a, path("missing.h5")}); },
                     {path("missing.h5"), "an existing file"});
  {
    std::ofstream(b) << "not hdf5";
  }
  expect_input_error([&] { DumpReader r(std::vector<std::string>{a, b}); }, {b, "an HDF5 file"});
}

TEST_F(DumpMulti, AnImageErrorNamesItsFileDatasetAndIndexInTheFile) {
  const std::string a = path("a.h5"), b = path("b.h5");
  write(a, 2, 1);
  write(b, 3, 2);
  {
    // A NaN in b.h5's image 1, layer 1, k: sequence image 3.
    const hid_t f = H5Fopen(b.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    const hid_t ds = H5Dopen2(f, "/layers/1/k", H5P_DEFAULT);
    const hid_t fs = H5Dget_space(ds);
    const hsize_t off[4] = {1, 1, 2, 0}, cnt[4] = {1, 1, 1, 1};
    H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, nullptr, cnt, nullptr);
    const hid_t ms = H5Screate_simple(4, cnt, nullptr);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, &nan), 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(ds);
    H5Fclose(f);
  }
  DumpReader r(std::vector<std::string>{a, b});
  EXPECT_NO_THROW((void)r.read_image(2));
  expect_input_error([&] { (void)r.read_image(3); },
                     {b, "/layers/1/k", "NaN at image 1, head 1, token 2"});
  EXPECT_EQ(std::string(r.schema().path).find(b) != std::string::npos, true);
}

TEST_F(DumpMulti, ShardsOutOfOrderAreRefused) {
  const std::string a = path("s0.h5"), b = path("s1.h5");
  write(a, 2, 1);
  write(b, 3, 2);
  const auto mark = [](const std::string& p, std::int64_t first) {
    const hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t at = H5Acreate2(f, "shard_first_image", H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(at, H5T_NATIVE_INT64, &first);
    H5Aclose(at);
    H5Sclose(s);
    H5Fclose(f);
  };
  mark(a, 0);
  mark(b, 2);
  EXPECT_EQ(DumpReader(std::vector<std::string>{a, b}).schema().num_images, 5);
  expect_input_error([&] { DumpReader r(std::vector<std::string>{b, a}); },
                     {a, b, "shard_first_image", "at least 5", "found 0"});
  // A copy of a shard given after it: refused by its shard_first_image.
  const std::string copy = path("s0-copy.h5");
  std::filesystem::copy_file(a, copy);
  expect_input_error([&] { DumpReader r(std::vector<std::string>{a, copy}); },
                     {copy, "at least 2", "found 0"});
  // The same file twice is refused before it is read, whatever it holds (issue 21, fault 5).
  try {
    DumpReader r(std::vector<std::string>{a, a});
    ADD_FAILURE() << "the same file twice was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(a + " is given twice"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnscope
