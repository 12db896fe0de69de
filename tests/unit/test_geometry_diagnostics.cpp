// Entropy, distance, rank, the weight census and masking of heads whose layer is not one square
// attention (geometry.hpp): Swin's windows with a shift and its mask, windows of one token, PVT's
// keys from a reduced grid (with and without a prefix token, down to one key). Each unit-by-unit
// path is compared, for every family, with plain loops written here from the definitions
// (entropy.hpp, distance.hpp, rank.hpp) over the plain-loop reference weights (lib/src/reference)
// with each window's mask; on a square layer the unit path equals the square analyses. Negative
// controls show the comparisons can fail: the mask left out, the reduced keys placed at their
// block's corner.
#include "attnscope/analyses/census.hpp"
#include "attnscope/analyses/distance.hpp"
#include "attnscope/analyses/entropy.hpp"
#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/masking.hpp"
#include "attnscope/analyses/rank.hpp"
#include "attnscope/error.hpp"
#include "attnscope/seed.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>
#include <Eigen/SVD>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace attnscope::analyses {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

LayerGeometry base(const TokenGrid& grid, const TokenGrid& keys, int d) {
  LayerGeometry geo;
  geo.num_heads = 1;
  geo.head_dim = d;
  geo.scale = 1.0 / std::sqrt(static_cast<double>(d));
  geo.grid = grid;
  geo.key_grid = keys;
  return geo;
}

/// Swin's windows of wh x ww on an h x w grid rolled by -shift: a token's position is its cell
/// before the roll; with a shift, the pairs of one region of the rolled grid are allowed.
LayerGeometry swin(int h, int w, int wh, int ww, int shift, int d) {
  LayerGeometry geo = base(TokenGrid{0, h, w}, TokenGrid{0, h, w}, d);
  geo.windows = (h / wh) * (w / ww);
  geo.window_height = wh;
  geo.window_width = ww;
  geo.shift = shift;
  const auto region = [shift](int x, int n, int win) {
    return x < n - win ? 0 : (x < n - shift ? 1 : 2);
  };
  std::vector<int> label;
  for (int wr = 0; wr < h / wh; ++wr) {
    for (int wc = 0; wc < w / ww; ++wc) {
      for (int t = 0; t < wh * ww; ++t) {
        const int r = wr * wh + t / ww, c = wc * ww + t % ww;  // on the rolled grid
        geo.positions.push_back((r + shift) % h);
        geo.positions.push_back((c + shift) % w);
        label.push_back(3 * region(r, h, wh) + region(c, w, ww));
      }
    }
  }
  if (shift > 0) {
    const int n = wh * ww;
    for (int u = 0; u < geo.windows; ++u) {
      for (int i = 0; i < n; ++i) {
        for (int j = 0; j < n; ++j) {
          geo.window_mask.push_back(label[static_cast<std::size_t>(u * n + i)] ==
                                            label[static_cast<std::size_t>(u * n + j)]
                                        ? 1
                                        : 0);
        }
      }
    }
  }
  return geo;
}

struct Case {
  std::string name;
  LayerGeometry geo;
  TokenGrid root;  ///< the dump's grid (distance's patch is the root's)
};

std::vector<Case> cases(int d) {
  return {
      {"windows 2x3 on 4x6, shift 1", swin(4, 6, 2, 3, 1, d), TokenGrid{0, 8, 12}},
      {"windows 3x3 on 6x6, no shift", swin(6, 6, 3, 3, 0, d), TokenGrid{1, 6, 6}},
      {"windows 1x1 on 2x3", swin(2, 3, 1, 1, 0, d), TokenGrid{0, 2, 3}},
      {"keys 3x2+1 of 7x5+1", base(TokenGrid{1, 7, 5}, TokenGrid{1, 3, 2}, d), TokenGrid{1, 7, 5}},
      {"keys 1x1 of 2x2", base(TokenGrid{0, 2, 2}, TokenGrid{0, 1, 1}, d), TokenGrid{0, 4, 4}},
      {"keys 4x4 of 9x9", base(TokenGrid{0, 9, 9}, TokenGrid{0, 4, 4}, d), TokenGrid{0, 9, 9}},
  };
}

