// The shared pieces of every subcommand: flags, error handling, atomic result files, metadata and
// the progress bar.
#include "common.hpp"
#include "attnscope/run/mpi_world.hpp"

#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/error.hpp"
#include "attnscope/notes.hpp"
#include "attnscope/text.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <new>
#include <sstream>
#include <typeinfo>

namespace attnscope::app {

std::string DumpFiles::name() const {
  std::string s;
  for (const std::string& f : *this) s += (s.empty() ? "" : ", ") + f;
  return s;
}

void to_json(nlohmann::json& j, const DumpFiles& files) {
  if (files.size() == 1) {
    j = files.front();
  } else {
    j = static_cast<const std::vector<std::string>&>(files);
  }
}

void validate(boost::any& v, const std::vector<std::string>& values, DumpFiles*, int) {
  if (v.empty()) v = DumpFiles();
  auto& files = boost::any_cast<DumpFiles&>(v);
  for (const std::string& f : values) {
    if (f.empty()) {
      throw UsageError("--dump was given an empty value (give a value, or leave the flag out for "
                       "its default)");
    }
    files.push_back(f);
  }
}

void add_dump_option(po::options_description& d, CommonOptions& o, const std::string& alternative,
                     bool several) {
  const std::string help =
      several ? "HDF5 dump to read (docs/dump-format.md); several files are read as one dump, their "
                "images in the order given"
              : "HDF5 dump to read (docs/dump-format.md), one file";
  auto* value = po::value(&o.dump)->value_name(several ? "FILE..." : "FILE")->multitoken()->composing();
  if (alternative.empty()) {
    d.add_options()("dump", value->required(), help.c_str());
  } else {
    d.add_options()("dump", value, (help + "; or " + alternative).c_str());
  }
}

void add_out_option(po::options_description& d, CommonOptions& o, const std::string& default_dir) {
  d.add_options()("out", po::value(&o.out)->value_name("DIR")->default_value(default_dir),
                  "results folder, created if missing");
}

VariantDefault dumps_own_variant(bool each_layer) {
  return {each_layer ? "the dump's own, each layer's where they differ" : "the dump's own",
          [each_layer](const DumpSchema& schema, std::uint64_t seed, const std::vector<int>& layers) {
            if (schema.variants_differ(layers) && !each_layer) {
              throw UsageError(schema.path + ": its layers differ in attention family (" +
                               schema.layer_variants_text(layers) +
                               "); this command applies one variant to every layer: give "
                               "--variant, or --layers of one family (recompute, confusion, "
                               "locality, maps, distance, entropy, rank, sinks, rollout and "
                               "mask use each layer's own)");
            }
            try {
              return std::vector<Variant>{
                  schema.layer_variant(layers.empty() ? 0 : layers.front(), seed)};
            } catch (const UsageError& e) {
              throw InputError(schema.path, "attribute 'feature_map'", "a known feature-map spec",
                               e.what());
            }
          },
          each_layer};
}

std::vector<Variant> layers_own_variants(const CommonOptions& o, const DumpSchema& schema,
                                         const std::vector<int>& layers) {
  if (!o.variant.empty() || !o.variant_default.each_layer || !schema.variants_differ(layers)) {
    return {};
  }
  std::vector<Variant> own;
  for (int l = 0; l < schema.attrs.num_layers; ++l) {
    own.push_back(schema.layer_variant(l, o.seed));
    std::string why;
    const bool read = layers.empty() || std::find(layers.begin(), layers.end(), l) != layers.end();
    if (read && !own.back().supports(&why)) {
      throw UsageError("model layer " + std::to_string(schema.model_layer(l)) + ": its own " +
                       own.back().name() + " cannot be computed: " + why +
                       " (choose the variants with --variant)");
    }
  }
  return own;
}

std::map<int, std::string> own_variant_names(const DumpSchema& schema,
                                             const std::vector<Variant>& own,
                                             const std::vector<int>& layers) {
  std::map<int, std::string> names;
  if (own.empty()) return names;
  for (int l : layers) names[schema.model_layer(l)] = own[static_cast<std::size_t>(l)].name();
  return names;
}

nlohmann::json variants_json(const std::vector<Variant>& variants,
                             const std::map<int, std::string>& own_names) {
  if (own_names.empty()) {
    nlohmann::json names = nlohmann::json::array();
    for (const Variant& v : variants) names.push_back(v.name());
    return names;
  }
  nlohmann::json per_layer = nlohmann::json::object();
  for (const auto& [layer, name] : own_names) per_layer[std::to_string(layer)] = name;
  return {{"each_layer_own", per_layer}};
}

nlohmann::json layer_geometry_json(const DumpSchema& schema, const std::vector<int>& layers) {
  bool differs = false;
  for (int l : layers) differs = differs || schema.geometry_differs(l);
  if (!differs) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (int l : layers) out[std::to_string(schema.model_layer(l))] = schema.geometry(l).describe();
  return out;
}

VariantDefault variants_under_dump_convention(const std::string& specs) {
  return {specs + " under the dump's convention",
          [specs](const DumpSchema& schema, std::uint64_t seed, const std::vector<int>&) {
            return parse_variants(specs, parse_convention(schema.attrs.convention), seed);
          }};
}

void add_variant_option(po::options_description& d, CommonOptions& o, const VariantDefault& dflt) {
  o.variant_default = dflt;
  const std::string help =
      "attention variants, e.g. softmax,linear:relu,inline,mala:elu1@code (default: " +
      dflt.help + ")";
  d.add_options()("variant", po::value(&o.variant)->value_name("SPEC[,SPEC...]"), help.c_str());
}

std::vector<Variant> resolve_variants(const CommonOptions& o, const DumpSchema& schema,
                                      const std::vector<int>& layers) {
  const bool given = !o.variant.empty();
  const std::vector<Variant> out =
      given ? parse_variants(o.variant, parse_convention(schema.attrs.convention), o.seed)
            : o.variant_default.variants(schema, o.seed, layers);
  for (const Variant& v : out) {
    std::string why;
    if (v.supports(&why)) continue;
    if (given) throw UsageError("--variant " + v.name() + ": " + why);
    const std::string hint = v.convention == Convention::CodeRope
                                 ? "pass --variant with @code to compute under the code formula"
                                 : "choose the variants with --variant";
    throw UsageError(v.name() + " (--variant left out: " + o.variant_default.help +
                     ") cannot be computed: " + why + " (" + hint + ")");
  }
  for (const Variant& v : out) {
    if (v.rows_sum_to_one()) continue;
    hold_note("attnscope: note: " + v.name() +
              ": attention rows need not sum to 1; every result uses them as computed, never "
              "renormalised");
  }
  return out;
}

void add_threads_option(po::options_description& d, CommonOptions& o) {
  d.add_options()("threads", po::value(&o.threads)->value_name("N")->default_value(0),
                  "OpenMP threads (0: OpenMP's default)");
}

void add_seed_option(po::options_description& d, CommonOptions& o) {
  d.add_options()("seed", po::value(&o.seed)->value_name("N")->default_value(0),
                  "random seed (results are reproducible for a given seed)");
}

void add_device_option(po::options_description& d, CommonOptions& o) {
  d.add_options()("device", po::value(&o.device)->value_name("auto|cpu|cuda")->default_value(o.device),
                  "where to compute: cuda (a GPU; an error where there is none), cpu, or auto (the GPU when "
                  "one is present and the command has a CUDA path)");
}

ResolvedDevice apply_device(const std::string& command, const CommonOptions& o, bool has_cuda_path) {
  const Device requested = parse_device(o.device);
  ResolvedDevice r = resolve_device(requested, command, has_cuda_path);
  if (requested == Device::Auto && r.used == Device::Cuda) {
    hold_note("attnscope " + command + ": using " + r.description);
  }
  return r;
}

namespace {

// Boost keeps a bare word as an option with no name, and store() drops it: `--variant softmax
// linear:relu` would run softmax alone. Bare words get the names `pos` gives them, in order (as
// Boost would); any other is refused by name.
void name_positional_arguments(const std::string& command, po::parsed_options& parsed,
                               const po::positional_options_description* pos) {
  unsigned position = 0;
  for (po::option& o : parsed.options) {
    if (!o.string_key.empty()) continue;
    if (pos != nullptr && position < pos->max_total_count()) {
      o.string_key = pos->name_for_position(position++);
      continue;
    }
    const std::string word = o.original_tokens.empty() ? std::string() : o.original_tokens.front();
    if (pos != nullptr) {
      throw UsageError("unexpected argument '" + word + "' (see attnscope " + command + " --help)");
    }
    throw UsageError("unexpected argument '" + word + "': every value follows its flag, and a " +
                     "list is one comma-separated value (e.g. --variant softmax,linear:relu; see " +
                     "attnscope " + command + " --help)");
  }
}

// An empty value never means "the default": a flag left out does. `--out ""` would write into the
// current folder and `--images ""` would select every image.
void reject_empty_values(const po::variables_map& vm) {
  for (const auto& [name, value] : vm) {
    if (value.defaulted() || value.empty()) continue;
    if (value.value().type() == typeid(std::string) && value.as<std::string>().empty()) {
      throw UsageError("--" + name + " was given an empty value (give a value, or leave the " +
                       "flag out for its default)");
    }
  }
}

// No flag takes NaN or Inf: a tolerance of NaN passes nothing and fails nothing, an eps of Inf
// confuses every pair, and a run record (JSON) cannot hold either (it would say null).
void reject_non_finite(const po::variables_map& vm) {
  for (const auto& [name, value] : vm) {
    if (value.defaulted() || value.empty()) continue;
    double v = 0.0;
    if (value.value().type() == typeid(double)) {
      v = value.as<double>();
    } else if (value.value().type() == typeid(float)) {
      v = value.as<float>();
    } else {
      continue;
    }
    if (!std::isfinite(v)) {
      std::ostringstream found;
      found << v;
      throw UsageError("--" + name + ": expected a finite number, found " + found.str());
    }
  }
}

// Boost converts "-1" to an unsigned flag as 2^64 - 1 (lexical_cast wraps): a seed, a count or
// a size given a negative value is refused instead.
void reject_negative_unsigned(const po::parsed_options& parsed, const po::variables_map& vm) {
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty() || vm.count(o.string_key) == 0) continue;
    const std::type_info& t = vm[o.string_key].value().type();
    if (t != typeid(unsigned) && t != typeid(unsigned long) && t != typeid(unsigned long long)) continue;
    for (const std::string& v : o.value) {
      const std::size_t at = v.find_first_not_of(" \t");
      if (at != std::string::npos && v[at] == '-') {
        throw UsageError("--" + o.string_key + ": expected a non-negative integer, found '" + v + "'");
      }
    }
  }
}

