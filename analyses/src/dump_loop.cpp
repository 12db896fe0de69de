// Streaming over a dump: a reader thread fills a bounded queue of image buffers while OpenMP
// threads compute the heads of the image at its head. Only the reader thread touches the reader
// during the loop; the buffers are allocated once and reused (the model's own attn and out, when
// asked for, are read with their image), so memory is set by the budget, not by the dump.
#include "attnscope/analyses/dump_loop.hpp"

#include "attnscope/dump_family_params.hpp"
#include "attnscope/error.hpp"
#include "attnscope/notes.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/text.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <thread>
#include <utility>

namespace attnscope::analyses {

namespace {

void fill_or_check(std::vector<int>& idx, int count, const char* what) {
  if (idx.empty()) {
    idx.resize(static_cast<std::size_t>(count));
    std::iota(idx.begin(), idx.end(), 0);
    return;
  }
  for (int i : idx) {
    if (count == 0) {
      throw UsageError(std::string(what) + " index " + std::to_string(i) + " out of range: the dump has no " +
                       what + "s");
    }
    if (i < 0 || i >= count) {
      throw UsageError(std::string(what) + " index " + std::to_string(i) + " out of range: the dump has " +
                       std::to_string(count) + " " + what + "s (0-" + std::to_string(count - 1) + ")");
    }
  }
}

int parse_int(std::string_view text, const std::string& flag) {
  int value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || text.empty()) {
    throw UsageError(flag + ": expected an index or a range like 0-9, found '" + std::string(text) + "'");
  }
  return value;
}

/// Applies the selection's transform to every selected head of an image (serially: the
/// transform may draw its parameters lazily).
std::vector<MatF> transform_queries(const ImageQKV& img, const Selection& sel) {
  std::vector<MatF> out;
  if (sel.transform.is_identity()) return out;
  out.reserve(sel.layers.size() * sel.heads.size());
  for (std::size_t slot = 0; slot < sel.layers.size(); ++slot) {
    for (int h : sel.heads) {
      const MatF& q = img.Q(static_cast<int>(slot), h);
      out.push_back(q.size() == 0 ? MatF() : sel.transform.apply<float>(q));
    }
  }
  return out;
}

/// One image in flight: its Q, K, V and, when the selection asks for them, the model's own
/// tensors of each selected (layer, head), indexed like ImageQKV::q (empty when not asked for).
struct ImageBuffer {
  const DumpSchema* schema = nullptr;
  ImageQKV qkv;
  std::vector<std::optional<MatF>> attn, out;
  /// Each selected (layer, head)'s family parameters, indexed like ImageQKV::q (null: none).
  std::vector<std::shared_ptr<const FamilyParams>> params;
};

/// The family parameters of one selected layer (dump_family_params.hpp), read before the loop:
/// its /layers/L/family_params per head, and whether it has per-image agents.
struct LayerFamilyData {
  std::vector<FamilyParam> params;
  bool agents = false;
  [[nodiscard]] bool empty() const { return params.empty() && !agents; }
};

/// The family data of every selected layer, indexed by slot; empty when no layer has any.
std::vector<LayerFamilyData> read_layer_family_data(const DumpSchema& s,
                                                    const std::vector<int>& layers) {
  std::vector<LayerFamilyData> out(layers.size());
  bool any = false;
  const std::string& file = s.files.empty() ? s.path : s.files.front();
  for (std::size_t slot = 0; slot < layers.size(); ++slot) {
    const int layer = layers[slot];
    const int heads = s.geometry(layer).num_heads;
    for (const std::string& name : family_param_names(file, layer)) {
      out[slot].params.push_back(read_family_param(file, layer, name, heads));
    }
    out[slot].agents = has_layer_agents(file, layer);
    any = any || !out[slot].empty();
    // A layer whose own family needs data the file lacks is a faulty dump: say which, and where.
    const Variant own = s.layer_variant(layer);
    for (std::string_view need : own.family->params(own)) {
      const bool found = need == "agents"
                             ? out[slot].agents
                             : std::any_of(out[slot].params.begin(), out[slot].params.end(),
                                           [&](const FamilyParam& p) { return p.name == need; });
      if (found) continue;
      const std::string object =
          "/layers/" + std::to_string(layer) +
          (need == "agents" ? "/agents" : "/family_params/" + std::string(need));
      throw InputError(file, object,
                       "the layer's family parameter " + std::string(need) + " of " + own.name() +
                           " (docs/dump-format.md, \"Family parameters\")",
                       "none");
    }
  }
  if (!any) out.clear();
  return out;
}

/// Binds each selected head's family parameters of one image (the layers' and the image's agents).
void read_family_params(const DumpSchema& s, const Selection& sel,
                        const std::vector<LayerFamilyData>& data, int image, ImageBuffer& buf) {
  buf.params.assign(sel.layers.size() * static_cast<std::size_t>(buf.qkv.heads), nullptr);
  if (data.empty()) return;
  for (std::size_t slot = 0; slot < sel.layers.size(); ++slot) {
    const LayerFamilyData& layer = data[slot];
    if (layer.empty()) continue;
    const LayerGeometry g = s.geometry(sel.layers[slot]);
    std::vector<MatD> agents;
    if (layer.agents) {
      const auto [file, index] = s.image_file(image);
      agents = read_layer_agents(*file, sel.layers[slot], index, g.num_heads, g.head_dim);
    }
    for (int h = 0; h < g.num_heads; ++h) {
      auto p = std::make_shared<FamilyParams>();
      for (const FamilyParam& fp : layer.params)
        p->values[fp.name] = fp.per_head[static_cast<std::size_t>(h)];
      if (!agents.empty()) p->values["agents"] = agents[static_cast<std::size_t>(h)];
      buf.params[slot * static_cast<std::size_t>(buf.qkv.heads) + static_cast<std::size_t>(h)] =
          std::move(p);
    }
  }
}

/// Reads one image into `buf`; with `defer`, the blocks read straight from the file are left
/// for the computing threads (ImageQKV::read_deferred_into, before each head).
void read_image(DumpReader& reader, const Selection& sel,
                const std::vector<LayerFamilyData>& family_data, int image, ImageBuffer& buf,
                bool defer) {
  reader.read_image_into(buf.qkv, image, sel.layers, sel.need_v, defer);
  buf.schema = &reader.schema();
  read_family_params(reader.schema(), sel, family_data, image, buf);
  buf.attn.clear();
  buf.out.clear();
  if (!sel.need_model_tensors) return;
  const DumpSchema& s = reader.schema();
  for (int layer : sel.layers) {
    const int heads = s.geometry(layer).num_heads;
    for (int h = 0; h < buf.qkv.heads; ++h) {
      const auto l = static_cast<std::size_t>(layer);
      if (h >= heads) {
        buf.attn.emplace_back();
        buf.out.emplace_back();
        continue;
      }
      buf.attn.push_back(s.layer_has_attn[l] ? reader.read_attn(image, layer, h) : std::nullopt);
      buf.out.push_back(s.layer_has_out[l] ? reader.read_out(image, layer, h) : std::nullopt);
    }
  }
}

const MatF* model_tensor(const std::vector<std::optional<MatF>>& t, std::size_t index) {
  return index < t.size() && t[index] ? &*t[index] : nullptr;
}

/// The heads of an image as views into its buffer (and into `transformed`, the selection's
/// transformed queries of that image, which must outlive the views); each head's slot in the
/// image goes to `slots` when given.
ImageHeads image_heads(const ImageBuffer& buf, const Selection& sel, const std::vector<MatF>& transformed,
                       std::vector<int>* slots = nullptr) {
  const ImageQKV& img = buf.qkv;
  const int n_heads = static_cast<int>(sel.heads.size());
  const int n_items = static_cast<int>(sel.layers.size()) * n_heads;
  ImageHeads out;
  out.reserve(static_cast<std::size_t>(n_items));
  for (int item = 0; item < n_items; ++item) {
    const int slot = item / n_heads;
    const int head = sel.heads[static_cast<std::size_t>(item % n_heads)];
    const int layer = img.layers[static_cast<std::size_t>(slot)];
    // the head's own (CSwin's stripes: the second stripe shape's heads have their own windows)
    const LayerGeometry& geo =
        buf.schema->layer_geometry[static_cast<std::size_t>(layer)].for_head(head);
    if (head >= geo.num_heads) continue;  // a layer with fewer heads than the selection's
    const MatF& raw = img.Q(slot, head);
    const MatF& q = transformed.empty() ? raw : transformed[static_cast<std::size_t>(item)];
    const auto stored = static_cast<std::size_t>(slot * img.heads + head);
    if (slots != nullptr) slots->push_back(slot);
    out.push_back(HeadView{
        img.image, layer, head, q, img.K(slot, head), img.V(slot, head), &raw,
        model_tensor(buf.attn, stored), model_tensor(buf.out, stored), &geo,
        sel.own_variants.empty() ? nullptr : &sel.own_variants[static_cast<std::size_t>(layer)],
        stored < buf.params.size() ? buf.params[stored] : nullptr});
  }
  return out;
}

/// Asks for a head's q and k in this core's second-level cache (a hint: nothing waits, nothing
/// changes if the head is computed elsewhere). The reader thread wrote them on another core; a
/// thread that starts a head otherwise waits for every line of them at its first pass over q and
/// k (about a tenth of a DeiT-T head's time). Called for the head this thread is likely to take
/// next, `threads` heads on, while it computes the current one.
void prefetch_head(const ImageHeads& heads, std::size_t at) {
  if (at >= heads.size()) return;
  for (const MatF* m : {&heads[at].q, &heads[at].k}) {
    const char* p = reinterpret_cast<const char*>(m->data());
    const std::size_t bytes = static_cast<std::size_t>(m->size()) * sizeof(float);
    for (std::size_t line = 0; line < bytes; line += 64) __builtin_prefetch(p + line, 0, 2);
  }
}

void compute_image(const ImageBuffer& buf, const Selection& sel,
                   const std::function<void(const HeadView&)>& fn) {
  const std::vector<MatF> transformed = transform_queries(buf.qkv, sel);
  const ImageHeads heads = image_heads(buf, sel, transformed);
  parallel_for(static_cast<int>(heads.size()), [&](int item) {
    const auto at = static_cast<std::size_t>(item);
    prefetch_head(heads, at + static_cast<std::size_t>(omp_get_num_threads()));
    fn(heads[at]);
  });
}

}  // namespace