/// One unit's reference weights (the plain loops of lib/src/reference, the unit's mask applied).
MatD unit_weights(const Variant& v, const MatF& q, const MatF& k, const LayerGeometry& geo, int u,
                  std::vector<int>& degenerate, bool with_mask = true) {
  const int nq = geo.unit_queries(), nk = geo.unit_keys();
  const MatD qd = q.middleRows(static_cast<Eigen::Index>(u) * nq, nq).cast<double>();
  const MatD kd = k.middleRows(static_cast<Eigen::Index>(u) * nk, nk).cast<double>();
  const Mask mask = geo.unit_mask(u);
  degenerate.clear();
  return reference::weights(v, qd, kd, geo.scale, with_mask && geo.masked(u) ? &mask : nullptr,
                            &degenerate);
}

bool listed(const std::vector<int>& rows, int i) {
  return std::find(rows.begin(), rows.end(), i) != rows.end();
}

/// -sum p log p of every row (|w| renormalised where a weight is negative) and its share of log
/// of the keys the row is allowed.
void entropy_reference(const Variant& v, const MatF& q, const MatF& k, const LayerGeometry& geo,
                       std::vector<double>& h, std::vector<double>& share, bool with_mask = true) {
  h.clear();
  share.clear();
  for (int u = 0; u < geo.units(); ++u) {
    std::vector<int> dead;
    const MatD w = unit_weights(v, q, k, geo, u, dead, with_mask);
    const Mask mask = geo.unit_mask(u);
    for (Eigen::Index i = 0; i < w.rows(); ++i) {
      if (listed(dead, static_cast<int>(i))) {
        h.push_back(kNaN);
        share.push_back(kNaN);
        continue;
      }
      double abs_sum = 0.0;
      bool negative = false;
      for (Eigen::Index j = 0; j < w.cols(); ++j) {
        abs_sum += std::fabs(w(i, j));
        negative = negative || w(i, j) < 0.0;
      }
      double e = 0.0;
      for (Eigen::Index j = 0; j < w.cols(); ++j) {
        const double p = negative ? std::fabs(w(i, j)) / abs_sum : w(i, j);
        if (p > 0.0) e -= p * std::log(p);
      }
      const auto seen = static_cast<double>(with_mask ? mask.row(i).count() : w.cols());
      h.push_back(e);
      share.push_back(seen > 1 ? e / std::log(seen) : 0.0);
    }
  }
}

/// Pixel distances from the patch centres: the stage's patch is the root's scaled to the stage's
/// grid; a reduced key sits at the centre of the block of query cells it pools, a window's key at
/// its own cell.
void distance_reference(const Variant& v, const MatF& q, const MatF& k, const LayerGeometry& geo,
                        const TokenGrid& root, double ph, double pw, bool key_corner,
                        std::vector<double>& dist, std::vector<double>& mass) {
  const double sh = ph * root.height / geo.grid.height, sw = pw * root.width / geo.grid.width;
  const double bh = static_cast<double>(geo.grid.height) / geo.key_grid.height;
  const double bw = static_cast<double>(geo.grid.width) / geo.key_grid.width;
  dist.clear();
  mass.clear();
  for (int u = 0; u < geo.units(); ++u) {
    std::vector<int> dead;
    const MatD w = unit_weights(v, q, k, geo, u, dead);
    for (int i = 0; i < geo.unit_queries(); ++i) {
      int qr = 0, qc = 0;
      if (geo.windows > 0) {
        qr = geo.positions[static_cast<std::size_t>((u * geo.window_tokens() + i) * 2)];
        qc = geo.positions[static_cast<std::size_t>((u * geo.window_tokens() + i) * 2 + 1)];
      } else if (i < geo.grid.prefix || listed(dead, i)) {
        dist.push_back(kNaN);
        mass.push_back(kNaN);
        continue;
      } else {
        qr = (i - geo.grid.prefix) / geo.grid.width;
        qc = (i - geo.grid.prefix) % geo.grid.width;
      }
      if (listed(dead, i)) {
        dist.push_back(kNaN);
        mass.push_back(kNaN);
        continue;
      }
      const double qy = (qr + 0.5) * sh, qx = (qc + 0.5) * sw;
      double s = 0.0, m = 0.0;
      for (int j = 0; j < geo.unit_keys(); ++j) {
        double ky = 0.0, kx = 0.0;
        if (geo.windows > 0) {
          ky = (geo.positions[static_cast<std::size_t>((u * geo.window_tokens() + j) * 2)] + 0.5) *
               sh;
          kx = (geo.positions[static_cast<std::size_t>((u * geo.window_tokens() + j) * 2 + 1)] +
                0.5) *
               sw;
        } else if (j < geo.key_grid.prefix) {
          continue;
        } else {
          const int kr = (j - geo.key_grid.prefix) / geo.key_grid.width;
          const int kc = (j - geo.key_grid.prefix) % geo.key_grid.width;
          const double at = key_corner ? 0.0 : 0.5;  // the negative control: the block's corner
          ky = (kr * bh + at * bh) * sh;
          kx = (kc * bw + at * bw) * sw;
        }
        s += w(i, j) * std::hypot(qy - ky, qx - kx);
        m += w(i, j);
      }
      dist.push_back(s);
      mass.push_back(m);
    }
  }
}

