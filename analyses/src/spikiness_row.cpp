// Spikiness of one row, and the parsing of the sweep's parameters.
#include "attnscope/analyses/spikiness.hpp"

#include "attnscope/error.hpp"
#include "attnscope/portable_math.hpp"

#include <algorithm>
#include <sstream>
#include <charconv>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace attnscope::analyses {

RowStats row_stats(const VecD& w, int topk) {
  RowStats s;
  const Eigen::Index n = w.size();
  if (n == 0) return s;
  s.max_weight = w.maxCoeff();
  double positive_sum = 0.0;
  for (Eigen::Index j = 0; j < n; ++j) {
    if (w[j] < 0.0) ++s.negatives;
    if (w[j] == 0.0) ++s.zeros;
    if (w[j] > 0.0) positive_sum += w[j];
  }
  // Weights whose sum overflows (two of 1e308) are summed relative to the largest: p is the same
  // ratio, and the sum finite.
  const double unit = std::isfinite(positive_sum) ? 1.0 : s.max_weight;
  if (unit != 1.0) {
    positive_sum = 0.0;
    for (Eigen::Index j = 0; j < n; ++j) {
      if (w[j] > 0.0) positive_sum += w[j] / unit;
    }
  }
  if (positive_sum > 0.0) {
    double h = 0.0;
    for (Eigen::Index j = 0; j < n; ++j) {
      if (w[j] <= 0.0) continue;
      const double p = w[j] / unit / positive_sum;
      if (p > 0.0) h -= p * portable::log(p);
    }
    s.entropy = std::max(h, 0.0);
    s.effective_keys = portable::exp(s.entropy);
  } else {
    s.entropy = s.effective_keys = std::numeric_limits<double>::quiet_NaN();
  }
  std::vector<double> sorted(w.data(), w.data() + n);
  const auto k = static_cast<std::size_t>(std::clamp<Eigen::Index>(topk, 0, n));
  std::partial_sort(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), sorted.end(),
                    std::greater<>());
  s.topk_mass =
      std::accumulate(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k), 0.0);
  return s;
}

namespace {

double parse_double(std::string_view text, std::string_view what) {
  double x = 0.0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, x);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(std::string(what) + ": expected a number, found '" + std::string(text) + "'");
  }
  return x;
}

