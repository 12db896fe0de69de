#include "arrays.hpp"

#include "attnscope/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace attnscope::python {

namespace {

std::string str(Eigen::Index x) { return std::to_string(x); }

/// "float16, float32 or float64" arrays only; the dtype's name otherwise.
bool is_float(const pyb::dtype& dt) {
  return dt.kind() == 'f' && (dt.itemsize() == 2 || dt.itemsize() == 4 || dt.itemsize() == 8);
}

pyb::dtype dtype_of(const char* name, pyb::handle obj) {
  if (!pyb::isinstance<pyb::array>(obj)) {
    throw pyb::type_error(std::string(name) +
                          ": expected a numpy array or a torch CPU tensor, got " +
                          std::string(pyb::str(obj.get_type().attr("__name__"))));
  }
  pyb::dtype dt = pyb::reinterpret_borrow<pyb::array>(obj).dtype();
  if (!is_float(dt)) {
    throw pyb::type_error(std::string(name) +
                          ": expected float16, float32 or float64 values, got " +
                          std::string(pyb::str(dt)));
  }
  return dt;
}

/// Whether every value of p[0, n) is finite: its exponent bits are not all ones. An OR over integer
/// tests, which the compiler vectorises (std::isfinite's branch per value is not): the check runs
/// on every input array, and at DeiT-T shape its scalar form cost several percent of a call.
template <typename T>
bool all_finite(const T* p, Eigen::Index n) {
  using Bits = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr Bits exponent = static_cast<Bits>(sizeof(T) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  Bits bad = 0;
  for (Eigen::Index i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i, sizeof b);
    bad |= static_cast<Bits>((b & exponent) == exponent);
  }
  return bad == 0;
}

}  // namespace

Scalar scalar_of(const std::vector<std::pair<const char*, pyb::handle>>& arrays) {
  Scalar s = Scalar::Float;
  for (const auto& [name, obj] : arrays) {
    if (dtype_of(name, obj).itemsize() == 8) s = Scalar::Double;
  }
  return s;
}

template <typename T>
Heads<T>::Heads(pyb::handle obj, const char* name) : name_(name) {
  dtype_of(name, obj);
  // The constructor keeps Python's error (a MemoryError for a copy too large) where ensure()
  // clears it.
  array_ = pyb::array_t<T, pyb::array::c_style | pyb::array::forcecast>(
      pyb::reinterpret_borrow<pyb::object>(obj));
  const pyb::ssize_t rank = array_.ndim();
  if (rank != 2 && rank != 4) {
    throw UsageError(std::string(name) +
                     ": expected a [tokens, dim] or [images, heads, tokens, dim] array, got " +
                     std::to_string(rank) + " dimensions");
  }
  single_ = rank == 2;
  if (!single_) {
    images_ = array_.shape(0);
    heads_ = array_.shape(1);
  }
  tokens_ = array_.shape(rank - 2);
  dim_ = array_.shape(rank - 1);
  if (images_ == 0 || heads_ == 0 || tokens_ == 0 || dim_ == 0) {
    throw UsageError(
        std::string(name) + ": expected at least one image, head, token and dim, got shape " +
        std::string(
            pyb::str(pyb::cast(std::vector<pyb::ssize_t>(array_.shape(), array_.shape() + rank)))));
  }
  data_ = array_.data();
  const Eigen::Index n = count() * tokens_ * dim_;
  // The scan runs on every input array before any work: in parallel, without the GIL, in chunks
  // of whole cache lines (the values themselves, not their order, decide; the first bad one is
  // then found by the plain scan below).
  bool finite = true;
  {
    pyb::gil_scoped_release release;
    constexpr Eigen::Index kChunk = Eigen::Index{1} << 16;
    const Eigen::Index chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) reduction(&& : finite) if (chunks > 1)
    for (Eigen::Index c = 0; c < chunks; ++c) {
      finite = all_finite(data_ + c * kChunk, std::min(kChunk, n - c * kChunk)) && finite;
    }
  }
  if (finite) return;
  for (Eigen::Index i = 0; i < n; ++i) {
    if (std::isfinite(data_[i])) continue;
    // The first bad value, named as the dump reader names one: its coordinates along each axis.
    const Eigen::Index image = i / (heads_ * tokens_ * dim_), head = i / (tokens_ * dim_) % heads_;
    const Eigen::Index token = i / dim_ % tokens_, d = i % dim_;
    std::string where =
        single_ ? std::string() : "image " + str(image) + ", head " + str(head) + ", ";
    where += "token " + str(token) + ", dim " + str(d);
    throw InputError("", name, "finite values",
                     std::string(std::isnan(data_[i]) ? "NaN" : "Inf") + " at " + where);
  }
}