/// The arguments as the parser understood them, each flag by its full name: `--key=value` per
/// value (`--key` for a switch), in the order given. What a run records for merge to re-run, so
/// that an abbreviation typed (`--ou`) is not recorded as typed.
std::vector<std::string> canonical(const po::parsed_options& parsed) {
  std::vector<std::string> out;
  for (const po::option& o : parsed.options) {
    if (o.string_key.empty() || o.string_key == "help") continue;
    if (o.position_key >= 0) {  // a positional argument
      out.insert(out.end(), o.value.begin(), o.value.end());
      continue;
    }
    if (o.value.empty()) out.push_back("--" + o.string_key);
    for (const std::string& v : o.value) out.push_back("--" + o.string_key + "=" + v);
  }
  return out;
}

std::vector<std::string>& parsed_args_store() {
  static std::vector<std::string> args;
  return args;
}

}  // namespace

const std::vector<std::string>& parsed_args() { return parsed_args_store(); }

bool parse_args(const std::string& command, const std::string& synopsis,
                const po::options_description& desc, const std::vector<std::string>& args,
                po::variables_map& vm, const po::positional_options_description* pos) {
  po::options_description all(desc);
  all.add_options()("help,h", "show this help and exit");
  try {
    po::command_line_parser parser(args);
    parser.options(all);
    po::parsed_options parsed = parser.run();
    name_positional_arguments(command, parsed, pos);
    po::store(parsed, vm);
    if (vm.count("help") != 0) {
      std::cout << "usage: attnscope " << command << " " << synopsis << "\n\n" << all;
      return false;
    }
    reject_empty_values(vm);
    reject_negative_unsigned(parsed, vm);
    reject_non_finite(vm);
    parsed_args_store() = canonical(parsed);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UsageError(std::string(e.what()) + " (see attnscope " + command + " --help)");
  }
  return true;
}

