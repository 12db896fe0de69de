// Feature maps (feature_map.hpp): parsing, names, parameter drawing and row-wise application.
#include "attnscope/feature_map.hpp"

#include "attnscope/error.hpp"
#include "attnscope/portable_math.hpp"
#include "feature_map_apply.hpp"
#include "normal_draws.hpp"
#include "work_count.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <functional>
#include <iomanip>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

namespace attnscope {
namespace {

struct MapEntry {
  std::string_view name;
  MapKind kind;
  bool homogeneous;  ///< phi(a x) = a phi(x) for a > 0
};
constexpr std::array<MapEntry, 7> kMaps{{{"identity", MapKind::Identity, true},
                                         {"relu", MapKind::Relu, true},
                                         {"leaky_relu", MapKind::LeakyRelu, true},
                                         {"elu1", MapKind::Elu1, false},
                                         {"exp", MapKind::Exp, false},
                                         {"relu_affine", MapKind::ReluAffine, false},
                                         {"focused", MapKind::Focused, true}}};

const MapEntry& entry_of(MapKind kind) {
  for (const auto& e : kMaps) {
    if (e.kind == kind) return e;
  }
  throw UsageError("unknown feature map value");
}

std::string_view kind_name(MapKind kind) { return entry_of(kind).name; }

std::string shortest(double x) {
  std::array<char, 64> buf{};
  const auto res = std::to_chars(buf.data(), buf.data() + buf.size(), x);
  return std::string(buf.data(), res.ptr);
}

template <typename Number>
std::optional<Number> parse_number(std::string_view s) {
  Number value{};
  const auto res = std::from_chars(s.data(), s.data() + s.size(), value);
  if (res.ec != std::errc() || res.ptr != s.data() + s.size()) return std::nullopt;
  return value;
}

[[noreturn]] void bad_parameter(std::string_view spec, std::string_view what) {
  throw UsageError("feature map '" + std::string(spec) + "': " + std::string(what));
}

}  // namespace

std::string known_feature_maps() {
  std::string out;
  for (const auto& e : kMaps) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out + " (leaky_relu=SLOPE, relu_affine=SEED, focused=P)";
}

namespace detail {
namespace {

/// Runs `alloc`, which allocates a d x d matrix of `elem_bytes` elements for `what`; a matrix
/// that cannot be had is an Error naming it and its size, not a bare bad_alloc.
void allocate_square(int d, std::size_t elem_bytes, const char* what,
                     const std::function<void()>& alloc) {
  const double bytes = static_cast<double>(d) * d * static_cast<double>(elem_bytes);
  const auto fail = [&] {
    std::ostringstream os;
    os << "out of memory: " << what << " for head dim " << d << " is a " << d << " x " << d
       << " matrix of " << std::fixed << std::setprecision(0) << bytes << " bytes ("
       << std::setprecision(1) << bytes / 0x1p30 << " GiB)";
    throw Error(os.str());
  };
  // Refused up front when it exceeds the machine's memory: the allocation itself might succeed
  // (overcommit) and the process be killed while filling it.
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && bytes > static_cast<double>(pages) * static_cast<double>(page)) fail();
  try {
    alloc();
  } catch (const std::bad_alloc&) {
    fail();
  }
}

}  // namespace
}  // namespace detail

void draw_affine_params(std::uint64_t seed, int d, MatD& A, VecD& b) {
  detail::NormalDraws draws(seed);
  const double sd = 1.0 / std::sqrt(static_cast<double>(d));
  detail::allocate_square(d, sizeof(double),
                          "the random affine map (relu_affine feature map, f1/f2 query transform)",
                          [&] { A.resize(d, d); });
  b.resize(d);
  for (int i = 0; i < d; ++i) {
    for (int j = 0; j < d; ++j) A(i, j) = sd * draws.next();
  }
  for (int i = 0; i < d; ++i) b(i) = draws.next();
}

std::string FeatureMap::name() const {
  std::string out(kind_name(kind));
  if (kind == MapKind::LeakyRelu) out.append("=").append(shortest(slope));
  if (kind == MapKind::ReluAffine) out.append("=").append(std::to_string(seed));
  if (kind == MapKind::Focused) out.append("=").append(shortest(power));
  return out;
}

bool FeatureMap::positively_homogeneous() const { return entry_of(kind).homogeneous; }

