// attnscope merge: folds the result sets of `--shard I/N` runs into the files one plain run writes.
#include "command.hpp"
#include "common.hpp"
#include "attnscope/run/image_run.hpp"
#include "attnscope/run/journal.hpp"
#include "attnscope/run/sha256.hpp"

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <set>

namespace attnscope::app {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Shard {
  fs::path journal;
  json header;
  int index = 0, count = 0;
};

/// Checks that every file a shard's manifest lists has its size and checksum (a shard set
/// that a kill left incomplete is refused).
void verify_manifest(const fs::path& manifest) {
  std::ifstream in(manifest);
  const json j = in ? json::parse(in, nullptr, false) : json();
  if (j.is_discarded() || !j.is_object() || !j.contains("files") || !j["files"].is_array()) {
    throw InputError(manifest.string(), "manifest", "the JSON record of a shard run", "unreadable");
  }
  for (std::size_t i = 0; i < j["files"].size(); ++i) {
    const json& f = j["files"][i];
    // Each entry checked for its types before it is read: json's own conversion errors name no file.
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("sha256") || !f["sha256"].is_string()) {
      throw InputError(manifest.string(), "files[" + std::to_string(i) + "]",
                       "an object with a string 'name', an unsigned 'bytes' and a string 'sha256'",
                       f.dump(-1, ' ', false, json::error_handler_t::replace).substr(0, 80));
    }
    const fs::path p = manifest.parent_path() / f["name"].get<std::string>();
    std::uintmax_t bytes = 0;
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) {
      throw InputError(p.string(), "shard file", "the file its manifest lists", "missing");
    }
    const std::string sum = sha256_file(p, &bytes);
    if (bytes != f["bytes"].get<std::uintmax_t>() || sum != f["sha256"].get<std::string>()) {
      throw InputError(p.string(), "shard file", "the size and SHA-256 its manifest lists",
                       "a different file (changed after the shard was published)");
    }
  }
}

std::vector<Shard> find_shards(const std::vector<std::string>& dirs) {
  static const std::regex pattern(R"(([a-z]+)\.shard-([0-9]+)-of-([0-9]+)\.json)");
  std::vector<Shard> shards;
  std::set<fs::path> seen;
  for (const std::string& d : dirs) {
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(d, ec);
    if (!fs::is_directory(dir, ec)) {
      throw InputError(d, "shard folder", "a folder written by a --shard run", "not a folder");
    }
    if (!seen.insert(dir).second) continue;
    std::vector<fs::path> manifests;
    for (const auto& e : fs::directory_iterator(dir)) {
      std::smatch mt;
      const std::string n = e.path().filename().string();
      if (std::regex_match(n, mt, pattern)) manifests.push_back(e.path());
    }
    if (manifests.empty()) {
      throw InputError(d, "shard folder", "the result set of a --shard I/N run (NAME.shard-I-of-N.json)",
                       "none");
    }
    std::sort(manifests.begin(), manifests.end());
    for (const fs::path& m : manifests) {
      verify_manifest(m);
      Shard s;
      s.journal = m;
      s.journal.replace_extension(".journal");
      s.header = read_journal_header(s.journal);
      const json* shard = s.header.is_object() && s.header.contains("shard") ? &s.header["shard"] : nullptr;
      if (shard == nullptr || !shard->is_array() || shard->size() != 2 || !(*shard)[0].is_number_integer() ||
          !(*shard)[1].is_number_integer() || !s.header.contains("run") || !s.header.contains("args") ||
          !s.header["args"].is_array()) {
        throw InputError(s.journal.string(), "header", "the header of a --shard I/N run", "another record");
      }
      s.index = (*shard)[0].get<int>();
      s.count = (*shard)[1].get<int>();
      shards.push_back(std::move(s));
    }
  }
  return shards;
}

int run_merge_cmd(const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string out;
  po::options_description desc("options");
  desc.add_options()
      ("dir", po::value(&dirs)->multitoken()->value_name("DIR..."),
       "folders holding the shards' result sets (positional)")
      ("out", po::value(&out)->value_name("DIR"),
       "results folder for the merged run (default: results/<command>)");
  po::positional_options_description pos;
  pos.add("dir", -1);
  po::variables_map vm;
  if (!parse_args("merge", "DIR... [--out DIR]", desc, args, vm, &pos)) return 0;
  if (dirs.empty()) throw UsageError("merge: name the folders of the shards' runs");

  std::vector<Shard> shards = find_shards(dirs);
  const json& run = shards.front().header.at("run");
  const int n = shards.front().count;
  std::map<int, const Shard*> by_index;
  for (const Shard& s : shards) {
    const std::string diff = header_difference(run, s.header.at("run"));
    if (!diff.empty()) {
      throw UsageError(s.journal.string() + ": a shard of a different run than " +
                       shards.front().journal.string() + " (" + diff + ")");
    }
    if (s.count != n) {
      throw UsageError(s.journal.string() + ": shard of " + std::to_string(s.count) +
                       ", the others are of " + std::to_string(n));
    }
    if (!by_index.emplace(s.index, &s).second) {
      throw UsageError("shard " + std::to_string(s.index) + "/" + std::to_string(n) +
                       " is given twice: " + by_index[s.index]->journal.string() + " and " +
                       s.journal.string());
    }
  }
  for (int i = 0; i < n; ++i) {
    if (by_index.count(i) == 0) {
      throw UsageError("shard " + std::to_string(i) + "/" + std::to_string(n) +
                       " is missing: merge needs all " + std::to_string(n) + " shards");
    }
  }
  const std::string command = run.at("command").get<std::string>();
  auto it = command_table().find(command);
  if (it == command_table().end() || !it->second.over_images) {
    throw InputError(shards.front().journal.string(), "run.command", "an analysis over images",
                     command);
  }
  MergeInput input;
  for (int i = 0; i < n; ++i) {
    input.journals.push_back(by_index[i]->journal);
    input.headers.push_back(by_index[i]->header);
  }
  std::vector<std::string> cmd_args = shards.front().header.at("args").get<std::vector<std::string>>();
  cmd_args.push_back("--out");
  cmd_args.push_back(out.empty() ? "results/" + command : out);
  set_merge_input(std::move(input));
  struct Reset {
    ~Reset() { set_merge_input(std::nullopt); }
  } reset;
  return it->second.run(cmd_args);
}

const CommandRegistration kRegistration{
    {"merge", "combine the result sets of --shard I/N runs into the files of one plain run",
     run_merge_cmd}};

}  // namespace
}  // namespace attnscope::app