namespace {

// OMP_NUM_THREADS as OpenMP reads it: a comma-separated list of positive counts, one per nesting
// level. Anything else is refused here rather than left to the OpenMP runtime, which ignores
// garbage with a warning and crashes on huge counts.
void check_omp_num_threads() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr) return;
  const std::string text(env);
  const auto refuse = [&text]() {
    throw UsageError("OMP_NUM_THREADS='" + text + "': expected a thread count from 1 to " +
                     std::to_string(kMaxThreads) + " (or a list such as 4,2); fix or unset it, " +
                     "or pass --threads N");
  };
  for (const std::string_view spelled : split_list(text)) {
    std::string item(spelled);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty() || item.size() > 5 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      refuse();
    }
    const int n = std::stoi(item);
    if (n < 1 || n > kMaxThreads) refuse();
  }
}

}  // namespace

void require_measured_rows(std::int64_t measured, const std::string& consequence) {
  if (measured > 0) return;
  throw NothingToMeasure("no valid queries: every attention row of the selection is degenerate "
                         "(a zero or tiny denominator), so " + consequence);
}

int apply_threads(int threads) {
  if (threads < 0) throw UsageError("--threads must be >= 0, got " + std::to_string(threads));
  if (threads > kMaxThreads) {
    throw UsageError("--threads must be at most " + std::to_string(kMaxThreads) + ", got " +
                     std::to_string(threads));
  }
  if (threads > 0) {
    omp_set_num_threads(threads);
  } else {
    check_omp_num_threads();
  }
  return omp_get_max_threads();
}

