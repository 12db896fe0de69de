// attnscope verify: every proposition and identity of both papers checked by numbers, one report
// row each; exit code 3 when any row fails. Measured times are information, never a row.
#include "command.hpp"
#include "common.hpp"

#include "attnscope/analyses/propositions.hpp"
#include "attnscope/error.hpp"

#include <cmath>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace attnscope::app {
namespace {

struct VerifyFlags {
  CommonOptions common;
  analyses::VerifyOptions opt;
  bool json = false;
  bool no_timing = false;
  int timing_max_n = 4096;
};

po::options_description verify_options(VerifyFlags& f) {
  po::options_description d("options");
  add_out_option(d, f.common, "results/verify");
  d.add_options()("trials", po::value(&f.opt.trials)->value_name("N")->default_value(f.opt.trials),
                  "random trials per check")(
      "json", po::bool_switch(&f.json), "print the report as JSON on stdout instead of a table")(
      "no-timing", po::bool_switch(&f.no_timing),
      "skip the timing of the linear-time and explicit forms (information only)")(
      "timing-max-n", po::value(&f.timing_max_n)->value_name("N")->default_value(f.timing_max_n),
      "largest N of the cost measurement (N = 64, 128, ... up to this)")(
      "timing-repeats",
      po::value(&f.opt.timing_repeats)->value_name("R")->default_value(f.opt.timing_repeats),
      "timed runs per size (the best is kept)");
  add_threads_option(d, f.common);
  add_device_option(d, f.common);
  add_seed_option(d, f.common);
  return d;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string number(double x) {
  std::ostringstream s;
  s << std::setprecision(6) << x;
  return s.str();
}

std::string condition(const analyses::CheckRow& r) {
  return (r.sense == analyses::CheckRow::Sense::Above ? "> " : "<= ") + number(r.threshold);
}

void write_csv(ResultSet& set, const std::vector<analyses::CheckRow>& rows) {
  ResultFile f(set, "verify.csv");
  f.stream() << "check,what,trials,margin,threshold,result\n";
  for (const auto& r : rows) {
    f.stream() << csv_field(r.check) << "," << csv_field(r.what) << "," << r.trials << ","
               << std::setprecision(17) << r.margin << "," << csv_field(condition(r)) << ","
               << r.result() << "\n";
  }
  f.close();
}

nlohmann::json to_json(const std::vector<analyses::CheckRow>& rows) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& r : rows) {
    // JSON has no infinity: a margin that is not finite is written as null.
    j.push_back({{"check", r.check},
                 {"what", r.what},
                 {"trials", r.trials},
                 {"unusable_trials", r.unusable},
                 {"margin", std::isfinite(r.margin) ? nlohmann::json(r.margin) : nlohmann::json()},
                 {"threshold", r.threshold},
                 {"sense", r.sense == analyses::CheckRow::Sense::Above ? "above" : "below"},
                 {"result", r.result()}});
  }
  return j;
}

void write_timings(ResultSet& set, const std::vector<analyses::FormTiming>& ts) {
  ResultFile f(set, "verify_timing.csv");
  f.stream() << "variant,n,dim,linear_time_s,explicit_s\n" << std::setprecision(6);
  for (const auto& t : ts) {
    for (std::size_t i = 0; i < t.sizes.size(); ++i) {
      f.stream() << t.variant << "," << t.sizes[i] << "," << t.dim << "," << t.linear_s[i] << ","
                 << t.explicit_s[i] << "\n";
    }
  }
  f.close();
}

void print_table(const std::vector<analyses::CheckRow>& rows) {
  std::cout << std::left << std::setw(40) << "check" << std::setw(8) << "trials" << std::setw(14)
            << "margin" << std::setw(12) << "threshold" << std::setw(8) << "result"
            << "what\n";
  for (const auto& r : rows) {
    std::cout << std::setw(40) << r.check << std::setw(8) << r.trials << std::setw(14)
              << number(r.margin) << std::setw(12) << condition(r) << std::setw(8) << r.result()
              << r.what << "\n";
    if (r.unusable > 0) {
      std::cout << "    " << r.unusable << " of " << r.trials
                << " trials found no draw meeting the check's hypothesis: nothing was measured "
                   "there\n";
    }
  }
}

