// parallel_for: every index runs once; an exception thrown in any iteration reaches the caller
// with its type and message, and stops further work.
#include "attnscope/error.hpp"
#include "attnscope/parallel.hpp"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace attnscope {
namespace {

class ParallelFor : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    saved_ = omp_get_max_threads();
    omp_set_num_threads(GetParam());
  }
  void TearDown() override { omp_set_num_threads(saved_); }

 private:
  int saved_ = 1;
};

TEST_P(ParallelFor, RunsEveryIndexOnce) {
  for (int n : {0, 1, 7, 197}) {
    std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
    parallel_for(n, [&](int i) { hits[static_cast<std::size_t>(i)].fetch_add(1); });
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(hits[static_cast<std::size_t>(i)].load(), 1)
          << "index " << i << " of n = " << n << ", threads = " << GetParam();
    }
  }
}

TEST_P(ParallelFor, NegativeCountRunsNothing) {
  std::atomic<int> calls{0};
  parallel_for(-3, [&](int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 0);
}

TEST_P(ParallelFor, RethrowsTypeAndMessage) {
  for (int bad : {0, 5, 99}) {
    try {
      parallel_for(100, [bad](int i) {
        if (i == bad) throw NumericalError("iteration " + std::to_string(i) + " overflowed");
      });
      ADD_FAILURE() << "no exception for bad index " << bad << ", threads = " << GetParam();
    } catch (const NumericalError& e) {
      EXPECT_EQ(std::string(e.what()), "iteration " + std::to_string(bad) + " overflowed");
    } catch (...) {
      ADD_FAILURE() << "wrong exception type for bad index " << bad;
    }
  }
}

TEST_P(ParallelFor, RethrowsBadAlloc) {
  EXPECT_THROW(parallel_for(64, [](int i) {
                 if (i == 17) throw std::bad_alloc();
               }),
               std::bad_alloc);
}

TEST_P(ParallelFor, OneOfSeveralExceptionsReachesTheCaller) {
  // Every iteration throws: exactly one exception comes out, and it is one of those thrown.
  try {
    parallel_for(50, [](int i) { throw InputError("f.h5", "/layers/" + std::to_string(i), "a", "b"); });
    ADD_FAILURE() << "no exception, threads = " << GetParam();
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "f.h5");
    EXPECT_EQ(e.object().rfind("/layers/", 0), 0U) << e.object();
  }
}

TEST_P(ParallelFor, StopsStartingWorkAfterAThrow) {
  // One index per chunk: after index 0 throws, each thread finishes at most the index it holds.
  // The other iterations take 1 ms each, so running them all would start thousands.
  std::atomic<int> started{0};
  EXPECT_THROW(parallel_for(10000,
                            [&](int i) {
                              started.fetch_add(1);
                              if (i == 0) throw UsageError("stop");
                              std::this_thread::sleep_for(std::chrono::milliseconds(1));
                            }),
               UsageError);
  if (GetParam() == 1) {
    EXPECT_EQ(started.load(), 1);
  } else {
    EXPECT_LT(started.load(), 1000) << "threads = " << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, ParallelFor, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace attnscope
