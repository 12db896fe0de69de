// The linear-time form keeps its scratch per thread: repeated calls of one size allocate nothing
// (a fresh buffer per call crossed malloc's mmap threshold at N = 256, d = 64 and cost fresh pages
// every call), and attention_outputs_into gives exactly the outputs of attention_outputs.
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/work_counters.hpp"

#include <gtest/gtest.h>

#include <random>
#include <thread>

namespace attnscope {
namespace {

template <typename T>
Mat<T> gaussian(int n, int d, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal;
  Mat<T> m(n, d);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(normal(gen));
  return m;
}

template <typename T>
void expect_no_growth_on_repeat(const char* spec) {
  const Variant v = parse_variant(spec);
  for (int n : {1, 63, 197, 256, 1024}) {
    const Mat<T> q = gaussian<T>(n, 64, 1), k = gaussian<T>(n, 64, 2), x = gaussian<T>(n, 64, 3);
    Mat<T> out(n, 64);
    attention_outputs_into<T>(v, q, k, x, 0.125, out);  // may grow the scratch to this size
    const std::uint64_t before = thread_work_counters().scratch_growths;
    for (int rep = 0; rep < 3; ++rep) attention_outputs_into<T>(v, q, k, x, 0.125, out);
    (void)attention_outputs<T>(v, q, k, x, 0.125);
    EXPECT_EQ(thread_work_counters().scratch_growths, before) << spec << " N=" << n;
    // Smaller sizes fit in what is there.
    const Mat<T> q2 = q.topRows(n / 2 + 1), k2 = k.topRows(n / 2 + 1), x2 = x.topRows(n / 2 + 1);
    (void)attention_outputs<T>(v, q2, k2, x2, 0.125);
    EXPECT_EQ(thread_work_counters().scratch_growths, before) << spec << " N=" << n / 2 + 1;
  }
}

TEST(LinearScratch, RepeatedCallsAllocateNoScratchFloat) {
  for (const char* spec : {"inline@code", "mala@code", "linear:relu", "inline:elu1@paper"}) {
    expect_no_growth_on_repeat<float>(spec);
  }
}

TEST(LinearScratch, RepeatedCallsAllocateNoScratchDouble) {
  for (const char* spec : {"inline@code", "mala@paper", "linear:relu_affine=3"}) {
    expect_no_growth_on_repeat<double>(spec);
  }
}

TEST(LinearScratch, IntoEqualsOutputsExactly) {
  for (const char* spec : {"inline@code", "mala@code", "linear:relu", "softmax"}) {
    const Variant v = parse_variant(spec);
    for (int n : {1, 63, 197}) {
      const MatF q = gaussian<float>(n, 7, 4), k = gaussian<float>(n, 7, 5),
                 x = gaussian<float>(n, 5, 6);
      MatF out(n, 5);
      attention_outputs_into<float>(v, q, k, x, 0.3, out);
      const MatF ref = attention_outputs<float>(v, q, k, x, 0.3);
      EXPECT_EQ((out - ref).cwiseAbs().maxCoeff(), 0.0f) << spec << " N=" << n;
    }
  }
}

TEST(LinearScratch, EachThreadHasItsOwnScratch) {
  // Two threads of different sizes at once: each gets its own buffers and the right outputs.
  const Variant v = parse_variant("mala@code");
  const auto run = [&](int n, bool* ok) {
    const MatD q = gaussian<double>(n, 16, 7), k = gaussian<double>(n, 16, 8),
               x = gaussian<double>(n, 16, 9);
    const MatD ref = attention_outputs_explicit<double>(v, q, k, x, 0.25);
    *ok = true;
    for (int rep = 0; rep < 20; ++rep) {
      const MatD out = attention_outputs<double>(v, q, k, x, 0.25);
      *ok = *ok && (out - ref).cwiseAbs().maxCoeff() < 1e-12;
    }
  };
  bool a = false, b = false;
  std::thread ta(run, 50, &a), tb(run, 300, &b);
  ta.join();
  tb.join();
  EXPECT_TRUE(a);
  EXPECT_TRUE(b);
}

TEST(LinearScratch, IntoRejectsAnOutputOfTheWrongShape) {
  const Variant v = parse_variant("inline@code");
  const MatD q = gaussian<double>(10, 4, 1);
  MatD out(9, 4);
  EXPECT_THROW(attention_outputs_into<double>(v, q, q, q, 0.5, out), UsageError);
}

}  // namespace
}  // namespace attnscope
