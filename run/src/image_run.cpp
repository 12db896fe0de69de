#include "attnscope/run/image_run.hpp"

#include "attnscope/run/exit_status.hpp"
#include "attnscope/run/hash_tree.hpp"
#include "attnscope/run/mpi_world.hpp"
#include "attnscope/run/run_record.hpp"
#include "attnscope/run/result_set.hpp"
#include "attnscope/run/sha256.hpp"

#include "attnscope/error.hpp"
#include "attnscope/notes.hpp"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <set>

namespace attnscope::run {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kPartialDir = ".attnscope-partial";
/// Records sent from a rank to rank 0 travel in messages of about this many bytes.
constexpr std::size_t kMessageBytes = 4u << 20;

std::optional<MergeInput>& merge_input() {
  static std::optional<MergeInput> input;
  return input;
}

struct Block {
  std::size_t begin = 0, end = 0;
};

/// The k-th of n contiguous blocks of [begin, end).
Block block_of(Block whole, std::size_t k, std::size_t n) {
  const std::size_t m = whole.end - whole.begin;
  return {whole.begin + k * m / n, whole.begin + (k + 1) * m / n};
}

std::pair<int, int> parse_shard(const std::string& s) {
  const std::size_t slash = s.find('/');
  int i = -1, n = 0;
  bool ok = slash != std::string::npos;
  if (ok) {
    const char* a = s.data();
    const char* b = s.data() + slash;
    const char* e = s.data() + s.size();
    auto r1 = std::from_chars(a, b, i);
    auto r2 = std::from_chars(b + 1, e, n);
    ok = r1.ec == std::errc() && r1.ptr == b && r2.ec == std::errc() && r2.ptr == e && a != b &&
         b + 1 != e;
  }
  if (!ok || n < 1 || i < 0 || i >= n) {
    throw UsageError("--shard: expected I/N with 0 <= I < N (e.g. 0/4), found '" + s + "'");
  }
  return {i, n};
}

/// The arguments without --out, --resume and --shard (merge re-runs the command with these).
std::vector<std::string> kept_args(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (std::size_t k = 0; k < args.size(); ++k) {
    const std::string& a = args[k];
    if (a == "--resume" || a.rfind("--out=", 0) == 0 || a.rfind("--shard=", 0) == 0) continue;
    if (a == "--out" || a == "--shard") {
      ++k;
      continue;
    }
    out.push_back(a);
  }
  return out;
}

std::string sha256_of_ints(const std::vector<int>& v) {
  Sha256 h;
  for (int x : v) {
    const auto u = static_cast<std::uint32_t>(x);
    const unsigned char b[4] = {static_cast<unsigned char>(u), static_cast<unsigned char>(u >> 8),
                                static_cast<unsigned char>(u >> 16),
                                static_cast<unsigned char>(u >> 24)};
    h.update(b, 4);
  }
  return h.hex_digest();
}

/// Test hook, for the CLI tests of interrupted runs: ATTNSCOPE_TEST_KILL_AT=record:N sends
/// SIGKILL to the process right after its N-th record is journaled, finish after every record
/// is in and before any result file is written. Unset (always, outside tests), it does nothing.
void kill_hook(const std::string& point, std::size_t count = 0) {
  const char* env = std::getenv("ATTNSCOPE_TEST_KILL_AT");
  if (env == nullptr) return;
  const std::string want(env);
  const std::string here = point == "record" ? point + ":" + std::to_string(count) : point;
  if (want == here) ::raise(SIGKILL);
}

/// Under MPI with several ranks: shares the outcome of a step every rank took, and throws on
/// every rank when one failed (rank 0 with that rank's message, the others silently). With one
/// rank, rethrows the step's own exception. Before throwing, calls on_fail with the exit code.
void settle(std::exception_ptr ep, const std::function<void(int code)>& on_fail = {}) {
  if (mpi::size() == 1) {
    if (!ep) return;
    if (on_fail) on_fail(exit_status(ep).code);
    std::rethrow_exception(ep);
  }
  ExitStatus mine;
  if (ep) {
    mine = exit_status(ep);
    if (mine.message.empty()) mine.message = "failed";
  }
  const mpi::Outcome o = mpi::agree(mine.message, mine.code);
  if (o.message.empty()) return;
  const int code = o.code == 0 ? kExitInput : o.code;
  if (on_fail) on_fail(code);
  throw CodedExit(code, mpi::root() ? o.message : "");
}

}  // namespace

