// What every subcommand shares: the common flags (spelled the same everywhere), error handling
// (one line on stderr, non-zero exit), result files written atomically, run metadata as JSON, and
// a progress bar on stderr when it is a terminal.
#pragma once

#include "attnscope/run/exit_status.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/result_set.hpp"
#include "attnscope/run/run_record.hpp"

#include "attnscope/device.hpp"
#include "attnscope/dump.hpp"
#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace attnscope::app {

// The run machinery (run/: result sets, run records, journals, image runs, MPI, interrupts, exit
// codes) is library code that the command shares with the Python module.
using namespace attnscope::run;

namespace po = boost::program_options;


/// Throws NothingToMeasure ("no valid queries: every attention row of the selection is
/// degenerate ..., so <consequence>") when not one row of the run could be measured.
void require_measured_rows(std::int64_t measured, const std::string& consequence);

/// The most OpenMP threads --threads or OMP_NUM_THREADS may ask for. Work is split per head, so
/// more never helps, and far more makes the OpenMP runtime crash instead of failing cleanly.
inline constexpr int kMaxThreads = 1024;

/// What --variant means when it is left out: the words that complete "(default: ...)" in --help,
/// and the variants it stands for in a given dump (seeded like the given ones).
struct VariantDefault {
  std::string help;
  /// `layers`: the dump layers the command reads (empty: all).
  std::function<std::vector<Variant>(const DumpSchema&, std::uint64_t seed,
                                     const std::vector<int>& layers)>
      variants;
  /// Whether the command applies each layer's own variant to a dump whose layers differ in
  /// family (layers_own_variants) rather than asking for --variant.
  bool each_layer = false;
};
/// The dump's own variant (its attention_family, feature_map and convention attributes; those
/// of the layers read, which must agree where the dump's layers differ in family, unless
/// `each_layer`: then each layer's own, see layers_own_variants).
VariantDefault dumps_own_variant(bool each_layer = false);
/// A fixed list of variant names, parsed under the dump's convention.
VariantDefault variants_under_dump_convention(const std::string& specs);

/// The files of --dump, in the order their images follow each other. Converts to the file list
/// DumpReader takes; recorded in a run's JSON as the file name when there is one file (the form
/// runs have always had) and as a list when there are several.
struct DumpFiles : std::vector<std::string> {
  using std::vector<std::string>::vector;
  /// The files for messages: "a.h5" or "a.h5, b.h5".
  [[nodiscard]] std::string name() const;
};
void to_json(nlohmann::json& j, const DumpFiles& files);
/// Boost.Program_options parses every value of --dump (`--dump a.h5 b.h5`, repeated or not) into
/// the list; an empty name is refused.
void validate(boost::any& v, const std::vector<std::string>& values, DumpFiles*, int);

/// The shared flags. Each one is declared by one function below, used by every command that
/// takes it, so that its name, value name, help text and default are spelled in one place.
struct CommonOptions {
  DumpFiles dump;                   ///< --dump FILE [FILE...]
  std::string out;                  ///< --out DIR (results folder, created if missing)
  std::string variant;              ///< --variant SPEC[,SPEC...] (empty: variant_default)
  VariantDefault variant_default = dumps_own_variant();
  int threads = 0;                  ///< --threads N (0: OpenMP default)
  std::uint64_t seed = 0;           ///< --seed N
  std::string device = "auto";      ///< --device auto|cpu|cuda
};
/// --dump FILE [FILE...] (several values, or the flag repeated), required; with `alternative`
/// (e.g. "--synthetic") optional, the help naming it. A command that reads one file only
/// (`several` false: replay) says so in its help; it refuses a second file when it runs.
void add_dump_option(po::options_description& d, CommonOptions& o,
                     const std::string& alternative = "", bool several = true);
void add_out_option(po::options_description& d, CommonOptions& o, const std::string& default_dir);
/// --variant SPEC[,SPEC...]; `dflt` (kept in o.variant_default) is what leaving it out means.
void add_variant_option(po::options_description& d, CommonOptions& o,
                        const VariantDefault& dflt = dumps_own_variant());
void add_threads_option(po::options_description& d, CommonOptions& o);
void add_seed_option(po::options_description& d, CommonOptions& o);
void add_device_option(po::options_description& d, CommonOptions& o);

/// Resolves --device for `command` (device.hpp); `has_cuda_path`: whether the command has one.
/// When auto picks a CUDA device it says so in one line on stderr ("attnscope <command>: using
/// cuda:0 <name>"); the CPU is silent. UsageError when --device cuda cannot be honoured.
ResolvedDevice apply_device(const std::string& command, const CommonOptions& o, bool has_cuda_path);

