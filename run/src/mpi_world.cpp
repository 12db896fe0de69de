#include "attnscope/run/mpi_world.hpp"

#include "attnscope/error.hpp"

#include <cstdlib>
#include <limits>

#ifdef ATTNSCOPE_HAVE_MPI
// The C API only: the C++ bindings are deprecated and need a library of their own.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace attnscope::run::mpi {
namespace {

bool g_started = false;
int g_rank = 0;
int g_size = 1;

/// The rank count a launcher announced in the environment (0: no launcher).
int launcher_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr ? 1 : 0;
}

#ifdef ATTNSCOPE_HAVE_MPI
constexpr int kTag = 7;
void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string("MPI: ") + what + " failed");
}
#endif

}  // namespace

void init(int* argc, char*** argv) {
  const int n = launcher_size();
  if (n == 0) return;
#ifdef ATTNSCOPE_HAVE_MPI
  int provided = 0;
  // Only the main thread calls MPI; the reader thread and OpenMP's threads never do.
  check(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  g_started = true;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &g_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &g_size), "MPI_Comm_size");
#else
  (void)argc;
  (void)argv;
  if (n > 1) {
    throw Error("started by an MPI launcher with " + std::to_string(n) +
                " ranks, but this attnscope was built without MPI (install libopenmpi-dev and "
                "rebuild, or use --shard i/n with attnscope merge)");
  }
#endif
}

void finalize() {
#ifdef ATTNSCOPE_HAVE_MPI
  if (g_started) MPI_Finalize();
#endif
  g_started = false;
}

bool built_with_mpi() {
#ifdef ATTNSCOPE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string library_version() {
#ifdef ATTNSCOPE_HAVE_MPI
  char buf[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  if (MPI_Get_library_version(buf, &len) != MPI_SUCCESS) return "MPI";
  std::string s(buf, static_cast<std::size_t>(len));
  const std::size_t cut = s.find_first_of(",\n");
  return cut == std::string::npos ? s : s.substr(0, cut);
#else
  return "";
#endif
}

int rank() { return g_rank; }
int size() { return g_size; }

Outcome agree(const std::string& error, int code) {
  if (g_size == 1) return {error, error.empty() ? 0 : code};
#ifdef ATTNSCOPE_HAVE_MPI
  // The lowest failing rank speaks for the run.
  const int mine = error.empty() ? std::numeric_limits<int>::max() : g_rank;
  int first = 0;
  check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  if (first == std::numeric_limits<int>::max()) return {};
  int len = g_rank == first ? static_cast<int>(error.size()) : 0;
  int c = g_rank == first ? code : 0;
  check(MPI_Bcast(&len, 1, MPI_INT, first, MPI_COMM_WORLD), "MPI_Bcast");
  check(MPI_Bcast(&c, 1, MPI_INT, first, MPI_COMM_WORLD), "MPI_Bcast");
  std::string text = g_rank == first ? error : std::string(static_cast<std::size_t>(len), ' ');
  if (len > 0) check(MPI_Bcast(text.data(), len, MPI_CHAR, first, MPI_COMM_WORLD), "MPI_Bcast");
  return {"rank " + std::to_string(first) + " of " + std::to_string(g_size) + ": " + text, c};
#else
  return {error, code};
#endif
}

void send_bytes(int dest, const std::vector<char>& bytes) {
#ifdef ATTNSCOPE_HAVE_MPI
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
    throw Error("MPI: message too large");
  }
  check(MPI_Send(bytes.data(), static_cast<int>(bytes.size()), MPI_CHAR, dest, kTag,
                 MPI_COMM_WORLD),
        "MPI_Send");
#else
  (void)dest;
  (void)bytes;
  throw Error("MPI: not built");
#endif
}

std::vector<char> recv_bytes(int source) {
#ifdef ATTNSCOPE_HAVE_MPI
  MPI_Status st;
  check(MPI_Probe(source, kTag, MPI_COMM_WORLD, &st), "MPI_Probe");
  int n = 0;
  check(MPI_Get_count(&st, MPI_CHAR, &n), "MPI_Get_count");
  std::vector<char> out(static_cast<std::size_t>(n));
  check(MPI_Recv(out.data(), n, MPI_CHAR, source, kTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
        "MPI_Recv");
  return out;
#else
  (void)source;
  throw Error("MPI: not built");
#endif
}

}  // namespace attnscope::run::mpi