std::vector<double> jacobi(const MatD& m) {
  const Eigen::JacobiSVD<MatD> svd(m);
  return {svd.singularValues().data(), svd.singularValues().data() + svd.singularValues().size()};
}

std::string what(const std::string& spec, const Case& c, int d) {
  return spec + ", " + c.name + " (" + c.geo.describe() + "), d=" + std::to_string(d) + ", seed 51";
}

/// q, k of the case's geometry, drawn for the variant.
std::pair<MatF, MatF> head(const Variant& v, const LayerGeometry& geo, int d) {
  const double mean = test::input_mean(v);
  return {test::random_matrix(geo.query_rows(), d, 51, mean).cast<float>(),
          test::random_matrix(geo.key_rows(), d, 52, mean).cast<float>()};
}

void expect_rows(const std::vector<double>& got, const std::vector<double>& want, double tol,
                 const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (std::size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::isnan(got[i]), std::isnan(want[i])) << label << " row " << i;
    if (!std::isnan(got[i])) {
      EXPECT_NEAR(got[i], want[i], tol) << label << " row " << i;
    }
  }
}

/// Softmax units go through the float path (its proven bound); the others are double throughout.
double tolerance(const Variant& v) { return v.linear_time_outputs() ? 1e-9 : test::kFloatTol; }

TEST(GeometryDiagnostics, EntropyOfEachUnitEqualsThePlainLoops) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int d : {1, 7}) {
      for (const Case& c : cases(d)) {
        const auto [q, k] = head(v, c.geo, d);
        const std::string label = what(spec, c, d);
        const EntropyRows got = attention_entropy_units(v, q, k, c.geo.scale, c.geo, {});
        std::vector<double> h, share;
        entropy_reference(v, q, k, c.geo, h, share);
        expect_rows(got.entropy, h, tolerance(v), label + " entropy");
        expect_rows(got.normalised, share, tolerance(v), label + " normalised");
        int dead = 0;
        for (double x : h) dead += std::isnan(x) ? 1 : 0;
        EXPECT_EQ(got.degenerate, dead) << label;
      }
    }
  }
}

TEST(GeometryDiagnostics, EntropyOfAShiftedWindowDependsOnItsMask) {
  // Negative control: the same heads without the mask (every pair of a window allowed) give
  // other entropies on the masked windows, so the comparison above sees the mask.
  const Variant v = parse_variant("softmax");
  const Case c = cases(7).front();
  const auto [q, k] = head(v, c.geo, 7);
  const EntropyRows got = attention_entropy_units(v, q, k, c.geo.scale, c.geo, {});
  std::vector<double> h, share;
  entropy_reference(v, q, k, c.geo, h, share, false);
  double worst = 0.0;
  for (std::size_t i = 0; i < h.size(); ++i)
    worst = std::max(worst, std::fabs(h[i] - got.entropy[i]));
  EXPECT_GT(worst, 0.1) << "the mask changes nothing: " << c.geo.describe();
  // Windows of one token: entropy 0, share 0 (log 1 = 0).
  const Case one = cases(7)[2];
  const auto [q1, k1] = head(v, one.geo, 7);
  for (double x : attention_entropy_units(v, q1, k1, one.geo.scale, one.geo, {}).normalised) {
    EXPECT_EQ(x, 0.0);
  }
}

