// Synthetic dumps: deterministic per (seed, image) in any order, planted structure present exactly
// where planted_pairs says, softmax rows local rather than uniform, and the written dump equal to
// synth_image.
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"

#include <gtest/gtest.h>
#include <unistd.h>
#include <Eigen/QR>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>

namespace attnscope {
namespace {

/// K x = 1 holds up to float32 rounding of keys of norm ~ a few units.
constexpr double kHyperplaneTol = 1e-5;
/// q_j - q_i = t x up to the float32 rounding of both queries.
constexpr double kShiftTol = 1e-5;

SynthOptions planted_options() {
  SynthOptions o;
  o.layers = 2;
  o.heads = 3;
  o.grid = TokenGrid{1, 5, 6};  // N = 31
  o.head_dim = 7;
  o.images = 4;
  o.seed = 42;
  o.plant_duplicates = 2;
  o.plant_collinear = 3;
  o.plant_shifted = 2;
  o.plant_hyperplane = true;
  return o;
}

std::string config(const SynthOptions& o, int image, int layer, int head) {
  return "seed " + std::to_string(o.seed) + " N " + std::to_string(o.tokens()) + " d " +
         std::to_string(o.head_dim) + " image " + std::to_string(image) + " layer " +
         std::to_string(layer) + " head " + std::to_string(head);
}

bool same_image(const ImageQKV& a, const ImageQKV& b) {
  if (a.q.size() != b.q.size()) return false;
  for (std::size_t s = 0; s < a.q.size(); ++s) {
    if (!(a.q[s] == b.q[s] && a.k[s] == b.k[s] && a.v[s] == b.v[s])) return false;
  }
  return true;
}

TEST(Synth, ImagesAreAPureFunctionOfSeedAndIndex) {
  const SynthOptions o = planted_options();
  const ImageQKV late_first = synth_image(o, 3);
  const ImageQKV a0 = synth_image(o, 0);
  EXPECT_TRUE(same_image(synth_image(o, 3), late_first));
  EXPECT_TRUE(same_image(synth_image(o, 0), a0));
  EXPECT_FALSE(same_image(a0, late_first));
  SynthOptions other = o;
  other.seed = 43;
  EXPECT_FALSE(same_image(synth_image(other, 0), a0));
  // Shape and layer list.
  EXPECT_EQ(a0.layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(a0.heads, 3);
  ASSERT_EQ(a0.q.size(), 6U);
  EXPECT_EQ(a0.q[5].rows(), 31);
  EXPECT_EQ(a0.q[5].cols(), 7);
}

TEST(Synth, PlantedPairsAreDisjointAndCounted) {
  const SynthOptions o = planted_options();
  const auto pairs = planted_pairs(o, 1, 1, 2);
  ASSERT_EQ(pairs.size(), 7U);
  std::set<int> used;
  for (std::size_t p = 0; p < pairs.size(); ++p) {
    EXPECT_NE(pairs[p].i, pairs[p].j);
    EXPECT_TRUE(used.insert(pairs[p].i).second && used.insert(pairs[p].j).second) << "pair " << p;
    EXPECT_GE(std::min(pairs[p].i, pairs[p].j), 0);
    EXPECT_LT(std::max(pairs[p].i, pairs[p].j), o.tokens());
    const PlantKind want = p < 2   ? PlantKind::Duplicate
                           : p < 5 ? PlantKind::Collinear
                                   : PlantKind::Shifted;
    EXPECT_EQ(pairs[p].kind, want) << "pair " << p;
  }
  EXPECT_NE(planted_pairs(o, 0, 1, 2)[0].i * 100 + planted_pairs(o, 0, 1, 2)[0].j,
            pairs[0].i * 100 + pairs[0].j)
      << "different images should plant different tokens (seed 42)";
}

TEST(Synth, PlantedQueriesHoldExactlyInFloat32) {
  const SynthOptions o = planted_options();
  for (int image = 0; image < o.images; ++image) {
    const ImageQKV img = synth_image(o, image);
    for (int l = 0; l < o.layers; ++l) {
      for (int h = 0; h < o.heads; ++h) {
        const MatF& q = img.Q(l, h);
        const VecD x = hyperplane_normal(o, l, h);
        for (const PlantedPair& p : planted_pairs(o, image, l, h)) {
          const std::string c = config(o, image, l, h) + " pair (" + std::to_string(p.i) + ", " +
                                std::to_string(p.j) + ") " + to_string(p.kind);
          switch (p.kind) {
            case PlantKind::Duplicate:
              EXPECT_TRUE(q.row(p.j) == q.row(p.i)) << c;
              break;
            case PlantKind::Collinear:
              EXPECT_TRUE(p.factor == 2.0 || p.factor == 0.5) << c;
              EXPECT_TRUE(q.row(p.j) == (static_cast<float>(p.factor) * q.row(p.i)).eval()) << c;
              break;
            case PlantKind::Shifted:
              for (int dim = 0; dim < o.head_dim; ++dim) {
                EXPECT_NEAR(q(p.j, dim) - q(p.i, dim), p.factor * x(dim), kShiftTol) << c;
              }
              break;
          }
          EXPECT_FALSE(q.row(p.i).isZero()) << c;
        }
      }
    }
  }
}

TEST(Synth, KeysLieOnTheHyperplaneOnlyWhenPlanted) {
  SynthOptions o = planted_options();
  const ImageQKV img = synth_image(o, 2);
  for (int l = 0; l < o.layers; ++l) {
    for (int h = 0; h < o.heads; ++h) {
      const VecD x = hyperplane_normal(o, l, h);
      ASSERT_EQ(x.size(), o.head_dim);
      const VecD kx = img.K(l, h).cast<double>() * x;
      EXPECT_LE((kx.array() - 1.0).abs().maxCoeff(), kHyperplaneTol) << config(o, 2, l, h);
    }
  }
  // Without the plant, K x = 1 has no solution: the least-squares residual stays large.
  o.plant_hyperplane = false;
  o.plant_shifted = 0;
  EXPECT_EQ(hyperplane_normal(o, 0, 0).size(), 0);
  const MatD K = synth_image(o, 2).K(0, 0).cast<double>();
  const VecD ones = VecD::Ones(K.rows());
  const VecD sol = K.colPivHouseholderQr().solve(ones);
  EXPECT_GT((K * sol - ones).norm(), 1.0) << config(o, 2, 0, 0) << " without hyperplane";
}

/// Mean over grid queries of the softmax mass in the query's 3x3 window, for one layer.
double mean_local_mass(const SynthOptions& o, const ImageQKV& img, int layer) {
  double local = 0;
  int rows = 0;
  for (int h = 0; h < o.heads; ++h) {
    const MatD q = img.Q(layer, h).cast<double>(), k = img.K(layer, h).cast<double>();
    for (int t = o.grid.prefix; t < o.tokens(); ++t) {
      const VecD logits = o.scale() * (k * q.row(t).transpose());
      const VecD w = (logits.array() - logits.maxCoeff()).exp();
      double in_window = 0;
      for (int u : o.grid.window(t, 3)) in_window += w(u);
      local += in_window / w.sum();
      ++rows;
    }
  }
  return local / rows;
}

TEST(Synth, SoftmaxRowsAreLocalAndLocalityFallsWithDepth) {
  SynthOptions o;  // the demo shape: 7x7 grid + CLS, d = 16, 4 layers
  o.seed = 3;
  const ImageQKV img = synth_image(o, 0);
  // What uniform rows would put in the (border-clipped) windows.
  double uniform = 0;
  for (int t = o.grid.prefix; t < o.tokens(); ++t) uniform += o.grid.window_size(t, 3);
  uniform /= static_cast<double>(o.grid.height * o.grid.width) * o.tokens();
  std::vector<double> mass;
  for (int l = 0; l < o.layers; ++l) {
    mass.push_back(mean_local_mass(o, img, l));
    EXPECT_GT(mass.back(), 1.2 * uniform) << "layer " << l << " vs uniform " << uniform;
    EXPECT_LT(mass.back(), 0.9) << "layer " << l << ": rows should not be one-hot either";
  }
  EXPECT_GT(mass.front(), 1.5 * mass.back())
      << "first layer " << mass.front() << " last " << mass.back();
}

TEST(Synth, ValidationNamesTheBadOption) {
  SynthOptions o = planted_options();
  o.grid = TokenGrid{0, 2, 3};  // 6 tokens, 7 pairs need 14
  EXPECT_THROW(o.validate(), UsageError);
  o = planted_options();
  o.plant_hyperplane = false;
  EXPECT_THROW(o.validate(), UsageError);
  o = planted_options();
  o.head_dim = 0;
  EXPECT_THROW(o.validate(), UsageError);
  o = planted_options();
  o.family = "cosine";
  EXPECT_THROW(o.validate(), UsageError);
  o = planted_options();
  o.compression = 10;
  EXPECT_THROW(o.validate(), UsageError);
  EXPECT_NO_THROW(planted_options().validate());
}

class SynthDumpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("attnscope-test-synth-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TEST_F(SynthDumpTest, WrittenDumpEqualsSynthImage) {
  const SynthOptions o = planted_options();
  const std::string p = (dir_ / "s.h5").string();
  int seen = 0;
  write_synth_dump(p, o, [&](int i) { EXPECT_EQ(i, seen++); });
  EXPECT_EQ(seen, o.images);
  DumpReader r(p);
  EXPECT_EQ(r.schema().num_images, o.images);
  EXPECT_EQ(r.schema().attrs.num_tokens, 31);
  EXPECT_EQ(r.schema().attrs.scale, 1.0 / std::sqrt(7.0));
  for (int i = 0; i < o.images; ++i) {
    EXPECT_TRUE(same_image(r.read_image(i), synth_image(o, i))) << "image " << i;
  }
}

TEST_F(SynthDumpTest, Float16DumpKeepsDuplicatesAndCollinearPairsExact) {
  SynthOptions o = planted_options();
  o.dtype = DType::F16;
  o.feature_map = "relu";
  o.family = "linear";
  const std::string file = (dir_ / "s16.h5").string();
  write_synth_dump(file, o);
  DumpReader r(file);
  EXPECT_EQ(r.schema().dtype, DType::F16);
  EXPECT_EQ(r.schema().attrs.attention_family, "linear");
  EXPECT_EQ(r.schema().attrs.feature_map, "relu");
  for (int i = 0; i < o.images; ++i) {
    const ImageQKV img = r.read_image(i);
    for (int l = 0; l < o.layers; ++l) {
      for (int h = 0; h < o.heads; ++h) {
        const MatF& q = img.Q(l, h);
        for (const PlantedPair& p : planted_pairs(o, i, l, h)) {
          if (p.kind == PlantKind::Shifted) continue;
          EXPECT_TRUE(q.row(p.j) == (static_cast<float>(p.factor) * q.row(p.i)).eval())
              << config(o, i, l, h) << " " << to_string(p.kind);
        }
      }
    }
  }
}

TEST_F(SynthDumpTest, InvalidOptionsWriteNothing) {
  SynthOptions o = planted_options();
  o.plant_duplicates = 100;
  EXPECT_THROW(write_synth_dump((dir_ / "x.h5").string(), o), UsageError);
  EXPECT_TRUE(std::filesystem::is_empty(dir_));
}

}  // namespace
}  // namespace attnscope