void check_family_data(const DumpSchema& schema) {
  std::vector<int> every(static_cast<std::size_t>(schema.attrs.num_layers));
  for (int l = 0; l < schema.attrs.num_layers; ++l) every[static_cast<std::size_t>(l)] = l;
  (void)read_layer_family_data(schema, every);
}

Selection resolve(const DumpSchema& schema, Selection sel) {
  fill_or_check(sel.images, schema.num_images, "image");
  fill_or_check(sel.layers, schema.attrs.num_layers, "layer");
  fill_or_check(sel.heads, schema.max_heads(), "head");
  if (!sel.own_variants.empty() &&
      sel.own_variants.size() != static_cast<std::size_t>(schema.attrs.num_layers)) {
    throw UsageError("each layer's own variant: " + std::to_string(sel.own_variants.size()) +
                     " variants for the " + std::to_string(schema.attrs.num_layers) +
                     " layers of " + schema.path);
  }
  return sel;
}

std::vector<int> parse_index_list(std::string_view spec, const std::string& flag) {
  std::vector<int> out;
  if (spec.empty()) return out;
  std::set<int> seen;
  for (const std::string_view item : split_list(spec)) {  // an empty item (trailing comma) too
    const std::size_t dash = item.find('-', 1);
    const int lo = parse_int(item.substr(0, dash), flag);
    const int hi = dash == std::string_view::npos ? lo : parse_int(item.substr(dash + 1), flag);
    if (lo < 0 || hi < lo) {
      throw UsageError(flag + ": expected a non-negative index or an increasing range, found '" +
                       std::string(item) + "'");
    }
    for (int i = lo; i <= hi; ++i) {
      // A repeated index would give repeated rows in every result.
      if (!seen.insert(i).second) {
        throw UsageError(flag + ": index " + std::to_string(i) + " is listed twice in '" +
                         std::string(spec) + "'");
      }
      out.push_back(i);
    }
  }
  return out;
}