TEST(GeometryDiagnostics, DistanceOfEachUnitEqualsThePlainLoops) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int d : {1, 7}) {
      for (const Case& c : cases(d)) {
        const auto [q, k] = head(v, c.geo, d);
        const std::string label = what(spec, c, d);
        const PatchGeometry root(c.root, 3.0, 2.0);  // non-square patches
        const DistanceRows got = attention_distance_units(v, q, k, c.geo.scale, c.geo, root, {});
        std::vector<double> dist, mass;
        distance_reference(v, q, k, c.geo, c.root, 3.0, 2.0, false, dist, mass);
        const double scale_px = 1.0 + root.max_distance();
        expect_rows(got.distance, dist, 1e-9 * scale_px, label + " distance");
        expect_rows(got.grid_mass, mass, 1e-9, label + " grid mass");
      }
    }
  }
}

TEST(GeometryDiagnostics, ReducedKeysSitAtTheCentreOfTheirBlock) {
  // 9x9 queries, 4x4 keys: key (0, 0) at query row and column (0 + 1/2) 9/4 - 1/2 = 0.625.
  const LayerGeometry geo = cases(1)[5].geo;
  const auto [r, c] = key_position(geo, 0, 0);
  EXPECT_DOUBLE_EQ(r, 0.625);
  EXPECT_DOUBLE_EQ(c, 0.625);
  EXPECT_DOUBLE_EQ(key_position(geo, 0, 15).first, 3.5 * 2.25 - 0.5);
  // Negative control: keys at their block's corner give other distances.
  const Variant v = parse_variant("softmax");
  const auto [q, k] = head(v, geo, 7);
  const PatchGeometry root(geo.grid, 1.0, 1.0);
  const DistanceRows got = attention_distance_units(v, q, k, geo.scale, geo, root, {});
  std::vector<double> dist, mass;
  distance_reference(v, q, k, geo, geo.grid, 1.0, 1.0, true, dist, mass);
  double worst = 0.0;
  for (std::size_t i = 0; i < dist.size(); ++i)
    worst = std::max(worst, std::fabs(dist[i] - got.distance[i]));
  EXPECT_GT(worst, 0.1);
  // A stage of half the root's grid has patches twice the root's.
  const auto [ph, pw] = layer_patch(PatchGeometry(TokenGrid{0, 18, 18}, 4.0, 2.0), geo);
  EXPECT_DOUBLE_EQ(ph, 8.0);
  EXPECT_DOUBLE_EQ(pw, 4.0);
}

TEST(GeometryDiagnostics, RankOfEachUnitEqualsJacobiOfThePlainLoops) {
  const RankOptions opt;
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int d : {1, 7}) {
      for (const Case& c : cases(d)) {
        const auto [q, k] = head(v, c.geo, d);
        const MatF values = test::random_matrix(c.geo.key_rows(), 3, 53).cast<float>();
        const std::string label = what(spec, c, d);
        const std::vector<HeadRank> got = head_rank_units(v, q, k, values, c.geo.scale, c.geo, opt);
        ASSERT_EQ(static_cast<int>(got.size()), c.geo.units()) << label;
        for (int u = 0; u < c.geo.units(); ++u) {
          std::vector<int> dead;
          const MatD w = unit_weights(v, q, k, c.geo, u, dead);
          const Spectrum want = spectrum_of(jacobi(w), w.rows(), w.cols(), opt);
          const std::string at = label + " unit " + std::to_string(u);
          EXPECT_EQ(got[static_cast<std::size_t>(u)].w.rank, want.rank) << at;
          EXPECT_NEAR(got[static_cast<std::size_t>(u)].w.erank, want.erank, 1e-9) << at;
          EXPECT_EQ(got[static_cast<std::size_t>(u)].degenerate, static_cast<int>(dead.size()))
              << at;
          const MatD kd =
              k.middleRows(static_cast<Eigen::Index>(u) * c.geo.unit_keys(), c.geo.unit_keys())
                  .cast<double>();
          const Spectrum kw = spectrum_of(jacobi(kd), kd.rows(), kd.cols(), opt);
          EXPECT_EQ(got[static_cast<std::size_t>(u)].k.rank, kw.rank) << at;
          EXPECT_NEAR(got[static_cast<std::size_t>(u)].k.ratio, kw.ratio, 1e-9) << at;
          // A masked window has no one key-value state; an unmasked kernel unit has one.
          EXPECT_EQ(got[static_cast<std::size_t>(u)].has_kv,
                    v.linear_time_outputs() && !c.geo.masked(u))
              << at;
        }
      }
    }
  }
}

