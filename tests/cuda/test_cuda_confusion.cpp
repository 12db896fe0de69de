// Confusion counts on the GPU against the CPU's exact counts, equal on every case: planted pairs
// at the threshold, awkward sizes, degenerate rows, identical keys, huge magnitudes, every
// family; through count_confusion's dispatch, from several threads at once, and with more
// candidates than the first pair buffer holds.
#include "attnscope/analyses/confusion.hpp"
#include "cuda_test.hpp"
#include "gpu_cases.hpp"

#include <omp.h>

namespace attnscope::test {
namespace {

using CudaConfusion = CudaTest;

void expect_equal(const analyses::HeadConfusion& gpu, const analyses::HeadConfusion& cpu, const std::string& what) {
  EXPECT_EQ(gpu.pairs, cpu.pairs) << what << " (" << gpu.candidates << " candidates)";
  EXPECT_EQ(gpu.degenerate_rows, cpu.degenerate_rows) << what;
  EXPECT_EQ(gpu.degenerate_pairs, cpu.degenerate_pairs) << what;
}

TEST_F(CudaConfusion, EqualsTheExactCountOnEveryCase) {
  int compared = 0;
  for (const HeadCase& c : gpu_cases()) {
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    analyses::HeadConfusion ref;
    try {
      ref = analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt);
    } catch (const NumericalError&) {
      EXPECT_THROW((void)analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt), NumericalError)
          << c.label;
      continue;
    }
    expect_equal(analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt), ref, c.label);
    opt.device = Device::Cuda;  // the analyses' own dispatch
    expect_equal(analyses::count_confusion(c.variant, c.q, c.q, c.k, c.scale, opt), ref, c.label + " (dispatch)");
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

TEST_F(CudaConfusion, BatchOfMixedShapesEqualsHeadByHead) {
  // Every case of one variant family in one call: shapes grouped, each group one launch.
  const std::vector<HeadCase> all = gpu_cases();
  for (const char* spec : {"softmax", "linear:relu"}) {
    const Variant v = parse_variant(spec);
    // Planted heads of d = 7 (N = 50 and N = 3): one scale, two shapes.
    std::vector<analyses::HeadInput> heads;
    std::vector<const HeadCase*> used;
    for (const HeadCase& c : all) {
      if (c.variant.name() == v.name() && c.label.rfind("planted", 0) == 0 && c.q.cols() == 7) {
        heads.push_back({&c.q, &c.q, &c.k});
        used.push_back(&c);
      }
    }
    ASSERT_GE(heads.size(), 2U) << spec;
    analyses::ConfusionOptions opt;
    const double scale = used.front()->scale;
    const auto got = analyses::count_confusion_cuda_batch(v, heads, scale, opt);
    ASSERT_EQ(got.size(), heads.size());
    for (std::size_t h = 0; h < heads.size(); ++h) {
      expect_equal(got[h], analyses::count_confusion_reference(v, used[h]->q, used[h]->q, used[h]->k, scale, opt),
                   used[h]->label + " (in a batch of " + std::to_string(heads.size()) + ")");
    }
  }
}

TEST_F(CudaConfusion, ExcludedTokensGiveTheExactCountOfTheSameFilter) {
  // Every case with every third token excluded, head by head and in one batch per variant.
  const std::vector<HeadCase> all = gpu_cases();
  std::vector<analyses::ExcludedTokens> masks(all.size());
  int compared = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    const HeadCase& c = all[i];
    masks[i].resize(static_cast<std::size_t>(c.q.rows()));
    for (std::size_t t = 0; t < masks[i].size(); ++t) masks[i][t] = t % 3 == 1 ? 1 : 0;
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    analyses::HeadConfusion ref;
    try {
      ref = analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt, &masks[i]);
    } catch (const NumericalError&) {
      continue;
    }
    expect_equal(analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt, &masks[i]),
                 ref, c.label + " every third token excluded");
    ++compared;
  }
  EXPECT_GT(compared, 100);
  for (const char* spec : {"softmax", "linear:relu"}) {
    const Variant v = parse_variant(spec);
    std::vector<analyses::HeadInput> heads;
    std::vector<std::size_t> used;
    for (std::size_t i = 0; i < all.size(); ++i) {
      const HeadCase& c = all[i];
      if (c.variant.name() == v.name() && c.label.rfind("planted", 0) == 0 && c.q.cols() == 7) {
        heads.push_back({&c.q, &c.q, &c.k, i % 2 == 0 ? &masks[i] : nullptr});
        used.push_back(i);
      }
    }
    ASSERT_GE(heads.size(), 2U) << spec;
    analyses::ConfusionOptions opt;
    const double scale = all[used.front()].scale;
    const auto got = analyses::count_confusion_cuda_batch(v, heads, scale, opt);
    for (std::size_t h = 0; h < heads.size(); ++h) {
      const HeadCase& c = all[used[h]];
      expect_equal(
          got[h],
          analyses::count_confusion_reference(v, c.q, c.q, c.k, scale, opt, heads[h].excluded),
          c.label + (heads[h].excluded ? " excluded tokens" : "") + " (in a batch)");
    }
  }
}

TEST_F(CudaConfusion, ThresholdPairFollowsEpsToTheUlp) {
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala", "cosformer", "efficient"}) {
    HeadCase c = planted_case(spec, 197, 64, 17);
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    const auto at = analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt);
    expect_equal(at, analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt), c.label);
    opt.eps = std::nextafter(c.eps, 0.0);
    const auto below = analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt);
    expect_equal(below, analyses::count_confusion_reference(c.variant, c.q, c.q, c.k, c.scale, opt),
                 c.label + " eps one ulp less");
  }
}

TEST_F(CudaConfusion, ManyThreadsEachOnTheirOwnStream) {
  const std::vector<HeadCase> cases = gpu_cases();
  std::vector<analyses::HeadConfusion> gpu(cases.size()), cpu(cases.size());
  std::vector<char> refused(cases.size(), 0);
#pragma omp parallel for schedule(dynamic) num_threads(4)
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const HeadCase& c = cases[i];
    analyses::ConfusionOptions opt;
    opt.eps = c.eps;
    try {
      cpu[i] = analyses::count_confusion(c.variant, c.q, c.q, c.k, c.scale, opt);
      gpu[i] = analyses::count_confusion_cuda(c.variant, c.q, c.q, c.k, c.scale, opt);
    } catch (const NumericalError&) {
      refused[i] = 1;
    }
  }
  for (std::size_t i = 0; i < cases.size(); ++i) {
    if (!refused[i]) {
      expect_equal(gpu[i], cpu[i], cases[i].label + " (4 threads)");
    }
  }
}

TEST_F(CudaConfusion, MoreCandidatesThanTheFirstBufferHolds) {
  // Identical keys: every row is the same, so all n(n-1)/2 pairs are candidates (over 65,536).
  const int n = 600, d = 8;
  for (const char* spec : {"softmax", "linear:elu1"}) {
    const Variant v = parse_variant(spec);
    const MatF q = normal_f(n, d, 3), k = normal_f(1, d, 4).replicate(n, 1);
    const auto got = analyses::count_confusion_cuda(v, q, q, k, 0.4, analyses::ConfusionOptions{});
    EXPECT_EQ(got.candidates, std::int64_t{n} * (n - 1) / 2) << spec;
    expect_equal(got, analyses::count_confusion(v, q, q, k, 0.4, analyses::ConfusionOptions{}),
                 std::string(spec) + " identical keys, N=600");
  }
}

}  // namespace
}  // namespace attnscope::test