namespace {

// Keeps the error to one line on stderr whatever the message holds.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

int report(const std::string& command, const std::string& what, int code) {
  // Under MPI every rank meets the same flag and input errors: rank 0 alone says so.
  if (mpi::rank() != 0 && code == kExitUsage) return code;
  std::cerr << "attnscope " << command << ": "
            << (mpi::size() > 1 && mpi::rank() != 0
                    ? "rank " + std::to_string(mpi::rank()) + " of " + std::to_string(mpi::size()) + ": "
                    : std::string())
            << one_line(what) << std::endl;
  return code;
}

}  // namespace

ExitStatus exit_status(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const po::error& x) {
    return {kExitUsage, x.what()};
  } catch (...) {
    return run::exit_status(e);
  }
}

void add_run_control_options(po::options_description& d, RunControl& c) {
  d.add_options()
      ("resume", po::bool_switch(&c.resume),
       "continue an interrupted run of the same command, dump and flags from its journal in "
       "--out (refused when anything differs)")
      ("shard", po::value(&c.shard)->value_name("I/N"),
       "compute only the I-th of N contiguous blocks of the images and publish their records "
       "(combine the N folders with attnscope merge)");
}

namespace {

/// Empty when everything written to standard output reached it; else why not. A summary lost
/// to a full disk or a closed pipe is a failure, not a success with nothing said.
std::string stdout_failure() {
  errno = 0;
  std::cout.flush();
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && std::cout.good() && std::ferror(stdout) == 0) return {};
  int why = err;
  if (why == 0) {
    // The write failed earlier, inside the command, and errno has moved on since: the output is
    // lost already, so one more byte asks the system for the reason (a full disk says ENOSPC).
    std::clearerr(stdout);
    errno = 0;
    if (std::fputc('\n', stdout) == EOF || std::fflush(stdout) != 0) why = errno;
  }
  return std::string("standard output: cannot write: ") + (why != 0 ? std::strerror(why) : "write error");
}

}  // namespace