namespace {

/// Images handed from the reader thread to the computing thread: `ready` in image order, `free`
/// the buffers the reader may fill. Both hold pointers into a fixed set of buffers.
class ImageQueue {
 public:
  explicit ImageQueue(std::size_t depth) : buffers_(depth) {
    for (ImageBuffer& b : buffers_) free_.push_back(&b);
  }

  /// Reader side: a buffer to fill, or null when the loop stops.
  ImageBuffer* take_free() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return stop_ || !free_.empty(); });
    if (stop_) return nullptr;
    ImageBuffer* b = free_.front();
    free_.pop_front();
    return b;
  }
  void put_ready(ImageBuffer* b) {
    {
      std::lock_guard lock(mu_);
      ready_.push_back(b);
    }
    cv_.notify_all();
  }
  void fail(std::exception_ptr e) {
    {
      std::lock_guard lock(mu_);
      error_ = std::move(e);
    }
    cv_.notify_all();
  }

  /// Computing side: the next image read, in order; rethrows the reader's error once every image
  /// read before it was taken. Adds the time spent waiting to `waited`.
  ImageBuffer* take_ready(double& waited) {
    std::unique_lock lock(mu_);
    if (ready_.empty() && !error_) {
      const auto t0 = std::chrono::steady_clock::now();
      cv_.wait(lock, [this] { return error_ || !ready_.empty(); });
      waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (ready_.empty()) std::rethrow_exception(error_);
    return pop_ready();
  }
  /// Computing side: the next image if it has been read already, else null (never waits; a
  /// reader's error is left for take_ready to rethrow).
  ImageBuffer* try_take_ready() {
    std::lock_guard lock(mu_);
    return ready_.empty() ? nullptr : pop_ready();
  }
  void give_back(ImageBuffer* b) {
    {
      std::lock_guard lock(mu_);
      free_.push_back(b);
    }
    cv_.notify_all();
  }
  void stop() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::vector<ImageBuffer> buffers_;
  std::deque<ImageBuffer*> free_, ready_;
  std::exception_ptr error_;
  bool stop_ = false;

  /// The front of `ready` (not empty), with the lock held.
  ImageBuffer* pop_ready() {
    ImageBuffer* b = ready_.front();
    ready_.pop_front();
    return b;
  }
  std::mutex mu_;
  std::condition_variable cv_;
};