/// A plain run and an `mpirun -n R` run of one command publish the same files: each locks only
/// its own journals, so this checks (after taking its own lock, so that of two runs starting
/// together at least one sees the other) that no journal of the command with another layout is
/// locked by a live run. Shard runs publish files of their own and are not concerned.
void refuse_other_layouts_running(const fs::path& partial, const std::string& command) {
  const std::string mine = mpi::size() > 1 ? "-of-" + std::to_string(mpi::size()) + ".journal" : "";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(partial, ec)) {
    const std::string n = e.path().filename().string();
    const bool plain = n == command + ".journal";
    const bool ranks = n.rfind(command + ".rank-", 0) == 0 && n.size() > 8 &&
                       n.compare(n.size() - 8, 8, ".journal") == 0;
    if (!plain && !ranks) continue;
    if (plain ? mine.empty() : (!mine.empty() && n.size() >= mine.size() &&
                                n.compare(n.size() - mine.size(), mine.size(), mine) == 0)) {
      continue;  // this run's own journal(s)
    }
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const bool busy = ::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    ::close(fd);  // releases the probe's lock at once
    if (busy) {
      throw UsageError(e.path().string() + ": another attnscope run (" +
                       (plain ? std::string("one process") : "under mpirun") +
                       ") is writing this results folder; both would publish the same files");
    }
  }
}

json dump_fingerprint(const std::vector<std::string>& files) {
  // The whole file: a change anywhere (one image's q rescaled in place, a weights file edited in
  // the middle) must be seen by --resume and merge. Its 64 MiB chunks are hashed by the run's
  // threads at once (the value does not depend on how many), with XXH3-128: the check is against
  // accidental change, and SHA-256 took four times the loop's time on a 256-image run of a
  // 1024-image dump. Cost: docs/benchmarks.md.
  json out = json::array();
  for (const std::string& f : files) {
    std::uintmax_t bytes = 0;
    const std::string sum = hash_tree_file(f, TreeHash::xxh3_128, omp_get_max_threads(), &bytes);
    out.push_back({{"bytes", bytes}, {tree_hash_key(TreeHash::xxh3_128), sum}});
  }
  return out;
}

json run_fingerprint(const std::string& command, const std::vector<std::string>& dumps,
                     const json& params) {
  json p = params;
  p.erase("threads");
  p.erase("device");
  return {{"command", command}, {"version", ATTNSCOPE_VERSION}, {"dumps", dump_fingerprint(dumps)},
          {"parameters", p}};
}

void set_merge_input(std::optional<MergeInput> input) { merge_input() = std::move(input); }

struct ImageRun::Impl {
  std::string command;
  fs::path out_dir;
  json run;  ///< command, fingerprint, selection: what every journal of the run shares
  std::vector<std::string> args;  ///< the command's arguments, for merge
  std::vector<int> selection;
  int shard = 0, shards = 1;
  bool shard_mode = false;
  Block shard_block, rank_block;
  std::unique_ptr<JournalWriter> journal;
  std::size_t recorded = 0;  ///< records of this process's share in the journal
  std::chrono::steady_clock::time_point last_sync = std::chrono::steady_clock::now();
  bool merging = false;

  /// Checks that `rec` is the record of image position `pos` of the selection; returns the image.
  int expect(const json& rec, std::size_t pos, const std::string& where) const {
    const int want = selection[pos];
    if (!rec.is_object() || !rec.contains("image") || !rec["image"].is_number_integer() ||
        rec["image"].get<int>() != want || !rec.contains("record")) {
      throw Error(where + ": record " + std::to_string(pos) + " is not image " +
                  std::to_string(want) + "'s: the journal does not belong to this run");
    }
    return want;
  }

  /// A failed run keeps its journal, so that --resume continues it (after a full disk, a lost
  /// node, an interrupt), unless it holds no record, or the run failed for want of anything to
  /// measure: then every record is in and running again fails again.
  void keep_journal_after_failure(int code) {
    if (journal && (recorded == 0 || code == kExitNothingToMeasure)) journal->remove();
  }

  /// Applies the records of journal `p`, which must be exactly those of block `b`, in order (its
  /// header was checked when the run was set up).
  void apply_journal(const fs::path& p, Block b, const ApplyFn& apply) {
    std::size_t pos = b.begin;
    read_journal(
        p, [](const json&) {},
        [&](json&& rec) {
          if (pos >= b.end) throw Error(p.string() + ": more records than its block holds");
          apply(expect(rec, pos, p.string()), rec["record"]);
          ++pos;
        });
    if (pos != b.end) {
      throw Error(p.string() + ": holds " + std::to_string(pos - b.begin) + " of its " +
                  std::to_string(b.end - b.begin) + " images' records");
    }
  }
};

