// Hdf5Writer: matrices and attributes read back with their types, shapes and values; intermediate
// groups created; errors name the file and the object; nothing is written after close().
#include "attnscope/error.hpp"
#include "attnscope/hdf5_writer.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

namespace attnscope {
namespace {

class Hdf5WriterTest : public test::ScratchDirTest {};

// Reads what the writer wrote with the plain HDF5 API (no attnscope code on this side).
struct Reader {
  explicit Reader(const std::string& path)
      : file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT)) {}
  ~Reader() {
    if (file >= 0) H5Fclose(file);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  MatD matrix(const std::string& name, bool* f64le) const {
    const hid_t ds = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    EXPECT_GE(ds, 0) << name;
    const hid_t type = H5Dget_type(ds), space = H5Dget_space(ds);
    *f64le = H5Tequal(type, H5T_IEEE_F64LE) > 0;
    hsize_t dims[2] = {0, 0};
    EXPECT_EQ(H5Sget_simple_extent_ndims(space), 2) << name;
    H5Sget_simple_extent_dims(space, dims, nullptr);
    MatD m(static_cast<Eigen::Index>(dims[0]), static_cast<Eigen::Index>(dims[1]));
    H5Dread(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.data());
    H5Sclose(space);
    H5Tclose(type);
    H5Dclose(ds);
    return m;
  }

  // The int32 scalar attribute `name` of `object`; -999 with *ok false when it is not one.
  int int_attr(const std::string& object, const std::string& name, bool* ok) const {
    const hid_t a = H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    const hid_t type = H5Aget_type(a), space = H5Aget_space(a);
    *ok = a >= 0 && H5Tequal(type, H5T_STD_I32LE) > 0 &&
          H5Sget_simple_extent_type(space) == H5S_SCALAR;
    int v = -999;
    if (*ok) H5Aread(a, H5T_NATIVE_INT, &v);
    H5Sclose(space);
    H5Tclose(type);
    H5Aclose(a);
    return v;
  }

  // The float64 list attribute; *null true when its dataspace is null (an empty list).
  std::vector<double> doubles_attr(const std::string& object, const std::string& name, bool* f64le,
                                   bool* null) const {
    const hid_t a = H5Aopen_by_name(file, object.c_str(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT);
    const hid_t type = H5Aget_type(a), space = H5Aget_space(a);
    *f64le = H5Tequal(type, H5T_IEEE_F64LE) > 0;
    *null = H5Sget_simple_extent_type(space) == H5S_NULL;
    std::vector<double> v;
    if (!*null) {
      v.resize(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)));
      H5Aread(a, H5T_NATIVE_DOUBLE, v.data());
    }
    H5Sclose(space);
    H5Tclose(type);
    H5Aclose(a);
    return v;
  }

  hid_t file;
};

TEST_F(Hdf5WriterTest, MatricesAndAttributesReadBack) {
  MatD a(2, 3);
  a << 1.0, -2.5, 3.25, 4.0, 1e-300, -0.0;
  const MatD b = MatD::Constant(1, 4, 0.125);
  {
    Hdf5Writer w(path("r.h5"), "results/r.h5");
    w.write_root_attributes({{{"grid_height", 7}, {"grid_width", -3}}, {}});
    w.write_matrix("/x/y/a", a,
                   {{{"token", 12}, {"query_row", -1}}, {{"prefix_weights", {0.5, 0.25}}}});
    w.write_matrix("/x/b", b, {{}, {{"prefix_weights", {}}}});
    w.close();
    w.close();  // a second close does nothing
  }
  Reader r(path("r.h5"));
  ASSERT_GE(r.file, 0);
  bool ok = false, null = false;
  EXPECT_EQ(r.int_attr("/", "grid_height", &ok), 7);
  EXPECT_TRUE(ok);
  EXPECT_EQ(r.int_attr("/", "grid_width", &ok), -3);
  EXPECT_TRUE(ok);
  EXPECT_EQ(r.matrix("/x/y/a", &ok), a) << "row-major, [rows, cols]";
  EXPECT_TRUE(ok) << "float64 little-endian";
  EXPECT_EQ(r.matrix("/x/b", &ok), b);
  EXPECT_EQ(r.int_attr("/x/y/a", "token", &ok), 12);
  EXPECT_TRUE(ok);
  EXPECT_EQ(r.int_attr("/x/y/a", "query_row", &ok), -1);
  EXPECT_EQ(r.doubles_attr("/x/y/a", "prefix_weights", &ok, &null),
            (std::vector<double>{0.5, 0.25}));
  EXPECT_TRUE(ok);
  EXPECT_FALSE(null);
  EXPECT_TRUE(r.doubles_attr("/x/b", "prefix_weights", &ok, &null).empty());
  EXPECT_TRUE(ok);
  EXPECT_TRUE(null) << "an empty list has a null dataspace";
}

TEST_F(Hdf5WriterTest, ErrorsNameTheFileAndTheObject) {
  Hdf5Writer w(path("r.h5"), "shown/r.h5");
  w.write_matrix("/m", MatD::Zero(1, 1));
  try {
    w.write_matrix("/m", MatD::Zero(1, 1));
    FAIL() << "a dataset written twice was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("shown/r.h5: /m: cannot create: ", 0), 0u) << e.what();
  }
  try {
    w.write_matrix("/n", MatD::Zero(1, 1), {{{"a", 1}, {"a", 2}}, {}});
    FAIL() << "an attribute written twice was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("shown/r.h5: /n: cannot write attribute a: ", 0), 0u)
        << e.what();
  }
  w.close();
  EXPECT_THROW(w.write_matrix("/late", MatD::Zero(1, 1)), Error);
  EXPECT_THROW(w.write_root_attributes({{{"late", 1}}, {}}), Error);
}

TEST_F(Hdf5WriterTest, UncreatableFileIsAnError) {
  try {
    Hdf5Writer w(path("no-such-folder/r.h5"), "r.h5");
    FAIL() << "created a file in a missing folder";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("r.h5: cannot create: ", 0), 0u) << e.what();
  }
}

}  // namespace
}  // namespace attnscope