/// Stops and joins the reader thread however the computing side leaves (an analysis may throw).
struct ReaderThread {
  ImageQueue& queue;
  std::thread thread;
  ~ReaderThread() {
    queue.stop();
    if (thread.joinable()) thread.join();
  }
};

std::size_t float_bytes(std::size_t n) { return n * sizeof(float); }

/// Selection::HeadReads resolved: Auto is the computing threads when they are at least as many as
/// the CPUs this process may run on. With one computing thread on two CPUs, reading on it cost
/// about 40% more time per image than a reader thread reading ahead on the other CPU; with two
/// on two, the reader thread took time from both (docs/benchmarks.md, "Heads read by their
/// threads").
bool computing_threads_read(Selection::HeadReads how) {
  if (how != Selection::HeadReads::Auto) return how == Selection::HeadReads::ComputingThreads;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
  return omp_get_max_threads() >= CPU_COUNT(&set);
}

/// Refuses a selected layer whose geometry is not the root attributes' (Selection::any_geometry),
/// saying why the analysis does not take it (`why`) and which layers it can read.
void require_root_geometry(const DumpSchema& s, const std::vector<int>& layers,
                           const std::string& why) {
  for (int l : layers) {
    if (!s.geometry_differs(l)) continue;
    std::string root_layers;
    for (int r = 0; r < s.attrs.num_layers; ++r) {
      if (!s.geometry_differs(r))
        root_layers += (root_layers.empty() ? "" : ",") + std::to_string(s.model_layer(r));
    }
    throw InputError(
        s.path,
        "/layers/" + std::to_string(l) + " (model layer " + std::to_string(s.model_layer(l)) + ")",
        "the root attributes' geometry (" + s.geometry(-1).describe() +
            "): " + (why.empty() ? "this analysis reads layers of that shape only" : why) +
            " (recompute, confusion, locality, maps, entropy, distance, rank, census and mask "
            "take every geometry; " +
            (root_layers.empty() ? std::string("no layer of this dump has the root's shape")
                                 : "layers of the root's shape: --layers " + root_layers) +
            ")",
        s.geometry(l).describe());
  }
}

}  // namespace