ImageRun::ImageRun(const RunControl& control, const std::string& command,
                   const std::vector<std::string>& args, const fs::path& out_dir,
                   json fingerprint, const std::vector<int>& selection)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.command = command;
  m.out_dir = out_dir;
  m.selection = selection;
  m.run = {{"command", command}, {"fingerprint", std::move(fingerprint)},
           {"images", selection.size()}, {"images_sha256", sha256_of_ints(selection)}};
  m.args = kept_args(args);
  if (!control.shard.empty()) {
    std::tie(m.shard, m.shards) = parse_shard(control.shard);
    m.shard_mode = true;
  }
  const Block all{0, selection.size()};
  m.shard_block = block_of(all, static_cast<std::size_t>(m.shard), static_cast<std::size_t>(m.shards));
  m.rank_block = block_of(m.shard_block, static_cast<std::size_t>(mpi::rank()),
                          static_cast<std::size_t>(mpi::size()));

  if (merge_input()) {
    if (mpi::size() > 1) throw UsageError("merge runs as one process, not under MPI");
    m.merging = true;
    for (std::size_t k = 0; k < merge_input()->headers.size(); ++k) {
      const std::string diff = header_difference(m.run, merge_input()->headers[k].value("run", json()));
      if (!diff.empty()) {
        throw UsageError(merge_input()->journals[k].string() +
                         ": a shard of a different run than the dump and flags give now (" +
                         diff + ")");
      }
    }
    return;  // nothing to compute
  }

  // The journal of this process: the command's, the shard's and the rank's (of this layout).
  std::string layout = command;
  if (m.shard_mode) {
    layout += ".shard-" + std::to_string(m.shard) + "-of-" + std::to_string(m.shards);
  }
  const auto rank_name = [&layout](int rank) {
    return mpi::size() > 1
               ? layout + ".rank-" + std::to_string(rank) + "-of-" + std::to_string(mpi::size())
               : layout;
  };
  const std::string name = rank_name(mpi::rank());
  json header = {{"run", m.run},
                 {"args", m.args},
                 {"shard", {m.shard, m.shards}},
                 {"ranks", {mpi::rank(), mpi::size()}},
                 {"block", {m.rank_block.begin, m.rank_block.end}}};
  std::exception_ptr ep;
  try {
    m.journal = std::make_unique<JournalWriter>(
        out_dir / kPartialDir / (name + ".journal"), header, control.resume, [&m](json&& rec) {
          const std::size_t pos = m.rank_block.begin + m.recorded;
          if (pos >= m.rank_block.end) throw Error("journal: more records than this run's images");
          m.expect(rec, pos, "--resume");
          ++m.recorded;
        });
    if (!m.shard_mode && mpi::root()) refuse_other_layouts_running(out_dir / kPartialDir, command);
  } catch (...) {
    ep = std::current_exception();
  }
  settle(ep);
  if (m.journal->discarded_previous()) {
    hold_note("attnscope " + command + ": note: started over; the interrupted run's journal " +
              m.journal->path().string() + " was discarded (--resume continues one)");
  }
  if (control.resume && m.recorded == 0 && mpi::root()) {
    // Journals of this command written with another number of ranks or another shard are not
    // this run's: say so rather than start over silently.
    // Every rank's journal of this layout is this run's own (rank 0's may hold nothing while
    // another rank's holds records: more ranks than images, or a rank that started first).
    std::set<std::string> own;
    for (int r = 0; r < mpi::size(); ++r) own.insert(rank_name(r) + ".journal");
    std::vector<std::string> others;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(out_dir / kPartialDir, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind(command + ".", 0) == 0 && own.count(n) == 0) others.push_back(n);
    }
    if (!others.empty()) {
      std::sort(others.begin(), others.end());
      hold_note("attnscope " + command + ": note: --resume found no journal of this run's layout (" +
                name + ".journal) but " + others.front() + (others.size() > 1 ? " and others" : "") +
                ", written with another number of ranks or shards; starting from the first image "
                "(rerun with that layout to continue it)");
    }
  }
  pending_.assign(selection.begin() + static_cast<std::ptrdiff_t>(m.rank_block.begin + m.recorded),
                  selection.begin() + static_cast<std::ptrdiff_t>(m.rank_block.end));
}

ImageRun::~ImageRun() = default;

void ImageRun::compute(const std::function<void()>& fn) {
  std::exception_ptr ep;
  try {
    if (!pending_.empty()) fn();
    if (impl_->journal) {
      impl_->journal->sync();
      const std::size_t want = impl_->rank_block.end - impl_->rank_block.begin;
      if (impl_->recorded != want) {
        throw Error("internal: " + std::to_string(impl_->recorded) + " of " + std::to_string(want) +
                    " images were recorded");
      }
    }
  } catch (...) {
    ep = std::current_exception();
  }
  settle(ep, [this](int code) { impl_->keep_journal_after_failure(code); });
}