int parse_int(std::string_view text, std::string_view what) {
  int x = 0;
  const auto* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, x);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(std::string(what) + ": expected an integer, found '" + std::string(text) +
                     "'");
  }
  return x;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  while (true) {
    const std::size_t pos = s.find(sep, start);
    parts.push_back(
        s.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

void check_scale(double a, std::string_view spec) {
  if (!std::isfinite(a) || a <= 0.0) {
    throw UsageError("--scales '" + std::string(spec) + "': every factor must be finite and > 0");
  }
}

}  // namespace

std::vector<double> parse_scales(std::string_view spec) {
  std::vector<double> scales;
  const auto range = split(spec, ':');
  if (range.size() == 3) {
    const double lo = parse_double(range[0], "--scales LO");
    const double hi = parse_double(range[1], "--scales HI");
    const int count = parse_int(range[2], "--scales COUNT");
    check_scale(lo, spec);
    check_scale(hi, spec);
    if (count < 1) throw UsageError("--scales COUNT must be >= 1, got " + std::to_string(count));
    if (count == 1 && lo != hi) throw UsageError("--scales LO:HI:1 needs LO == HI");
    for (int i = 0; i < count; ++i) {
      // Log-spaced, with both ends exact.
      const double t = count == 1 ? 0.0 : static_cast<double>(i) / (count - 1);
      scales.push_back(i == 0 ? lo : i == count - 1 ? hi : lo * portable::exp(t * portable::log(hi / lo)));
    }
    // A range must give distinct factors, as a list must (1:1:5 would be factor 1 five times).
    for (std::size_t i = 1; i < scales.size(); ++i) {
      if (std::find(scales.begin(), scales.begin() + static_cast<std::ptrdiff_t>(i), scales[i]) !=
          scales.begin() + static_cast<std::ptrdiff_t>(i)) {
        std::ostringstream factor;
        factor << scales[i];
        throw UsageError("--scales '" + std::string(spec) + "': the range gives factor " + factor.str() +
                         " more than once (LO and HI must differ, or COUNT be 1)");
      }
    }
    return scales;
  }
  if (range.size() != 1) {
    throw UsageError("--scales: expected LO:HI:COUNT or a list A,B,..., found '" +
                     std::string(spec) + "'");
  }
  for (auto part : split(spec, ',')) {
    const double a = parse_double(part, "--scales");
    check_scale(a, spec);
    if (std::find(scales.begin(), scales.end(), a) != scales.end()) {
      throw UsageError("--scales '" + std::string(spec) + "': factor " + std::string(part) +
                       " is listed twice");
    }
    scales.push_back(a);
  }
  return scales;
}

std::string KeyRef::name() const {
  switch (kind) {
    case Kind::Top:
      return "top";
    case Kind::Median:
      return "median";
    case Kind::Bottom:
      return "bottom";
    case Kind::Index:
      return std::to_string(index);
  }
  return "?";
}

int KeyRef::resolve(const VecD& w) const {
  const auto n = static_cast<int>(w.size());
  if (kind == Kind::Index) {
    if (index < 0 || index >= n) {
      throw UsageError("--keys: key index " + std::to_string(index) + " is out of range [0, " +
                       std::to_string(n) + ")");
    }
    return index;
  }
  std::vector<int> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  // Decreasing weight, ties by index: the same keys on every platform.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return w[a] > w[b]; });
  const int rank = kind == Kind::Top ? 0 : kind == Kind::Median ? (n - 1) / 2 : n - 1;
  return order[static_cast<std::size_t>(rank)];
}

namespace {

KeyRef parse_key_ref(std::string_view s) {
  if (s == "top") return {KeyRef::Kind::Top, 0};
  if (s == "median") return {KeyRef::Kind::Median, 0};
  if (s == "bottom") return {KeyRef::Kind::Bottom, 0};
  const int index = parse_int(s, "--keys (top, median, bottom or a key index)");
  if (index < 0) throw UsageError("--keys: a key index must be >= 0, got " + std::to_string(index));
  return {KeyRef::Kind::Index, index};
}

}  // namespace

KeyPair parse_key_pair(std::string_view spec) {
  const auto parts = split(spec, ',');
  if (parts.size() != 2) {
    throw UsageError("--keys: expected HIGH,LOW (e.g. top,median or 3,17), found '" +
                     std::string(spec) + "'");
  }
  KeyPair pair{parse_key_ref(parts[0]), parse_key_ref(parts[1])};
  if (pair.high.name() == pair.low.name()) {
    throw UsageError("--keys: HIGH and LOW are the same key ('" + pair.high.name() + "')");
  }
  return pair;
}

ScaleSpace parse_scale_space(std::string_view s) {
  if (s == "auto") return ScaleSpace::Auto;
  if (s == "query") return ScaleSpace::Query;
  if (s == "feature") return ScaleSpace::Feature;
  throw UsageError("--scale-space: expected auto, query or feature, found '" + std::string(s) +
                   "'");
}

std::string to_string(ScaleSpace s) {
  switch (s) {
    case ScaleSpace::Auto:
      return "auto";
    case ScaleSpace::Query:
      return "query";
    case ScaleSpace::Feature:
      return "feature";
  }
  return "?";
}

ScaleSpace effective_space(const Variant& v, ScaleSpace s) {
  if (!v.kernel()) return ScaleSpace::Query;  // the score form has no query features
  return s == ScaleSpace::Auto ? ScaleSpace::Feature : s;
}

std::string to_string(Law law) {
  switch (law) {  // names of the laws (family.hpp), not of families
    case Law::SoftmaxPower:
      return "softmax_power";
    case Law::LinearInvariant:
      return "linear_invariant";
    case Law::InlineAffine:
      return "inline_affine";
    case Law::MalaRatio:
      return "mala_ratio";
    case Law::MalaBetaGamma:
      return "mala_beta_gamma";
  }
  return "?";
}

void LawResult::merge(const LawResult& o) {
  max_deviation = std::max(max_deviation, o.max_deviation);
  queries += o.queries;
  points += o.points;
  skipped += o.skipped;
}


}  // namespace attnscope::analyses