LoopMemory plan_loop_memory(const DumpSchema& schema, const Selection& resolved) {
  LoopMemory m;
  std::size_t most_q = 0;  // the largest layer's q of one head (the transformed queries)
  // Every head of a selected layer is read (a layer is one block on disk).
  for (int layer : resolved.layers) {
    const auto l = static_cast<std::size_t>(layer);
    const LayerGeometry g = schema.geometry(layer);
    const auto H = static_cast<std::size_t>(g.num_heads), d = static_cast<std::size_t>(g.head_dim);
    const auto Nq = static_cast<std::size_t>(g.query_rows()), Nk = static_cast<std::size_t>(g.key_rows());
    m.image_bytes += float_bytes(H * Nq * d) + float_bytes(H * Nk * d) * (resolved.need_v ? 2 : 1);
    most_q = std::max(most_q, Nq * d);
    if (resolved.need_model_tensors) {
      if (l < schema.layer_has_attn.size() && schema.layer_has_attn[l]) {
        m.image_bytes += float_bytes(H * Nq * static_cast<std::size_t>(g.unit_keys()));
      }
      if (l < schema.layer_has_out.size() && schema.layer_has_out[l]) m.image_bytes += float_bytes(H * Nq * d);
    }
  }
  m.fixed_bytes = read_buffer_bytes(schema);
  if (!resolved.transform.is_identity()) {
    m.fixed_bytes += float_bytes(resolved.layers.size() * resolved.heads.size() * most_q);
  }
  const std::size_t budget = resolved.max_memory == 0 ? kDefaultMaxMemory : resolved.max_memory;
  const std::size_t needed = m.fixed_bytes + 2 * m.image_bytes;
  if (budget < needed) {
    throw UsageError("--max-memory " + byte_size_text(budget) + " is too small: this selection " +
                     "needs at least " + byte_size_text(needed) + " (" + std::to_string(needed) +
                     " bytes) for two images in flight of " + byte_size_text(m.image_bytes) +
                     " each and the reader's buffers");
  }
  const std::size_t avail = budget - m.fixed_bytes;
  m.chunk_cache = std::min(avail / 8, kMaxChunkCache);
  if (avail - m.chunk_cache < 2 * m.image_bytes) m.chunk_cache = avail - 2 * m.image_bytes;
  m.depth = m.image_bytes == 0 ? 2 : (avail - m.chunk_cache) / m.image_bytes;
  const std::size_t most = std::max<std::size_t>(2, resolved.read_ahead == 0 ? kMaxQueueDepth : resolved.read_ahead);
  m.depth = std::clamp<std::size_t>(m.depth, 2, most);
  return m;
}