TEST(GeometryDiagnostics, CensusOfEachUnitEqualsThePlainLoops) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int d : {1, 7}) {
      for (const Case& c : cases(d)) {
        const auto [q, k] = head(v, c.geo, d);
        const std::string label = what(spec, c, d);
        const CensusCell got = census_units(v, q, k, c.geo.scale, c.geo, 1e-9);
        // Negative weights counted between the clearly negative ones and those within rounding
        // of 0 (cosFormer's re-weighting is cos(pi/2) ~ 6e-17 where a query and a reduced key
        // are M positions apart: its sign is rounding's).
        long long rows = 0, weights = 0, negative = 0, near_negative = 0, zero = 0, off = 0,
                  dead = 0;
        long long zero_with_forbidden = 0;
        double least = std::numeric_limits<double>::infinity();
        for (int u = 0; u < c.geo.units(); ++u) {
          std::vector<int> degenerate;
          const MatD w = unit_weights(v, q, k, c.geo, u, degenerate);
          const Mask mask = c.geo.unit_mask(u);
          for (Eigen::Index i = 0; i < w.rows(); ++i) {
            if (listed(degenerate, static_cast<int>(i))) {
              ++dead;
              continue;
            }
            ++rows;
            double sum = 0.0;
            for (Eigen::Index j = 0; j < w.cols(); ++j) {
              zero_with_forbidden += w(i, j) == 0.0 ? 1 : 0;
              if (!mask(i, j)) continue;
              ++weights;
              negative += w(i, j) < -1e-12 ? 1 : 0;
              near_negative += w(i, j) < 1e-12 ? 1 : 0;
              zero += w(i, j) == 0.0 ? 1 : 0;
              least = std::min(least, w(i, j));
              sum += w(i, j);
            }
            off += std::abs(sum - 1.0) > 1e-9 ? 1 : 0;
          }
        }
        EXPECT_EQ(got.rows, rows) << label;
        EXPECT_EQ(got.weights, weights) << label;
        EXPECT_GE(got.negative, negative) << label;
        EXPECT_LE(got.negative, near_negative) << label;
        EXPECT_EQ(got.zero, zero) << label;
        EXPECT_EQ(got.degenerate_rows, dead) << label;
        EXPECT_EQ(got.rows_not_summing_to_one, off) << label;
        if (rows > 0) {
          EXPECT_NEAR(got.most_negative, least, 1e-12 * std::max(1.0, std::fabs(least))) << label;
        }
        // Negative control: a forbidden pair counted as a zero weight.
        if (c.geo.shift > 0 && v.name().rfind("softmax", 0) == 0) {
          EXPECT_GT(zero_with_forbidden, got.zero) << label;
        }
      }
    }
  }
}

/// Query i's and key j's cells of unit u, the query's mapped onto the key grid, by hand.
std::pair<std::pair<int, int>, std::pair<int, int>> cells_of(const LayerGeometry& geo, int u, int i,
                                                             int j) {
  if (geo.windows > 0) {
    const auto at = [&](int t) {
      const auto p = static_cast<std::size_t>((u * geo.window_tokens() + t) * 2);
      return std::make_pair(geo.positions[p], geo.positions[p + 1]);
    };
    return {at(i), at(j)};
  }
  std::pair<int, int> q{-1, -1}, k{-1, -1};
  if (i >= geo.grid.prefix) {
    const int r = (i - geo.grid.prefix) / geo.grid.width,
              c = (i - geo.grid.prefix) % geo.grid.width;
    q = {r * geo.key_grid.height / geo.grid.height, c * geo.key_grid.width / geo.grid.width};
  }
  if (j >= geo.key_grid.prefix) {
    k = {(j - geo.key_grid.prefix) / geo.key_grid.width,
         (j - geo.key_grid.prefix) % geo.key_grid.width};
  }
  return {q, k};
}