/// The variants a run computes, resolved the one way every command does: --variant (a comma
/// list, parsed under the dump's convention with --seed) or, when it was left out, the command's
/// default (o.variant_default; without --variant, the dump's own). A dump whose own variant the
/// registry cannot parse is an InputError naming its attribute; a variant this build cannot
/// compute is a UsageError saying why. A variant whose rows need not sum to 1
/// (Variant::rows_sum_to_one() false) gets one note on stderr saying its rows are used as
/// computed, never renormalised.
/// `layers`: the dump layers the command reads (empty: all), whose own variant is the default.
std::vector<Variant> resolve_variants(const CommonOptions& o, const DumpSchema& schema,
                                      const std::vector<int>& layers = {});

/// Each dump layer's own variant (indexed by dump layer, for Selection::own_variants) when
/// --variant was left out, the default is the dump's own with each_layer, and the layers read
/// differ in family; empty otherwise. UsageError naming the model layer of a variant this build
/// cannot compute.
std::vector<Variant> layers_own_variants(const CommonOptions& o, const DumpSchema& schema,
                                         const std::vector<int>& layers);
/// The names of `own` (layers_own_variants) by model layer, for the results' variant column.
std::map<int, std::string> own_variant_names(const DumpSchema& schema,
                                             const std::vector<Variant>& own,
                                             const std::vector<int>& layers);
/// What a run's JSON says of the variants: their names, or with each layer's own variant
/// "each layer's own" and the per-layer names.
nlohmann::json variants_json(const std::vector<Variant>& variants,
                             const std::map<int, std::string>& own_names);
/// The geometry of each layer read (geometry.hpp's describe()) by model layer, when some layer's
/// differs from the root attributes'; null otherwise (old dumps: results unchanged).
nlohmann::json layer_geometry_json(const DumpSchema& schema, const std::vector<int>& layers);

/// The arguments of the last parse_args, canonical: every flag by its full name as
/// `--name=value` (an abbreviation such as `--ou` becomes `--out=...`), positional values as given.
const std::vector<std::string>& parsed_args();

/// The command's arguments as an image run keeps them for merge (ImageRun's `args`): what the
/// parser understood (parsed_args()), not what was typed (an abbreviated --ou would not be
/// stripped), or `args` when nothing was parsed.
inline const std::vector<std::string>& command_args(const std::vector<std::string>& args) {
  return parsed_args().empty() ? args : parsed_args();
}

/// --resume and --shard I/N (RunControl, image_run.hpp).
void add_run_control_options(po::options_description& d, RunControl& c);

/// Parses args against `desc` (and positional names, if any). Prints help and returns false on
/// --help (the caller returns 0). Throws UsageError on unknown or malformed flags, on a
/// positional argument that `pos` does not name, and on a flag given an empty value.
bool parse_args(const std::string& command, const std::string& synopsis,
                const po::options_description& desc, const std::vector<std::string>& args,
                po::variables_map& vm, const po::positional_options_description* pos = nullptr);

/// Applies --threads (omp_set_num_threads) when > 0; returns the thread count in effect.
/// Throws UsageError when threads is outside [0, kMaxThreads] or, with threads == 0, when
/// OMP_NUM_THREADS is set to anything but a list of counts in [1, kMaxThreads].
int apply_threads(int threads);

/// The exit code and one-line message run_guarded gives an exception: run::exit_status's, and a
/// Boost.Program_options error is a usage error (2).
ExitStatus exit_status(std::exception_ptr e);

/// Runs a subcommand body, turning attnscope::UsageError into exit 2, NothingToMeasure into exit
/// 4, InputError/NumericalError and other std::exceptions into exit 1, each as one line
/// "attnscope <command>: <what>" on stderr.
int run_guarded(const std::string& command, const std::function<int()>& body);

/// Progress bar with rate and ETA on stderr, drawn only when stderr is a terminal and the work has run
/// for more than a second. Thread-safe tick().
class Progress {
 public:
  Progress(std::string label, std::size_t total);
  ~Progress();
  void tick(std::size_t n = 1);
  void finish();
  /// The line drawn for `done` of `total` items after `seconds`: bar, count, percentage, rate and
  /// ETA (rate and ETA once something is done).
  static std::string line(const std::string& label, std::size_t done, std::size_t total,
                          double seconds);

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace attnscope::app
