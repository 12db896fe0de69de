// Arrays in and out of the module: numpy arrays (torch CPU tensors arrive as numpy views, made by
// attnscope/__init__.py) read as stacks of heads in the dump's layout (lib/include/attnscope/
// layout.hpp): [images, heads, tokens, dim], or a single head [tokens, dim]. A C-contiguous array
// of the computing scalar is read in place; any other layout or float16 is converted once.
#pragma once

#include "attnscope/layout.hpp"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every part of the module: type casters must agree across files

#include <Eigen/Core>

#include <exception>
#include <string>
#include <type_traits>
#include <vector>

namespace attnscope::python {

namespace pyb = pybind11;

/// The scalar a computation runs in: float for float16/float32 inputs, double when any input is
/// float64. Throws pyb::type_error naming the array for any other dtype.
enum class Scalar { Float, Double };
Scalar scalar_of(const std::vector<std::pair<const char*, pyb::handle>>& arrays);

/// A read-only stack of heads. `single`: the array was one head [tokens, dim]; results then drop
/// the images and heads axes.
template <typename T>
class Heads {
 public:
  /// Checks the rank (2 or 4), a non-empty head, and that every value is finite (InputError
  /// naming the array and the first bad element, as the dump reader does).
  Heads(pyb::handle obj, const char* name);

  [[nodiscard]] bool single() const { return single_; }
  [[nodiscard]] Eigen::Index images() const { return images_; }
  [[nodiscard]] Eigen::Index heads() const { return heads_; }
  [[nodiscard]] Eigen::Index tokens() const { return tokens_; }
  [[nodiscard]] Eigen::Index dim() const { return dim_; }
  [[nodiscard]] Eigen::Index count() const { return images_ * heads_; }
  [[nodiscard]] const char* name() const { return name_; }
  /// Head `index` (= image * heads() + head), in place.
  [[nodiscard]] Eigen::Map<const Mat<T>> head(Eigen::Index index) const {
    return {data_ + index * tokens_ * dim_, tokens_, dim_};
  }
  /// The shape of a result with `tail` as its trailing axes ([images, heads] + tail, or tail).
  [[nodiscard]] std::vector<pyb::ssize_t> shape(std::vector<pyb::ssize_t> tail) const;

 private:
  pyb::array_t<T, pyb::array::c_style | pyb::array::forcecast> array_;
  const char* name_;
  bool single_ = false;
  Eigen::Index images_ = 1, heads_ = 1, tokens_ = 0, dim_ = 0;
  const T* data_ = nullptr;
};

/// Throws UsageError unless b has a's images, heads and tokens (and, when `same_dim`, its dim).
template <typename A, typename B>
void require_same_heads(const Heads<A>& a, const Heads<B>& b, bool same_dim);

/// The model's scale s: the given one, or dim^-1/2 (the default of every model we read).
double scale_or_default(const pyb::object& scale, Eigen::Index dim);

/// A head copied to float: the analyses take the dump's precision (float64 inputs are rounded).
template <typename T>
MatF to_float(const Eigen::Map<const Mat<T>>& head) {
  return head.template cast<float>();
}

/// Runs fn(index) for every index < n with the GIL released, in parallel over OpenMP threads.
/// When some throw, the exception of the lowest index is rethrown after the loop (the same one
/// whatever the threads did).
template <typename Fn>
void for_each_index(Eigen::Index n, Fn&& fn) {
  pyb::gil_scoped_release release;
  std::exception_ptr error;
  Eigen::Index error_index = n;
#pragma omp parallel for schedule(dynamic, 1)
  for (Eigen::Index i = 0; i < n; ++i) {
    try {
      fn(i);
    } catch (...) {
#pragma omp critical(attnscope_python_error)
      if (i < error_index) {
        error_index = i;
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

/// The grid of a (prefix, height, width) triple: prefix >= 0, height and width >= 1, under 2^30
/// tokens in all (UsageError otherwise).
TokenGrid grid_shape(const std::vector<int>& grid);

/// grid_shape's grid; UsageError unless it holds `tokens` tokens.
TokenGrid grid_of(const std::vector<int>& grid, Eigen::Index tokens);

/// options[key] as a T, or `fallback` where the dict lacks it; a value of another type is a
/// TypeError naming the key (pybind11's own says only that a cast failed).
template <typename T>
T option(const pyb::dict& options, const char* key, T fallback) {
  if (!options.contains(key)) return fallback;
  const pyb::object value = options[key];
  try {
    return value.cast<T>();
  } catch (const pyb::cast_error&) {
    throw pyb::type_error(std::string(key) + ": expected " +
                          (std::is_same_v<T, bool> ? "True or False"
                           : std::is_integral_v<T> ? "an integer"
                                                   : "a number") +
                          ", got " + std::string(pyb::str(pyb::repr(value))));
  }
}

/// UsageError naming the first key of `options` that `known` lacks (`what`: the analysis).
void require_known_options(const std::string& what, const pyb::dict& options,
                           const std::vector<std::string>& known);

}  // namespace attnscope::python
