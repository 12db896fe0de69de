// The local term folded into the map (local_fold.hpp): the depthwise matrix is the convolution
// (checked against a plain loop over output cells, a flipped kernel as negative control); the
// folded map times V is W V plus the convolution of V when the head's channels share one kernel
// (and is not when they do not); the fast folded mass equals the explicit reference on awkward
// grids, windows and magnitudes, and adds exactly the kernel's taps inside the window.
#include "attnscope/analyses/geometry_heads.hpp"
#include "attnscope/analyses/local_fold.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"
#include "tolerances.hpp"
#include "variant_specs.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace attnscope::analyses {
namespace {

LayerGeometry square(const TokenGrid& g, int d) {
  LayerGeometry geo;
  geo.num_heads = 1;
  geo.head_dim = d;
  geo.scale = 1.0 / std::sqrt(static_cast<double>(d));
  geo.grid = geo.key_grid = g;
  return geo;
}

/// Two 3x3 windows side by side on a 3x6 grid, the second's tokens in a shifted order.
LayerGeometry two_windows(int d) {
  LayerGeometry geo = square(TokenGrid{0, 3, 6}, d);
  geo.windows = 2;
  geo.window_height = geo.window_width = 3;
  for (int w = 0; w < 2; ++w) {
    for (int t = 0; t < 9; ++t) {
      const int r = w == 0 ? t / 3 : (t / 3 + 1) % 3, c = w == 0 ? t % 3 : (t % 3 + 2) % 3;
      geo.positions.push_back(r);
      geo.positions.push_back(3 * w + c);
    }
  }
  return geo;
}

/// The cross-correlation of one channel x (height x width) with `kernel`, zero padding, by
/// output cell: out(r, c) = sum over taps of kernel(a, b) x(r + a - ph, c + b - pw).
MatD plain_conv(const MatD& x, const MatD& kernel, int ph, int pw) {
  MatD out = MatD::Zero(x.rows(), x.cols());
  for (Eigen::Index r = 0; r < x.rows(); ++r) {
    for (Eigen::Index c = 0; c < x.cols(); ++c) {
      for (Eigen::Index a = 0; a < kernel.rows(); ++a) {
        for (Eigen::Index b = 0; b < kernel.cols(); ++b) {
          const Eigen::Index sr = r + a - ph, sc = c + b - pw;
          if (sr >= 0 && sr < x.rows() && sc >= 0 && sc < x.cols())
            out(r, c) += kernel(a, b) * x(sr, sc);
        }
      }
    }
  }
  return out;
}

/// A LocalKernel of one head whose `d` channels (per unit) are `kernel` plus `spread` * channel.
LocalKernel head_kernel(const MatD& kernel, int d, int units, double spread = 0.0) {
  LocalKernel k;
  k.height = static_cast<int>(kernel.rows());
  k.width = static_cast<int>(kernel.cols());
  k.pad_height = (k.height - 1) / 2;
  k.pad_width = (k.width - 1) / 2;
  k.taps.assign(1, std::vector<MatD>(static_cast<std::size_t>(units)));
  for (auto& t : k.taps[0]) {
    t.resize(d, k.height * k.width);
    for (int c = 0; c < d; ++c) {
      for (int a = 0; a < k.height; ++a) {
        for (int b = 0; b < k.width; ++b)
          t(c, a * k.width + b) = kernel(a, b) + spread * c * (a + 1);
      }
    }
  }
  return k;
}

TEST(LocalFold, DepthwiseMatrixIsTheConvolution) {
  const int sizes[][2] = {{1, 1}, {1, 7}, {5, 9}, {14, 14}};
  const int kernels[][2] = {{1, 1}, {3, 3}, {5, 5}, {3, 5}};
  for (const auto& s : sizes) {
    for (const auto& ks : kernels) {
      const std::string what = std::to_string(s[0]) + "x" + std::to_string(s[1]) + " grid, " +
                               std::to_string(ks[0]) + "x" + std::to_string(ks[1]) + " kernel";
      const MatD kernel = test::random_matrix(ks[0], ks[1], 7);
      const MatD x = test::random_matrix(s[0], s[1], 8);
      const int ph = (ks[0] - 1) / 2, pw = (ks[1] - 1) / 2;
      const MatD m = depthwise_matrix(kernel, ph, pw, s[0], s[1]);
      VecD xv(s[0] * s[1]);
      for (int r = 0; r < s[0]; ++r) {
        for (int c = 0; c < s[1]; ++c) xv(r * s[1] + c) = x(r, c);
      }
      const VecD got = m * xv;
      const MatD want = plain_conv(x, kernel, ph, pw);
      double worst = 0.0, flipped_worst = 0.0;
      const MatD flipped = plain_conv(x, kernel.reverse(), ph, pw);
      for (int r = 0; r < s[0]; ++r) {
        for (int c = 0; c < s[1]; ++c) {
          worst = std::max(worst, std::abs(got(r * s[1] + c) - want(r, c)));
          flipped_worst = std::max(flipped_worst, std::abs(got(r * s[1] + c) - flipped(r, c)));
        }
      }
      EXPECT_LT(worst, test::kDoubleTol) << what;
      // negative control: a true convolution (the kernel turned round) is another matrix
      if (ks[0] * ks[1] > 1 && s[0] * s[1] > 1) {
        EXPECT_GT(flipped_worst, 1e-3) << what;
      }
    }
  }
}

TEST(LocalFold, FoldedMapTimesVIsOutPlusLocalForAKernelSharedByTheChannels) {
  const TokenGrid grids[] = {{0, 1, 1}, {1, 5, 7}, {2, 4, 4}, {0, 9, 9}};
  for (const std::string spec : {"softmax", "inline", "linear:relu", "mala"}) {
    for (const TokenGrid& g : grids) {
      const int d = 6;
      const Variant v = parse_variant(spec, Convention::Paper, 4);
      const double mean = test::input_mean(v);
      const MatF q = test::random_matrix(g.tokens(), d, 51, mean).cast<float>();
      const MatF k = test::random_matrix(g.tokens(), d, 52, mean).cast<float>();
      const MatD vv = test::random_matrix(g.tokens(), d, 53);
      const LayerGeometry geo = square(g, d);
      const std::string what = spec + " grid=" + std::to_string(g.prefix) + "+" +
                               std::to_string(g.height) + "x" + std::to_string(g.width);
      const MatD w = unit_rows(v, q, k, geo.scale, geo, 0).w;
      for (double spread : {0.0, 0.5}) {
        const LocalKernel kern = head_kernel(test::random_matrix(3, 3, 54), d, 1, spread);
        MatD local = MatD::Zero(g.tokens(), d);  // each channel's own kernel, prefix tokens none
        for (int c = 0; c < d; ++c) {
          MatD kc(3, 3), x(g.height, g.width);
          for (int t = 0; t < 9; ++t) kc(t / 3, t % 3) = kern.taps[0][0](c, t);
          for (int i = 0; i < g.height * g.width; ++i)
            x(i / g.width, i % g.width) = vv(g.prefix + i, c);
          const MatD y = plain_conv(x, kc, 1, 1);
          for (int i = 0; i < g.height * g.width; ++i)
            local(g.prefix + i, c) = y(i / g.width, i % g.width);
        }
        const MatD folded = folded_unit_map(w, kern.head_mean(0, 0), 1, 1, geo);
        const double worst = ((folded * vv) - (w * vv + local)).cwiseAbs().maxCoeff();
        if (spread == 0.0) {
          EXPECT_LT(worst, 1e-12) << what;
        } else if (g.height * g.width > 1) {  // negative control: channels with their own kernels
          EXPECT_GT(worst, 1e-2) << what << " (channels differ)";
        }
      }
    }
  }
}

TEST(LocalFold, FastFoldedMassEqualsTheReference) {
  const TokenGrid grids[] = {{0, 1, 1}, {1, 7, 7}, {0, 9, 9}, {2, 5, 9}, {1, 14, 14}};
  for (const std::string& spec : test::all_variant_specs()) {
    for (const TokenGrid& g : grids) {
      for (const auto& [magnitude, size] :
           {std::pair{1.0, "1"}, {1e-30, "1e-30"}, {1e30, "1e30"}}) {
        const int d = 5;
        const Variant v = parse_variant(spec, Convention::Paper, 4);
        const double mean = test::input_mean(v);
        const MatF q = test::random_matrix(g.tokens(), d, 61, mean).cast<float>();
        const MatF k = test::random_matrix(g.tokens(), d, 62, mean).cast<float>();
        const LayerGeometry geo = square(g, d);
        const LocalKernel kern =
            head_kernel(test::random_matrix(5, 3, 63) * magnitude, d, 1, 0.25 * magnitude);
        for (int window : {1, 3, 5}) {
          const std::string what = spec + " grid=" + std::to_string(g.prefix) + "+" +
                                   std::to_string(g.height) + "x" + std::to_string(g.width) +
                                   " window=" + std::to_string(window) +
                                   " kernel magnitude=" + size;
          int dead_fast = -1, dead_ref = -2;
          const auto w_fast = local_mass(v, q, k, geo.scale, g, window, &dead_fast);
          const auto w_ref = local_mass_units(v, q, k, geo.scale, geo, window);
          const auto fast = folded_local_mass(w_fast, kern, 0, geo, window);
          const auto ref =
              folded_local_mass_reference(v, q, k, geo.scale, geo, kern, 0, window, &dead_ref);
          ASSERT_EQ(fast.size(), ref.size()) << what;
          EXPECT_EQ(dead_fast, dead_ref) << what;
          // W's part as locality's own test takes it (float rows for softmax), the kernel's exactly
          const double tol = v.linear_time_outputs() ? test::kDoubleTol : test::kFloatTol;
          for (std::size_t i = 0; i < fast.size(); ++i) {
            ASSERT_EQ(std::isnan(fast[i]), std::isnan(ref[i])) << what << " token " << i;
            if (std::isnan(fast[i])) continue;
            const double taps_fast = fast[i] - w_fast[i], taps_ref = ref[i] - w_ref[i];
            EXPECT_NEAR(taps_fast, taps_ref, test::kDoubleTol * std::max(1.0, std::abs(taps_ref)))
                << what << " token " << i;
            EXPECT_NEAR(fast[i], ref[i], tol * std::max(1.0, std::abs(ref[i])))
                << what << " token " << i;
          }
        }
      }
    }
  }
}

TEST(LocalFold, FoldedMassAddsTheKernelsTapsInsideTheWindow) {
  const TokenGrid g{1, 5, 5};
  const LayerGeometry geo = square(g, 2);
  const Variant v = parse_variant("softmax", Convention::Paper, 0);
  const MatF q = test::random_matrix(g.tokens(), 2, 71).cast<float>();
  const MatF k = test::random_matrix(g.tokens(), 2, 72).cast<float>();
  MatD ones = MatD::Constant(3, 3, 1.0);
  const LocalKernel kern = head_kernel(ones, 2, 1);
  const auto w = local_mass(v, q, k, geo.scale, g, 3);
  const auto folded = folded_local_mass(w, kern, 0, geo, 3);
  const int centre = g.prefix + 2 * 5 + 2, corner = g.prefix;  // 9 taps on the grid, 4 at a corner
  EXPECT_NEAR(folded[centre] - w[centre], 9.0, 1e-12);
  EXPECT_NEAR(folded[corner] - w[corner], 4.0, 1e-12);
  // window 1: only the centre tap lies in the query's own cell
  const auto one = folded_local_mass(local_mass(v, q, k, geo.scale, g, 1), kern, 0, geo, 1);
  const auto w1 = local_mass(v, q, k, geo.scale, g, 1);
  EXPECT_NEAR(one[centre] - w1[centre], 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(folded[0])) << "the prefix token is no query";
}

TEST(LocalFold, WindowsFoldEachWindowsOwnKernelOverItsTokens) {
  const int d = 4;
  const LayerGeometry geo = two_windows(d);
  const MatF q = test::random_matrix(18, d, 81).cast<float>();
  const MatF k = test::random_matrix(18, d, 82).cast<float>();
  const MatD vv = test::random_matrix(18, d, 83);
  LocalKernel kern = head_kernel(test::random_matrix(3, 3, 84), d, 2);
  kern.taps[0][1] = head_kernel(test::random_matrix(3, 3, 85), d, 1).taps[0][0];
  for (const std::string spec : {"softmax", "inline"}) {
    const Variant v = parse_variant(spec, Convention::Paper, 4);
    for (int u = 0; u < 2; ++u) {
      const MatD w = unit_rows(v, q, k, geo.scale, geo, u).w;
      const MatD folded = folded_unit_map(w, kern.head_mean(0, u), 1, 1, geo);
      const MatD vu = vv.middleRows(9 * u, 9);
      MatD local(9, d);
      for (int c = 0; c < d; ++c) {
        MatD x(3, 3);
        for (int t = 0; t < 9; ++t) x(t / 3, t % 3) = vu(t, c);
        const MatD y = plain_conv(x, kern.head_mean(0, u), 1, 1);
        for (int t = 0; t < 9; ++t) local(t, c) = y(t / 3, t % 3);
      }
      EXPECT_LT((folded * vu - (w * vu + local)).cwiseAbs().maxCoeff(), 1e-12)
          << spec << " window " << u;
    }
    for (int window : {1, 3}) {
      const auto fast = folded_local_mass(local_mass_units(v, q, k, geo.scale, geo, window), kern,
                                          0, geo, window);
      const auto ref = folded_local_mass_reference(v, q, k, geo.scale, geo, kern, 0, window);
      for (std::size_t i = 0; i < fast.size(); ++i)
        EXPECT_NEAR(fast[i], ref[i], 1e-12) << spec << " window " << window << " row " << i;
    }
  }
}

TEST(LocalFold, ReducedKeysAreRefused) {
  LayerGeometry geo = square(TokenGrid{0, 4, 4}, 2);
  geo.key_grid = TokenGrid{0, 2, 2};
  const MatD w = MatD::Zero(16, 4);
  EXPECT_THROW((void)folded_unit_map(w, MatD::Ones(3, 3), 1, 1, geo), UsageError);
}

}  // namespace
}  // namespace attnscope::analyses