void ImageRun::record(int image, const json& rec) {
  Impl& m = *impl_;
  const std::size_t pos = m.rank_block.begin + m.recorded;
  if (!m.journal || pos >= m.rank_block.end || m.selection[pos] != image) {
    throw Error("internal: image " + std::to_string(image) + " recorded out of order");
  }
  m.journal->append({{"image", image}, {"record", rec}});
  ++m.recorded;
  kill_hook("record", m.recorded);
  const auto now = std::chrono::steady_clock::now();
  if (now - m.last_sync > std::chrono::seconds(10)) {
    m.journal->sync();
    m.last_sync = now;
  }
}

bool ImageRun::finish(const ApplyFn& apply, const std::function<void()>& publish) {
  Impl& m = *impl_;
  if (m.merging) {
    const auto& in = *merge_input();
    for (std::size_t k = 0; k < in.journals.size(); ++k) {
      m.apply_journal(in.journals[k], block_of({0, m.selection.size()}, k, in.journals.size()),
                      apply);
    }
    publish();
    return true;
  }

  kill_hook("finish");
  // Every step of rank 0 runs guarded: after a failure it still drains the other ranks'
  // messages (they would wait in their sends forever), then the outcome is shared.
  std::exception_ptr ep;
  auto guarded = [&ep](const std::function<void()>& step) {
    if (ep) return;
    try {
      step();
    } catch (...) {
      ep = std::current_exception();
    }
  };
  if (mpi::root()) {
    // A shard's rank 0 writes the shard's records, in order, as its result set.
    std::unique_ptr<ResultSet> shard_set;
    std::unique_ptr<ResultFile> shard_file;
    std::vector<char> frames;
    const std::string stem = m.command + ".shard-" + std::to_string(m.shard) + "-of-" +
                             std::to_string(m.shards);
    ApplyFn sink = apply;
    guarded([&] {
      if (m.shard_mode) {
        shard_set = std::make_unique<ResultSet>(m.out_dir, stem + ".json");
        shard_file = std::make_unique<ResultFile>(*shard_set, stem + ".journal");
        shard_file->stream() << "attnscope journal 1\n";
        append_frame(frames, {{"run", m.run},
                              {"args", m.args},
                              {"shard", {m.shard, m.shards}},
                              {"block", {m.shard_block.begin, m.shard_block.end}}});
        sink = [&](int image, const json& rec) {
          append_frame(frames, {{"image", image}, {"record", rec}});
          if (frames.size() >= kMessageBytes) {
            shard_file->stream().write(frames.data(), static_cast<std::streamsize>(frames.size()));
            frames.clear();
          }
        };
      }
      m.apply_journal(m.journal->path(), m.rank_block, sink);
    });
    for (int r = 1; r < mpi::size(); ++r) {
      const Block b = block_of(m.shard_block, static_cast<std::size_t>(r),
                               static_cast<std::size_t>(mpi::size()));
      std::size_t pos = b.begin;
      const std::string where = "records of rank " + std::to_string(r);
      for (;;) {
        const std::vector<char> msg = mpi::recv_bytes(r);
        if (msg.empty()) break;
        guarded([&] {
          const std::size_t used = parse_frames(msg.data(), msg.size(), where, 0, [&](json&& rec) {
            if (pos >= b.end) throw Error(where + ": more records than its block holds");
            sink(m.expect(rec, pos, where), rec["record"]);
            ++pos;
          });
          if (used != msg.size()) throw Error(where + ": a message cut short");
        });
      }
      guarded([&] {
        if (pos != b.end) throw Error(where + ": incomplete");
      });
    }
    guarded([&] {
      if (!m.shard_mode) {
        publish();
        return;
      }
      shard_file->stream().write(frames.data(), static_cast<std::streamsize>(frames.size()));
      shard_file->close();
      RunMetadata meta(m.command);
      meta.params() = {{"shard", {m.shard, m.shards}},
                       {"block", {m.shard_block.begin, m.shard_block.end}}};
      meta.results() = {{"images", m.shard_block.end - m.shard_block.begin}};
      meta.publish(*shard_set);
    });
  } else {
    guarded([&] {
      std::vector<char> frames;
      read_journal(m.journal->path(), [](const json&) {}, [&](json&& rec) {
        append_frame(frames, rec);
        if (frames.size() >= kMessageBytes) {
          mpi::send_bytes(0, frames);
          frames.clear();
        }
      });
      if (!frames.empty()) mpi::send_bytes(0, frames);
    });
    mpi::send_bytes(0, {});  // the end of this rank's records, sent whatever happened
  }
  settle(ep, [&m](int code) { m.keep_journal_after_failure(code); });
  m.journal->remove_when_reported();
  return mpi::root() && !m.shard_mode;
}

}  // namespace attnscope::run
