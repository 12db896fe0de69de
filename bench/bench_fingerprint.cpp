// The input fingerprint of --resume and merge: the whole-file SHA-256 it used first (one thread),
// the SHA-256 tree of 64 MiB chunks it used next and the XXH3-128 tree it uses now
// (run/include/attnscope/run/hash_tree.hpp), the trees on 1, 2 and all threads, on one file read
// from the page cache. The file is ATTNSCOPE_BENCH_FILE, or else 1 GiB
// of random bytes written to $TMPDIR (or /tmp) first and removed at the end. Wall time; bytes/s.
// Before timing, every thread count must give the one-thread tree of each hash.
#include "attnscope/run/hash_tree.hpp"
#include "attnscope/run/sha256.hpp"

#include <benchmark/benchmark.h>
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

struct BenchFile {
  fs::path path;
  bool ours = false;
  BenchFile() {
    if (const char* given = std::getenv("ATTNSCOPE_BENCH_FILE")) {
      path = given;
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    path = fs::path(tmp != nullptr ? tmp : "/tmp") / ("attnscope-bench-fingerprint-" + std::to_string(::getpid()));
    ours = true;
    std::ofstream out(path, std::ios::binary);
    std::mt19937_64 rng(5);
    std::vector<std::uint64_t> block(1 << 17);  // 1 MiB
    for (int m = 0; m < 1024; ++m) {
      for (auto& x : block) x = rng();
      out.write(reinterpret_cast<const char*>(block.data()), static_cast<std::streamsize>(block.size() * 8));
    }
    if (!out) {
      std::fprintf(stderr, "bench_fingerprint: cannot write %s\n", path.c_str());
      std::exit(1);
    }
  }
  ~BenchFile() {
    if (ours) fs::remove(path);
  }
};

const BenchFile& file() {
  static const BenchFile f;
  return f;
}

using attnscope::run::TreeHash;

void check_trees(TreeHash hash) {
  const std::string one = attnscope::run::hash_tree_file(file().path, hash, 1);
  for (int t : {2, 3, omp_get_max_threads()}) {
    if (attnscope::run::hash_tree_file(file().path, hash, t) != one) {
      std::fprintf(stderr, "bench_fingerprint: %d threads give another %s than one\n", t,
                   attnscope::run::tree_hash_key(hash));
      std::exit(1);
    }
  }
}

void BM_Sha256Whole(benchmark::State& state) {
  std::uintmax_t bytes = 0;
  for (auto _ : state) benchmark::DoNotOptimize(attnscope::run::sha256_file(file().path, &bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
}
BENCHMARK(BM_Sha256Whole)->Unit(benchmark::kMillisecond)->UseRealTime();

void tree(benchmark::State& state, TreeHash hash) {
  static bool checked[2] = {false, false};
  if (!checked[static_cast<int>(hash)]) {
    check_trees(hash);
    checked[static_cast<int>(hash)] = true;
  }
  const int threads = state.range(0) > 0 ? static_cast<int>(state.range(0)) : omp_get_max_threads();
  std::uintmax_t bytes = 0;
  for (auto _ : state) benchmark::DoNotOptimize(attnscope::run::hash_tree_file(file().path, hash, threads, &bytes));
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["threads"] = threads;
}
void BM_Sha256Tree(benchmark::State& state) { tree(state, TreeHash::sha256); }
void BM_Xxh3Tree(benchmark::State& state) { tree(state, TreeHash::xxh3_128); }
// 0: all of omp_get_max_threads() (OMP_NUM_THREADS, or the cores).
BENCHMARK(BM_Sha256Tree)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Xxh3Tree)->Arg(1)->Arg(2)->Arg(0)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