template <typename T>
std::vector<pyb::ssize_t> Heads<T>::shape(std::vector<pyb::ssize_t> tail) const {
  if (single_) return tail;
  tail.insert(tail.begin(),
              {static_cast<pyb::ssize_t>(images_), static_cast<pyb::ssize_t>(heads_)});
  return tail;
}

template <typename A, typename B>
void require_same_heads(const Heads<A>& a, const Heads<B>& b, bool same_dim) {
  auto describe = [](auto& h) {
    std::string s = h.single() ? "[" : "[" + str(h.images()) + ", " + str(h.heads()) + ", ";
    return s + str(h.tokens()) + ", " + str(h.dim()) + "]";
  };
  const bool ok = a.single() == b.single() && a.images() == b.images() && a.heads() == b.heads() &&
                  a.tokens() == b.tokens() && (!same_dim || a.dim() == b.dim());
  if (!ok) {
    throw UsageError(std::string(b.name()) + " is " + describe(b) + ", expected the " +
                     (same_dim ? "shape" : "images, heads and tokens") + " of " + a.name() + " " +
                     describe(a));
  }
}

double scale_or_default(const pyb::object& scale, Eigen::Index dim) {
  if (scale.is_none()) return 1.0 / std::sqrt(static_cast<double>(dim));
  const double s = scale.cast<double>();
  if (!std::isfinite(s))
    throw UsageError("scale: expected a finite number, got " + std::to_string(s));
  return s;
}

TokenGrid grid_shape(const std::vector<int>& grid) {
  if (grid.size() != 3) {
    throw UsageError("grid: expected (prefix_tokens, height, width), got " +
                     std::to_string(grid.size()) + " numbers");
  }
  const TokenGrid g{grid[0], grid[1], grid[2]};
  // In 64 bits: height * width of two large ints wraps in int (65536 x 65536 gave 0 tokens).
  const long long tokens = static_cast<long long>(g.prefix) + static_cast<long long>(g.height) * g.width;
  if (g.prefix < 0 || g.height < 1 || g.width < 1 || tokens >= (1LL << 30)) {
    throw UsageError("grid: expected prefix_tokens >= 0, height and width >= 1 and under 2^30 "
                     "tokens in all, got (" + std::to_string(g.prefix) + ", " +
                     std::to_string(g.height) + ", " + std::to_string(g.width) + ")");
  }
  return g;
}

TokenGrid grid_of(const std::vector<int>& grid, Eigen::Index tokens) {
  const TokenGrid g = grid_shape(grid);
  if (g.tokens() != tokens) {
    throw UsageError("grid: (" + std::to_string(g.prefix) + ", " + std::to_string(g.height) + ", " +
                     std::to_string(g.width) + ") does not hold the " + str(tokens) +
                     " tokens of the heads (prefix + height * width)");
  }
  return g;
}

void require_known_options(const std::string& what, const pyb::dict& options,
                           const std::vector<std::string>& known) {
  for (const auto& [key, value] : options) {
    const std::string k = pyb::str(key);
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      throw UsageError(what + ": unknown option '" + k + "'");
    }
  }
}

template class Heads<float>;
template class Heads<double>;
template void require_same_heads(const Heads<float>&, const Heads<float>&, bool);
template void require_same_heads(const Heads<double>&, const Heads<double>&, bool);

}  // namespace attnscope::python
