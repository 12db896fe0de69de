// ImageRowReader (vit.hpp): an image set's /images, /labels and /logits read one image at a time
// give exactly the values written, in any order, and a bad image is named when it is read.
#include "attnscope/error.hpp"
#include "attnscope/vit.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace attnscope {
namespace {

class ImageRowsTest : public test::ScratchDirTest {
 protected:
  /// Writes /images [n, 1, 2, 3] float32 (values from the index), /labels and /logits [n, 4].
  void write_set(const std::string& file, int n, bool nan_in_last) {
    const hid_t f = H5Fcreate(file.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(f, 0);
    std::vector<float> images(static_cast<std::size_t>(n) * 6), logits(static_cast<std::size_t>(n) * 4);
    for (std::size_t i = 0; i < images.size(); ++i) images[i] = 0.25f * static_cast<float>(i) - 3.0f;
    for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 1.5f - 0.125f * static_cast<float>(i);
    if (nan_in_last) images.back() = std::nanf("");
    std::vector<std::int64_t> labels;
    for (int i = 0; i < n; ++i) labels.push_back((i * 3) % 4);
    write(f, "images", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {static_cast<hsize_t>(n), 1, 2, 3}, images.data());
    write(f, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {static_cast<hsize_t>(n), 4}, logits.data());
    write(f, "labels", H5T_STD_I64LE, H5T_NATIVE_INT64, {static_cast<hsize_t>(n)}, labels.data());
    ASSERT_GE(H5Fclose(f), 0);
  }

 private:
  static void write(hid_t f, const char* name, hid_t file_type, hid_t mem_type, const std::vector<hsize_t>& dims,
                    const void* data) {
    const hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(f, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << name;
    ASSERT_GE(H5Dwrite(ds, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0) << name;
    H5Dclose(ds);
    H5Sclose(space);
  }
};

TEST_F(ImageRowsTest, RowsAreTheValuesWritten) {
  write_set(path("set.h5"), 5, false);
  ImageRowReader rows(path("set.h5"));
  EXPECT_EQ(rows.count(), 5);
  EXPECT_EQ(rows.shape(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(rows.labels(), (std::vector<std::int64_t>{0, 3, 2, 1, 0}));
  EXPECT_EQ(rows.logit_classes(), 4);
  for (int i : {3, 0, 4, 1, 2}) {  // any order
    const VecF image = rows.image(i);
    ASSERT_EQ(image.size(), 6) << "image " << i;
    for (int c = 0; c < 6; ++c) EXPECT_EQ(image(c), 0.25f * static_cast<float>(6 * i + c) - 3.0f) << "image " << i;
    const VecF logits = rows.logits(i);
    ASSERT_EQ(logits.size(), 4) << "image " << i;
    for (int c = 0; c < 4; ++c) EXPECT_EQ(logits(c), 1.5f - 0.125f * static_cast<float>(4 * i + c)) << "image " << i;
  }
}

TEST_F(ImageRowsTest, NamesTheImageItCannotUse) {
  write_set(path("nan.h5"), 3, true);
  ImageRowReader rows(path("nan.h5"));
  EXPECT_NO_THROW((void)rows.image(0)) << "images before the bad one read";
  try {
    (void)rows.image(2);
    FAIL() << "a NaN in image 2 was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/images"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("image 2"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)rows.image(3), InputError) << "image 3 of 3";
  EXPECT_THROW((void)rows.image(-1), InputError);
  EXPECT_THROW(ImageRowReader(path("missing.h5")), InputError);
}

}  // namespace
}  // namespace attnscope
