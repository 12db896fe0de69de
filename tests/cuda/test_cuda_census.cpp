// The weight census on the GPU against the CPU's: the same counts (negative, zero, rows off 1,
// degenerate) and the same extremes to rounding, through CensusCollector on every family.
#include "attnscope/analyses/census.hpp"
#include "attnscope/attention.hpp"
#include "cuda_test.hpp"
#include "gpu_cases.hpp"

#include <cmath>

namespace attnscope::test {
namespace {

using CudaCensus = CudaTest;

TEST_F(CudaCensus, CellsMatchTheCpu) {
  const int n = 50, d = 7;
  MatF q = normal_f(n, d, 21), k = normal_f(n, d, 22);
  for (int i = 0; i < 5; ++i) q.row(i) = -q.row(i).cwiseAbs();  // ReLU-killed queries: degenerate rows
  const MatF q2 = normal_f(n, d, 23, 1.0), k2 = normal_f(n, d, 24, 1.0);
  // The families whose weights these heads do not put out of double's range.
  std::vector<Variant> variants;
  for (const std::string& spec : all_variant_specs()) {
    const Variant v = parse_variant(spec, Convention::Paper, 11);
    try {
      (void)attention_weights<double>(v, q.cast<double>(), k.cast<double>(), 0.3);
      (void)attention_weights<double>(v, q2.cast<double>(), k2.cast<double>(), 0.3);
      variants.push_back(v);
    } catch (const NumericalError&) {
    }
  }
  ASSERT_GT(variants.size(), 20U);
  analyses::Selection sel;
  sel.layers = {0};
  sel.heads = {0, 1};
  analyses::CensusCollector cpu(variants, sel, 0.3, 1e-6), gpu(variants, sel, 0.3, 1e-6);
  gpu.set_device(Device::Cuda);
  const MatF empty;
  for (int h = 0; h < 2; ++h) {
    const analyses::HeadView view{0, 0, h, h == 0 ? q : q2, h == 0 ? k : k2, empty};
    cpu.add_head(view);
    gpu.add_head(view);
  }
  const auto a = cpu.cells(), b = gpu.cells();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t c = 0; c < a.size(); ++c) {
    const std::string what = a[c].variant + " head " + std::to_string(a[c].head);
    EXPECT_EQ(b[c].rows, a[c].rows) << what;
    EXPECT_EQ(b[c].negative, a[c].negative) << what;
    EXPECT_EQ(b[c].zero, a[c].zero) << what;
    EXPECT_EQ(b[c].degenerate_rows, a[c].degenerate_rows) << what;
    EXPECT_EQ(b[c].rows_not_summing_to_one, a[c].rows_not_summing_to_one) << what;
    if (std::isfinite(a[c].most_negative)) {
      EXPECT_NEAR(b[c].most_negative, a[c].most_negative, 1e-10 * (1.0 + std::abs(a[c].most_negative))) << what;
    }
  }
}

}  // namespace
}  // namespace attnscope::test