TEST(GeometryDiagnostics, RemovalMasksOfEachUnit) {
  for (const Case& c : cases(3)) {
    for (int u = 0; u < c.geo.units(); ++u) {
      const Mask base = c.geo.unit_mask(u);
      for (int k : {1, 3}) {
        const Mask local = unit_removal_mask(c.geo, u, true, k, 0);
        for (int i = 0; i < c.geo.unit_queries(); ++i) {
          for (int j = 0; j < c.geo.unit_keys(); ++j) {
            const auto [qc, kc] = cells_of(c.geo, u, i, j);
            const bool near = qc.first >= 0 && kc.first >= 0 &&
                              std::abs(qc.first - kc.first) <= k / 2 &&
                              std::abs(qc.second - kc.second) <= k / 2;
            EXPECT_EQ(local(i, j), base(i, j) && !near)
                << c.name << " local:" << k << " unit " << u << " " << i << "," << j;
          }
        }
      }
      const Mask a = unit_removal_mask(c.geo, u, false, 2, 7);
      const Mask again = unit_removal_mask(c.geo, u, false, 2, 7);
      EXPECT_TRUE((a == again).all()) << c.name;
      for (int i = 0; i < c.geo.unit_queries(); ++i) {
        int pool = 0, removed = 0;
        for (int j = 0; j < c.geo.unit_keys(); ++j) {
          const auto [qc, kc] = cells_of(c.geo, u, i, j);
          const bool near =
              std::abs(qc.first - kc.first) <= 1 && std::abs(qc.second - kc.second) <= 1;
          const bool candidate = qc.first >= 0 && kc.first >= 0 && base(i, j) && !near;
          pool += candidate ? 1 : 0;
          if (base(i, j) && !a(i, j)) {
            ++removed;
            EXPECT_TRUE(candidate) << c.name << " random: unit " << u << " " << i << "," << j;
          }
        }
        EXPECT_EQ(removed, std::min(pool, 2)) << c.name << " random: unit " << u << " query " << i;
      }
    }
  }
}

TEST(GeometryDiagnostics, MaskOfEachUnitEqualsThePlainLoops) {
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (const Case& c : cases(7)) {
      const auto [q, k] = head(v, c.geo, 7);
      const MatF values = test::random_matrix(c.geo.key_rows(), 3, 53).cast<float>();
      for (const MaskSpec& m : parse_mask_specs("local:3,random:2")) {
        const std::string label = what(spec, c, 7) + " " + m.name();
        const MaskCell got = mask_units(v, q, k, values, c.geo.scale, c.geo, m, 99);
        double diff2 = 0.0, base2 = 0.0;
        long long empty = 0, dead = 0;
        std::vector<double> removed;
        const int nq = c.geo.unit_queries(), nk = c.geo.unit_keys();
        for (int u = 0; u < c.geo.units(); ++u) {
          const MatD qd = q.middleRows(static_cast<Eigen::Index>(u) * nq, nq).cast<double>();
          const MatD kd = k.middleRows(static_cast<Eigen::Index>(u) * nk, nk).cast<double>();
          const MatD vd = values.middleRows(static_cast<Eigen::Index>(u) * nk, nk).cast<double>();
          const Mask base = c.geo.unit_mask(u);
          const Mask mask = unit_removal_mask(c.geo, u, m.kind == MaskSpec::Kind::Local, m.size,
                                              mix_seed(99, static_cast<std::uint64_t>(u)));
          std::vector<int> plain, after;
          const MatD w = reference::weights(v, qd, kd, c.geo.scale, &base, &plain);
          const MatD o = reference::outputs(v, qd, kd, vd, c.geo.scale, &base, &plain);
          const MatD om = reference::outputs(v, qd, kd, vd, c.geo.scale, &mask, &after);
          for (int i = 0; i < nq; ++i) {
            if (listed(plain, i)) {
              ++dead;
              continue;
            }
            if (listed(after, i)) {
              ++empty;
              continue;
            }
            for (Eigen::Index t = 0; t < vd.cols(); ++t) {
              diff2 += (om(i, t) - o(i, t)) * (om(i, t) - o(i, t));
              base2 += o(i, t) * o(i, t);
            }
            double r = 0.0;
            bool any = false;
            for (int j = 0; j < nk; ++j) {
              if (base(i, j) && !mask(i, j)) {
                any = true;
                r += w(i, j);
              }
            }
            if (any) removed.push_back(r);
          }
        }
        EXPECT_EQ(got.degenerate_rows, dead) << label;
        EXPECT_EQ(got.empty_rows, empty) << label;
        ASSERT_EQ(got.removed_mass.count, static_cast<std::int64_t>(removed.size())) << label;
        double mean = 0.0;
        for (double r : removed) mean += r / static_cast<double>(removed.size());
        if (!removed.empty()) {
          EXPECT_NEAR(got.removed_mass.mean, mean, 1e-9) << label;
        }
        if (base2 > 0.0) {
          ASSERT_EQ(got.change.count, 1) << label;
          EXPECT_NEAR(got.change.mean, std::sqrt(diff2 / base2), 1e-9) << label;
        }
      }
    }
  }
}