/// Fitted exponents of the measured times: what this machine did, not a check.
nlohmann::json timing_info(const std::vector<analyses::FormTiming>& ts) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& t : ts) {
    j.push_back({{"variant", t.variant},
                 {"linear_time_exponent", t.linear_fit.exponent},
                 {"explicit_exponent", t.explicit_fit.exponent}});
  }
  return j;
}

void print_timing_info(const std::vector<analyses::FormTiming>& ts) {
  if (ts.empty()) return;
  std::cout << "info, not checked (CPU time on this machine, one thread; verify_timing.csv):\n";
  for (const auto& t : ts) {
    std::cout << "  " << t.variant << ": fitted exponent of N " << number(t.linear_fit.exponent)
              << " (linear-time), " << number(t.explicit_fit.exponent)
              << " (explicit), N = " << t.sizes.front() << ".." << t.sizes.back() << "\n";
  }
}

int run_verify_cmd(const std::vector<std::string>& args) {
  VerifyFlags f;
  const po::options_description desc = verify_options(f);
  po::variables_map vm;
  if (!parse_args("verify", "[options]", desc, args, vm)) return 0;
  if (f.opt.trials < 1)
    throw UsageError("--trials must be >= 1, got " + std::to_string(f.opt.trials));
  if (f.opt.timing_repeats < 1) throw UsageError("--timing-repeats must be >= 1");
  if (f.timing_max_n < 128) throw UsageError("--timing-max-n must be >= 128 (two sizes to fit)");
  f.opt.seed = f.common.seed;
  f.opt.timing = !f.no_timing;
  f.opt.timing_sizes.clear();
  for (int n = 64; n <= f.timing_max_n; n *= 2) f.opt.timing_sizes.push_back(n);
  const int threads = apply_threads(f.common.threads);
  const ResolvedDevice device = apply_device("verify", f.common, false);
  const std::filesystem::path dir = ensure_out_dir(f.common.out);

  ResultSet set(dir, "verify.json");
  RunMetadata meta("verify");
  meta.params() = {{"seed", f.opt.seed},
                   {"trials", f.opt.trials},
                   {"work_sizes", f.opt.work_sizes},
                   {"work_dim", f.opt.work_dim},
                   {"timing", f.opt.timing},
                   {"timing_sizes", f.opt.timing_sizes},
                   {"timing_dim", f.opt.timing_dim},
                   {"timing_repeats", f.opt.timing_repeats},
                   {"threads", threads}};
  meta.params()["device"] = device.description;
  std::vector<analyses::FormTiming> timings;
  f.opt.timings = &timings;
  const std::vector<analyses::CheckRow> rows = analyses::verify_all(f.opt);
  long failed = 0;
  for (const auto& r : rows) failed += r.pass ? 0 : 1;
  write_csv(set, rows);
  if (f.opt.timing) write_timings(set, timings);
  meta.results() = {{"rows", to_json(rows)},
                    {"checks", rows.size()},
                    {"failed", failed},
                    {"timing_info", timing_info(timings)}};
  meta.publish(set);
  if (f.json) {
    std::cout << nlohmann::json{{"rows", to_json(rows)},
                                {"failed", failed},
                                {"timing_info", timing_info(timings)}}
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    print_table(rows);
    print_timing_info(timings);
    std::cout << rows.size() - static_cast<std::size_t>(failed) << " of " << rows.size()
              << " checks passed\n";
  }
  return failed == 0 ? 0 : kExitCheckFailed;
}

const CommandRegistration kRegistration{
    {"verify", "check the papers' propositions and identities by numbers (PASS/FAIL table)",
     run_verify_cmd}};

}  // namespace
}  // namespace attnscope::app
