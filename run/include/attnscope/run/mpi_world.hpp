// Processes of one run under an MPI launcher (mpirun -n R attnscope ...): which rank this is, and
// the few collective steps the image runs need (image_run.hpp). MPI is started only when the
// process was started by a launcher; otherwise, and in a build without MPI, there is one rank.
#pragma once

#include <string>
#include <vector>

namespace attnscope::run::mpi {

/// Starts MPI when the environment shows a launcher (Open MPI, MPICH/Hydra or PMIx variables).
/// Throws attnscope::Error when the launcher asked for more than one rank and this build has no
/// MPI.
void init(int* argc, char*** argv);
/// Ends MPI if it was started (call once, on the way out of main).
void finalize();
/// Whether this build links MPI, and its library's version line (empty without).
bool built_with_mpi();
std::string library_version();

int rank();
int size();
inline bool root() { return rank() == 0; }

/// Collective: every rank gives its error ("" when it has none) and exit code. Returns, on every
/// rank, the lowest failing rank's message prefixed "rank r of R: " and its code; an empty
/// message and 0 when no rank failed.
struct Outcome {
  std::string message;
  int code = 0;
};
Outcome agree(const std::string& error, int code);

/// Point-to-point byte messages (tag fixed): send blocks until sent; recv from `source`.
void send_bytes(int dest, const std::vector<char>& bytes);
std::vector<char> recv_bytes(int source);

}  // namespace attnscope::run::mpi