TEST(GeometryDiagnostics, ASquareLayerByUnitsIsTheSquareAnalysis) {
  const TokenGrid g{1, 5, 7};
  for (const std::string& spec : test::all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    const LayerGeometry geo = base(g, g, 7);
    const auto [q, k] = head(v, geo, 7);
    const MatF values = test::random_matrix(g.tokens(), 3, 53).cast<float>();
    const std::string label = spec + " square 5x7+1";
    const EntropyRows a = attention_entropy_units(v, q, k, geo.scale, geo, {});
    const EntropyRows b = attention_entropy(v, q, k, geo.scale, {});
    expect_rows(a.entropy, b.entropy, 0.0, label);
    expect_rows(a.normalised, b.normalised, 0.0, label);
    const PatchGeometry root(g, 3.0, 2.0);
    const DistanceRows da = attention_distance_units(v, q, k, geo.scale, geo, root, {});
    const DistanceRows db = attention_distance_reference(v, q, k, geo.scale, root, {});
    expect_rows(da.distance, db.distance, 1e-9 * root.max_distance(), label);
    EXPECT_NEAR(uniform_distance_units(geo, root, false), uniform_distance(root, false), 1e-12)
        << label;
    EXPECT_NEAR(uniform_distance_units(geo, root, true), uniform_distance(root, true), 1e-12)
        << label;
    const std::vector<HeadRank> ra = head_rank_units(v, q, k, values, geo.scale, geo, {});
    const HeadRank rb = head_rank(v, q, k, values, nullptr, geo.scale, {});
    ASSERT_EQ(ra.size(), 1U) << label;
    EXPECT_EQ(ra[0].w.rank, rb.w.rank) << label;
    EXPECT_EQ(ra[0].w.erank, rb.w.erank) << label;
    EXPECT_EQ(ra[0].has_kv, rb.has_kv) << label;
    Diagnostics diag;
    const MatD w =
        attention_weights<double>(v, q.cast<double>(), k.cast<double>(), geo.scale, nullptr, &diag);
    const CensusCell ca = census_units(v, q, k, geo.scale, geo, 1e-9);
    const CensusCell cb = census_of(w, diag.degenerate_rows, 1e-9);
    EXPECT_EQ(ca.negative, cb.negative) << label;
    EXPECT_EQ(ca.weights, cb.weights) << label;
    EXPECT_EQ(ca.most_negative, cb.most_negative) << label;
    for (const MaskSpec& m : parse_mask_specs("local:3,random:4")) {
      const MaskCell ma = mask_units(v, q, k, values, geo.scale, geo, m, 5);
      const Mask mask = build_mask(m, g, mix_seed(5, std::uint64_t{0}));
      const MaskCell mb =
          mask_head(v, q.cast<double>(), k.cast<double>(), values.cast<double>(), geo.scale, mask);
      EXPECT_NEAR(ma.change.mean, mb.change.mean, 1e-12) << label << " " << m.name();
      EXPECT_NEAR(ma.removed_mass.mean, mb.removed_mass.mean, 1e-12) << label << " " << m.name();
      EXPECT_EQ(ma.removed_mass.count, mb.removed_mass.count) << label << " " << m.name();
    }
  }
}

TEST(GeometryDiagnostics, AHeadOfAnotherShapeIsRefused) {
  const LayerGeometry geo = cases(7).front().geo;
  const MatF q = MatF::Zero(geo.query_rows() - 1, 7), k = MatF::Zero(geo.key_rows(), 7);
  const Variant v = parse_variant("softmax");
  EXPECT_THROW((void)attention_entropy_units(v, q, k, 1.0, geo, {}), UsageError);
  EXPECT_THROW((void)attention_distance_units(v, q, k, 1.0, geo, PatchGeometry(geo.grid, 1, 1), {}),
               UsageError);
  EXPECT_THROW((void)head_rank_units(v, q, k, k, 1.0, geo, {}), UsageError);
  EXPECT_THROW((void)mask_units(v, q, k, k, 1.0, geo, MaskSpec{}, 0), UsageError);
}

}  // namespace
}  // namespace attnscope::analyses