std::size_t parse_byte_size(std::string_view text, const std::string& flag) {
  const auto refuse = [&] {
    return UsageError(flag + ": expected a size such as 800M, 2G or 1048576 (K, M, G, T are " +
                      "powers of 1024), found '" + std::string(text) + "'");
  };
  std::string s(text);
  std::size_t digits = 0;
  while (digits < s.size() && (std::isdigit(static_cast<unsigned char>(s[digits])) || s[digits] == '.')) ++digits;
  if (digits == 0) throw refuse();
  const std::string number = s.substr(0, digits);
  std::string unit = s.substr(digits);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit.back() == 'i') unit.pop_back();
  double scale = 1;
  if (unit.size() == 1) {
    const std::string units = "KMGT";
    const std::size_t at = units.find(static_cast<char>(std::toupper(static_cast<unsigned char>(unit[0]))));
    if (at == std::string::npos) throw refuse();
    scale = std::pow(1024.0, static_cast<double>(at + 1));
  } else if (!unit.empty()) {
    throw refuse();
  }
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !(value > 0)) throw refuse();
  const double bytes = std::floor(value * scale);
  if (bytes < 1 || bytes > 1e18) throw refuse();
  return static_cast<std::size_t>(bytes);
}

std::string byte_size_text(std::size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return std::to_string(bytes) + " bytes";
  char buf[32];
  std::snprintf(buf, sizeof buf, v < 10 ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

namespace {

/// The streaming loop both entry points share: the reader thread fills the queue; `consume` takes
/// the images it wants (take_ready, try_take_ready; at most `left`, the images not yet done),
/// computes them, gives the buffers back and returns how many it finished, until every selected
/// image is done.
void stream_images(DumpReader& reader, const Selection& resolved, bool defer,
                   const std::function<std::size_t(ImageQueue&, double& waited, std::size_t left)>& consume) {
  if (resolved.images.empty()) return;
  if (!resolved.any_geometry)
    require_root_geometry(reader.schema(), resolved.layers, resolved.geometry_why);
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t direct_before = reader.direct_reads();
  const LoopMemory plan = plan_loop_memory(reader.schema(), resolved);
  reader.set_chunk_cache(plan.chunk_cache);
  // Read on this thread before the reader's starts: HDF5 is used by one thread at a time.
  const std::vector<LayerFamilyData> family_data =
      read_layer_family_data(reader.schema(), resolved.layers);
  ImageQueue queue(plan.depth);
  ReaderThread guard{queue, {}};
  guard.thread = std::thread([&reader, &resolved, &queue, &family_data, defer] {
    try {
      for (int image : resolved.images) {
        ImageBuffer* b = queue.take_free();
        if (b == nullptr) return;
        read_image(reader, resolved, family_data, image, *b, defer);
        queue.put_ready(b);
      }
    } catch (...) {
      queue.fail(std::current_exception());
    }
  });
  double waited = 0;
  std::size_t done = 0;
  while (done < resolved.images.size()) done += consume(queue, waited, resolved.images.size() - done);
  if (resolved.stats) {
    LoopStats& s = *resolved.stats;
    s.io_wait_seconds += waited;
    s.loop_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.images += static_cast<std::int64_t>(done);
    s.queue_depth = plan.depth;
    s.image_bytes = plan.image_bytes;
    s.chunk_cache_bytes = plan.chunk_cache;
    // Every image was handed over (under the queue's lock) after its blocks were counted.
    s.computing_threads_read = defer && reader.direct_reads() > direct_before;
  }
}

}  // namespace

void for_each_head(DumpReader& reader, const Selection& resolved,
                   const std::function<void(const HeadView&)>& fn,
                   const std::function<void(int image)>& on_image) {
  stream_images(reader, resolved, false, [&](ImageQueue& queue, double& waited, std::size_t) -> std::size_t {
    ImageBuffer* b = queue.take_ready(waited);
    compute_image(*b, resolved, fn);
    const int image = b->qkv.image;
    queue.give_back(b);
    release_notes();  // the run goes ahead: the notes held until now are worth reading
    if (on_image) on_image(image);
    return 1;
  });
}

void for_each_head_pipelined(DumpReader& reader, const Selection& resolved, std::size_t lanes,
                             const std::function<void(const HeadView&, std::size_t lane)>& fn,
                             const std::function<void(int image, std::size_t lane)>& on_image) {
  if (lanes < 1) throw UsageError("for_each_head_pipelined: lanes must be at least 1");
  // Each head's q, k and v are read by the thread that computes it, into its core's cache, when
  // the file allows direct reads (the reader thread then only finds where they lie) and the
  // selection asks for it; not when the queries are transformed first, for which the whole image
  // is read before its heads.
  const bool defer = resolved.transform.is_identity() && computing_threads_read(resolved.head_reads);
  stream_images(reader, resolved, defer, [&](ImageQueue& queue, double& waited, std::size_t left) -> std::size_t {
    // The images started and not yet finished, in order: a contiguous run of the loop's images,
    // at most `lanes` of them. A deque keeps references to its other elements on push_back and
    // pop_front, so a thread computing a head of one keeps a valid pointer.
    struct Active {
      ImageBuffer* buffer = nullptr;
      std::vector<MatF> transformed;
      ImageHeads heads;
      std::vector<int> slots;  // each head's slot in the image (ImageQKV::read_deferred_into)
      std::size_t seq = 0, lane = 0, next = 0, done = 0;  // seq: the image's place in the loop
    };
    std::deque<Active> active;
    std::size_t started = 0, finished = 0;
    std::mutex mu;
    std::condition_variable cv;
    // The first failure in the loop's own order (image, then: its read 0, its heads 1.., its
    // on_image last), whichever thread met it first: once a call fails no head is handed out,
    // the heads already running finish, and the earliest failure among them is the one a loop
    // without threads would have met.
    std::exception_ptr error;
    constexpr std::size_t kLast = std::numeric_limits<std::size_t>::max();
    std::pair<std::size_t, std::size_t> error_at{kLast, kLast};
    auto fail = [&](std::exception_ptr e, std::size_t image_seq, std::size_t step) {
      if (std::pair{image_seq, step} < error_at) {
        error_at = {image_seq, step};
        error = std::move(e);
      }
      cv.notify_all();
    };
    // Called with the lock held: hands every finished image at the front to on_image, in order
    // (those before a failure too, as a loop without threads would have). on_image runs without
    // the lock, so that the other threads go on with the next image's heads meanwhile; one thread
    // at a time finishes images (`finishing`), and an image finished meanwhile by another thread
    // is taken by the same loop. The image stays at the front of `active` until its on_image has
    // returned, so its lane is not given to another image before.
    bool finishing = false;
    auto finish_front = [&](std::unique_lock<std::mutex>& held) {
      if (finishing) return;
      finishing = true;
      while (!active.empty() && active.front().seq < error_at.first &&
             active.front().done == active.front().heads.size()) {
        Active& a = active.front();
        std::exception_ptr failed_here;
        held.unlock();
        try {
          release_notes();
          on_image(a.buffer->qkv.image, a.lane);
        } catch (...) {
          failed_here = std::current_exception();
        }
        held.lock();
        if (failed_here) {
          fail(failed_here, a.seq, kLast);
          break;
        }
        queue.give_back(a.buffer);
        active.pop_front();
        ++finished;
        cv.notify_all();  // a lane is free: a waiting thread may start the next image
      }
      finishing = false;
    };
    parallel_run([&] {
      std::unique_lock lock(mu);
      for (;;) {
        if (error || finished == left) break;
        Active* work = nullptr;
        for (Active& a : active) {
          if (a.next < a.heads.size()) {
            work = &a;
            break;
          }
        }
        if (work == nullptr) {
          if (started == left || active.size() >= lanes) {
            cv.wait(lock);  // until a head is done (or the loop stops)
            continue;
          }
          // Next image (waits for the reader with the lock held: the other threads have no head
          // to take meanwhile, and finishing theirs only waits for this one).
          try {
            ImageBuffer* b = queue.take_ready(waited);
            Active& a = active.emplace_back();
            a.buffer = b;
            a.seq = started;
            a.lane = started % lanes;
            a.transformed = transform_queries(b->qkv, resolved);
            a.heads = image_heads(*b, resolved, a.transformed, &a.slots);
          } catch (...) {
            fail(std::current_exception(), started, 0);
            break;
          }
          ++started;
          finish_front(lock);  // an image with no head is finished at once
          cv.notify_all();
          continue;
        }
        const std::size_t head = work->next++;
        lock.unlock();
        ImageQKV& qkv = work->buffer->qkv;
        if (qkv.deferred.empty()) prefetch_head(work->heads, head + static_cast<std::size_t>(omp_get_num_threads()));
        std::exception_ptr failed_here;
        try {
          // A deferred head is read into this thread's own matrices, the same ones head after
          // head: they stay in its core's cache, and the image buffers in flight (several
          // megabytes each) are never touched, so their pages are never faulted in.
          thread_local MatF own[3];
          MatF* const to[3] = {&own[0], &own[1], &own[2]};
          const HeadView& hv = work->heads[head];
          const unsigned read = qkv.read_deferred_into(work->slots[head], hv.head, to);
          if (read == 0) {
            fn(hv, work->lane);
          } else {
            // (Deferred only without a transform: the queries read are the raw ones.)
            const auto pick = [&](unsigned t, const MatF& m) -> const MatF& {
              return (read >> t & 1U) != 0 ? own[t] : m;
            };
            const HeadView mine{hv.image,   hv.layer,      hv.head,
                                pick(0, hv.q), pick(1, hv.k), pick(2, hv.v),
                                (read & 1U) != 0 ? &own[0] : hv.q_raw,
                                hv.attn,       hv.out,        hv.geometry,
                                hv.own_variant, hv.params};
            fn(mine, work->lane);
          }
        } catch (...) {
          failed_here = std::current_exception();
        }
        lock.lock();
        if (failed_here) {
          fail(failed_here, work->seq, head + 1);
          continue;
        }
        ++work->done;
        finish_front(lock);
        cv.notify_all();
      }
    });
    if (error) std::rethrow_exception(error);
    return left;
  });
}

void for_each_image_batch(DumpReader& reader, const Selection& resolved, std::size_t max_images,
                          const std::function<void(const std::vector<ImageHeads>&)>& fn,
                          const std::function<void(int image)>& on_image) {
  if (max_images < 1) throw UsageError("for_each_image_batch: max_images must be at least 1");
  stream_images(reader, resolved, false, [&](ImageQueue& queue, double& waited, std::size_t left) -> std::size_t {
    std::vector<ImageBuffer*> taken{queue.take_ready(waited)};
    while (taken.size() < std::min(max_images, left)) {
      ImageBuffer* b = queue.try_take_ready();
      if (b == nullptr) break;
      taken.push_back(b);
    }
    std::vector<std::vector<MatF>> transformed;
    transformed.reserve(taken.size());
    std::vector<ImageHeads> images;
    images.reserve(taken.size());
    for (ImageBuffer* b : taken) {
      transformed.push_back(transform_queries(b->qkv, resolved));
      images.push_back(image_heads(*b, resolved, transformed.back()));
    }
    fn(images);
    for (ImageBuffer* b : taken) {
      const int image = b->qkv.image;
      queue.give_back(b);
      release_notes();  // the run goes ahead: the notes held until now are worth reading
      if (on_image) on_image(image);
    }
    return taken.size();
  });
}

}  // namespace attnscope::analyses