int FeatureMap::out_dim(int d) const {
  if (kind == MapKind::ReluAffine && A.size() > 0 && A.cols() == d) return static_cast<int>(A.rows());
  return d;
}

void FeatureMap::ensure_params(int d) {
  if (kind != MapKind::ReluAffine) return;
  if (A.size() > 0 && A.cols() == d && b.size() == A.rows()) return;
  draw_affine_params(seed, d, A, b);
}

template <typename T>
Mat<T> FeatureMap::apply(const Mat<T>& x) const {
  return detail::apply_feature_map<T>(*this, x, 1.0);
}

FeatureMap parse_feature_map(std::string_view spec, std::uint64_t seed) {
  const auto eq = spec.find('=');
  const std::string_view head = spec.substr(0, eq);
  const std::optional<std::string_view> param =
      eq == std::string_view::npos ? std::nullopt : std::optional(spec.substr(eq + 1));
  FeatureMap map;
  map.seed = seed;
  bool found = false;
  for (const auto& e : kMaps) {
    if (e.name == head) {
      map.kind = e.kind;
      found = true;
    }
  }
  if (!found) {
    throw UsageError("unknown feature map '" + std::string(spec) + "'; known: " +
                     known_feature_maps());
  }
  if (!param) return map;
  if (map.kind == MapKind::LeakyRelu) {
    const auto slope = parse_number<double>(*param);
    if (!slope || !std::isfinite(*slope)) bad_parameter(spec, "slope is not a finite number");
    map.slope = *slope;
  } else if (map.kind == MapKind::Focused) {
    const auto p = parse_number<double>(*param);
    if (!p || !std::isfinite(*p) || !(*p > 0.0)) bad_parameter(spec, "power is not a finite number > 0");
    map.power = *p;
  } else if (map.kind == MapKind::ReluAffine) {
    const auto s = parse_number<std::uint64_t>(*param);
    if (!s) bad_parameter(spec, "seed is not an unsigned integer");
    map.seed = *s;
  } else {
    bad_parameter(spec, "this map takes no parameter");
  }
  return map;
}

namespace detail {
namespace {

template <typename T>
void require_finite_rows(ConstRef<T> y, const FeatureMap& map) {
  // Every row finite: doubles through the vectorised portable::all_finite (Eigen's allFinite runs
  // scalar).
  bool finite = true;
  if constexpr (std::is_same_v<T, double>) {
    for (Eigen::Index i = 0; i < y.rows(); ++i) finite = portable::all_finite(y.row(i).data(), y.cols()) && finite;
  } else {
    finite = y.allFinite();
  }
  if (finite) return;
  for (Eigen::Index i = 0; i < y.rows(); ++i) {
    if (!y.row(i).allFinite()) {
      throw NumericalError("feature map " + map.name() + ": row " + std::to_string(i) +
                           " has a non-finite value (overflow or non-finite input)");
    }
  }
}

template <typename T>
void relu_affine(const FeatureMap& map, ConstRef<T> x, Eigen::Ref<Mat<T>> y) {
  const int d = static_cast<int>(x.cols());
  if (map.A.size() > 0 && map.A.cols() == d && map.b.size() == map.A.rows()) {
    count_product(x.rows(), x.cols(), map.A.rows());
    Mat<T> At;
    allocate_square(d, sizeof(T), "the relu_affine feature map's matrix in the working precision",
                    [&] { At = map.A.transpose().cast<T>(); });
    y.noalias() = x * At;
    y.rowwise() += map.b.transpose().cast<T>();
    y = y.cwiseMax(T(0));
    return;
  }
  FeatureMap drawn = map;  // parameters for this width, drawn from the map's seed
  drawn.ensure_params(d);
  relu_affine<T>(drawn, x, y);
}

/// phi_P row by row. ReLU(x)^P is formed from ReLU(x) / max ReLU(x) (entries in [0, 1], so no
/// overflow whatever the magnitude); the quotient |r| / |r^P| makes that rescaling cancel:
/// phi_P(x) = |r| p / |p| with r = ReLU(x), p = (r / max r)^P.
template <typename T>
void focused(double power, ConstRef<T> x, Eigen::Ref<Mat<T>> y) {
  y = x.cwiseMax(T(0));
  for (Eigen::Index i = 0; i < y.rows(); ++i) {
    auto row = y.row(i);
    const T top = row.maxCoeff();
    if (top == T(0)) continue;  // ReLU killed the row: phi is 0 (a NaN row falls through to the check)
    row /= top;
    const T r_norm = top * row.norm();
    for (Eigen::Index t = 0; t < row.size(); ++t) row(t) = std::pow(row(t), static_cast<T>(power));
    row *= r_norm / row.norm();
  }
}

}  // namespace

namespace {

/// The elementwise maps of doubles in plain loops over each row (vectorised; the exponentials
/// through portable::exp_doubles, portable::exp's bits): the same values as the Eigen expressions
/// below, operation for operation (std::max(x, 0) is Eigen's cwiseMax, std::min its cwiseMin),
/// without Eigen's scalar loops. False for the other maps.
bool elementwise_rows(const FeatureMap& map, ConstRef<double> x, double factor, Eigen::Ref<MatD> y) {
  const MapKind k = map.kind;
  if (k != MapKind::Identity && k != MapKind::Relu && k != MapKind::Elu1 && k != MapKind::Exp) return false;
  const Eigen::Index d = x.cols();
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    const double* xi = x.row(i).data();
    double* yi = y.row(i).data();
    switch (k) {
      case MapKind::Identity:
        std::copy(xi, xi + d, yi);
        break;
      case MapKind::Relu:
        for (Eigen::Index t = 0; t < d; ++t) yi[t] = std::max(xi[t], 0.0);
        break;
      case MapKind::Elu1:
        for (Eigen::Index t = 0; t < d; ++t) yi[t] = std::min(xi[t], 0.0);
        portable::exp_doubles(yi, d);
        for (Eigen::Index t = 0; t < d; ++t) yi[t] = std::max(xi[t], 0.0) + yi[t];
        break;
      default:  // Exp
        std::copy(xi, xi + d, yi);
        portable::exp_doubles(yi, d);
        break;
    }
    if (factor != 1.0) {
      for (Eigen::Index t = 0; t < d; ++t) yi[t] *= factor;
    }
  }
  return true;
}

}  // namespace