int run_guarded(const std::string& command, const std::function<int()>& body) {
  try {
    const int rc = body();
    std::string lost = stdout_failure();
    if (lost.empty()) {
      rc == 0 ? release_notes() : drop_notes();
      run::remove_journals();
      return rc;
    }
    drop_notes();
    // The summary is lost: the run failed, so its result sets are withdrawn (their files stay)
    // and its journals kept: --resume publishes the set again without computing.
    for (const std::filesystem::path& manifest : run::published_manifests()) {
      if (::unlink(manifest.c_str()) == 0) lost += "; withdrew the result set " + manifest.string();
    }
    run::published_manifests().clear();
    if (!run::journals_to_remove().empty()) lost += " (its journal is kept for --resume)";
    run::journals_to_remove().clear();
    return report(command, lost, rc == 0 ? kExitInput : rc);
  } catch (...) {
    drop_notes();
    const ExitStatus s = exit_status(std::current_exception());
    return s.message.empty() ? s.code : report(command, s.message, s.code);
  }
}

// ---------------------------------------------------------------------------------------------

struct Progress::Impl {
  using Clock = std::chrono::steady_clock;
  std::string label;
  std::size_t total = 0;
  bool tty = false;
  Clock::time_point start = Clock::now();
  std::atomic<std::size_t> done{0};
  std::atomic<long long> next_draw_ms{1000};  // nothing is drawn during the first second
  std::atomic<bool> drawn{false};
  std::atomic<bool> finished{false};
  std::mutex draw_mutex;

  long long elapsed_ms() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
  }

  void draw(std::size_t n, long long ms) {
    std::ostringstream line;
    line << "\r" << Progress::line(label, n, total, static_cast<double>(ms) / 1000.0);
    line << "\033[K";
    std::cerr << line.str() << std::flush;
    drawn = true;
  }
};

namespace {

/// "42s", "3m05s", "2h07m".
std::string duration_text(double seconds) {
  const auto s = static_cast<long long>(std::llround(seconds));
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%llds", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  }
  return buf;
}

}  // namespace

std::string Progress::line(const std::string& label, std::size_t done, std::size_t total,
                           double seconds) {
  constexpr int kWidth = 30;
  const double frac =
      total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
  const int filled = static_cast<int>(frac * kWidth);
  std::ostringstream line;
  line << label << " [" << std::string(static_cast<std::size_t>(filled), '#')
       << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << done << "/"
       << total << " " << static_cast<int>(frac * 100.0) << "%";
  if (done > 0 && seconds > 0) {
    const double rate = static_cast<double>(done) / seconds;
    line << " " << std::fixed << std::setprecision(rate < 10 ? 2 : rate < 100 ? 1 : 0) << rate
         << "/s";
    if (done < total) {
      line << " ETA " << duration_text(static_cast<double>(total - done) / rate);
    }
  }
  return line.str();
}

Progress::Progress(std::string label, std::size_t total) : impl_(new Impl) {
  impl_->label = std::move(label);
  impl_->total = total;
  impl_->tty = ::isatty(STDERR_FILENO) == 1;
  // ATTNSCOPE_PROGRESS=never turns the bar off; =always draws it from the first tick even when
  // stderr is not a terminal (for logs and for the CLI tests).
  if (const char* env = std::getenv("ATTNSCOPE_PROGRESS")) {
    const std::string mode(env);
    if (mode == "never") impl_->tty = false;
    if (mode == "always") {
      impl_->tty = true;
      impl_->next_draw_ms = 0;
    }
  }
}

Progress::~Progress() {
  finish();
  delete impl_;
}

void Progress::tick(std::size_t n) {
  Impl& p = *impl_;
  const std::size_t now_done = p.done.fetch_add(n) + n;
  if (!p.tty || p.finished) return;
  const long long ms = p.elapsed_ms();
  long long due = p.next_draw_ms.load();
  if (ms < due) return;
  // One thread draws; the others go back to work instead of waiting for the terminal.
  if (!p.next_draw_ms.compare_exchange_strong(due, ms + 100)) return;
  std::unique_lock lock(p.draw_mutex, std::try_to_lock);
  if (lock.owns_lock() && !p.finished) p.draw(now_done, ms);
}

void Progress::finish() {
  Impl& p = *impl_;
  if (p.finished.exchange(true)) return;
  std::lock_guard lock(p.draw_mutex);
  if (p.drawn) std::cerr << "\r\033[K" << std::flush;
}

}  // namespace attnscope::app
