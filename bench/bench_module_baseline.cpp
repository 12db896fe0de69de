// The C++ side of bench/module_vs_library.py: the library calls the Python module makes for
// weights(), confusion() and local_mass(), made directly on the same heads (raw float32 files
// [heads, tokens, dim] that the script writes), one OpenMP loop over the heads as the module runs
// them. Prints one line per repeat with the seconds of each round, and a checksum of the results
// (the script compares it with the module's, so both did the same work).
//
//   bench_module_baseline WORK VARIANT Q.f32 K.f32 HEADS TOKENS DIM REPEATS
//   WORK: weights | confusion | local_mass (grid: one prefix token and a square grid)
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/locality.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/variant.hpp"

#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace {

using namespace attnscope;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

std::vector<MatF> read_heads(const char* path, int heads, int tokens, int dim) {
  std::ifstream f(path, std::ios::binary);
  std::vector<float> raw(static_cast<std::size_t>(heads) * tokens * dim);
  f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size() * 4));
  if (!f) {
    std::fprintf(stderr, "bench_module_baseline: %s: cannot read %zu floats\n", path, raw.size());
    std::exit(1);
  }
  std::vector<MatF> out;
  for (int h = 0; h < heads; ++h) {
    out.emplace_back(Eigen::Map<const MatF>(raw.data() + static_cast<std::size_t>(h) * tokens * dim,
                                            tokens, dim));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: bench_module_baseline WORK VARIANT Q K HEADS TOKENS DIM REPEATS\n");
    return 2;
  }
  const std::string work = argv[1];
  const Variant v = parse_variant(argv[2], Convention::Paper);
  const int heads = std::atoi(argv[5]), tokens = std::atoi(argv[6]), dim = std::atoi(argv[7]);
  const int repeats = std::atoi(argv[8]);
  const std::vector<MatF> q = read_heads(argv[3], heads, tokens, dim);
  const std::vector<MatF> k = read_heads(argv[4], heads, tokens, dim);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  const int side = static_cast<int>(std::lround(std::sqrt(tokens - 1)));
  const TokenGrid grid{1, side, side};
  std::vector<float> w(static_cast<std::size_t>(heads) * tokens * tokens);
  std::vector<std::int64_t> pairs(static_cast<std::size_t>(heads));
  std::vector<std::vector<double>> mass(static_cast<std::size_t>(heads));
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
#pragma omp parallel for schedule(dynamic, 1)
    for (int h = 0; h < heads; ++h) {
      if (work == "weights") {
        Diagnostics diag;
        Eigen::Map<MatF>(w.data() + static_cast<std::size_t>(h) * tokens * tokens, tokens, tokens) =
            attention_weights<float>(v, q[static_cast<std::size_t>(h)],
                                     k[static_cast<std::size_t>(h)], scale, nullptr, &diag);
      } else if (work == "confusion") {
        pairs[static_cast<std::size_t>(h)] =
            analyses::count_confusion(v, q[static_cast<std::size_t>(h)], q[static_cast<std::size_t>(h)],
                                      k[static_cast<std::size_t>(h)], scale, {})
                .pairs;
      } else {
        mass[static_cast<std::size_t>(h)] = analyses::local_mass(
            v, q[static_cast<std::size_t>(h)], k[static_cast<std::size_t>(h)], scale, grid, 3);
      }
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = cpu_seconds() - cpu_start;
    double check = 0.0;
    if (work == "weights") {
      for (float x : w) check += x;
    } else if (work == "confusion") {
      for (auto p : pairs) check += static_cast<double>(p);
    } else {
      for (const auto& m : mass)
        for (double x : m)
          if (!std::isnan(x)) check += x;
    }
    std::printf("%.9f %.9f %.6f\n", s, cpu, check);
  }
  return 0;
}