template <typename T>
void apply_feature_map_into(const FeatureMap& map, ConstRef<T> x, double factor,
                            Eigen::Ref<Mat<T>> y) {
  if constexpr (std::is_same_v<T, double>) {
    if (elementwise_rows(map, x, factor, y)) {
      require_finite_rows<T>(y, map);
      return;
    }
  }
  switch (map.kind) {
    case MapKind::Identity:
      y = x;
      break;
    case MapKind::Relu:
      y = x.cwiseMax(T(0));
      break;
    // Written with max/min instead of select() so that the compiler vectorises them; both forms are
    // exact (adding an exact 0, and exp(0) == 1).
    case MapKind::LeakyRelu:
      y = x.cwiseMax(T(0)) + T(map.slope) * x.cwiseMin(T(0));
      break;
    case MapKind::Elu1:  // ELU(x) + 1: x + 1 above zero, exp(x) at or below
      y = x.cwiseMax(T(0)).array() + x.cwiseMin(T(0)).array().unaryExpr(portable::Exp{});
      break;
    case MapKind::Exp:
      y = x.array().unaryExpr(portable::Exp{});
      break;
    case MapKind::ReluAffine:
      relu_affine<T>(map, x, y);
      break;
    case MapKind::Focused:
      focused<T>(map.power, x, y);
      break;
  }
  if (factor != 1.0) y *= static_cast<T>(factor);
  require_finite_rows<T>(y, map);
}

template <typename T>
Mat<T> apply_feature_map(const FeatureMap& map, ConstRef<T> x, double factor) {
  Mat<T> y(x.rows(), map.out_dim(static_cast<int>(x.cols())));
  apply_feature_map_into<T>(map, x, factor, y);
  return y;
}

template Mat<float> apply_feature_map<float>(const FeatureMap&, ConstRef<float>, double);
template Mat<double> apply_feature_map<double>(const FeatureMap&, ConstRef<double>, double);
template void apply_feature_map_into<float>(const FeatureMap&, ConstRef<float>, double,
                                            Eigen::Ref<MatF>);
template void apply_feature_map_into<double>(const FeatureMap&, ConstRef<double>, double,
                                             Eigen::Ref<MatD>);

}  // namespace detail

template Mat<float> FeatureMap::apply<float>(const Mat<float>&) const;
template Mat<double> FeatureMap::apply<double>(const Mat<double>&) const;

}  // namespace attnscope
