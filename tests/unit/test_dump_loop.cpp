// The streaming loop: every selected head once, images in order, transforms applied to q but not
// to q_raw, the model's own attn and out with their head when asked, selections validated; and the
// whole-dump confusion run against the brute force.
#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/dump_loop.hpp"
#include "attnscope/error.hpp"
#include "attnscope/notes.hpp"
#include "attnscope/synth.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <memory>
#include <stdexcept>
#include <mutex>
#include <set>
#include <tuple>

namespace attnscope::analyses {
namespace {

/// omp_set_num_threads, with 0 restoring the count in effect when the tests started.
void set_threads(int n) {
  static const int initial = omp_get_max_threads();
  omp_set_num_threads(n > 0 ? n : initial);
}

/// Writes NaN into single elements of an HDF5 file's float datasets.
struct H5Handles {
  hid_t file;
  explicit H5Handles(const std::string& p) : file(H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    EXPECT_GE(file, 0) << p;
  }
  ~H5Handles() { H5Fclose(file); }
  H5Handles(const H5Handles&) = delete;
  H5Handles& operator=(const H5Handles&) = delete;
  void poke(const char* name, const std::vector<hsize_t>& at) const {
    const hid_t ds = H5Dopen2(file, name, H5P_DEFAULT);
    const hid_t space = H5Dget_space(ds);
    const std::vector<hsize_t> one(at.size(), 1);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, at.data(), nullptr, one.data(), nullptr);
    const hsize_t n = 1;
    const hid_t mem = H5Screate_simple(1, &n, nullptr);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, mem, space, H5P_DEFAULT, &nan), 0) << name;
    H5Sclose(mem);
    H5Sclose(space);
    H5Dclose(ds);
  }
};

class DumpLoop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    opts_.layers = 3;
    opts_.heads = 2;
    opts_.grid = TokenGrid{1, 5, 6};
    opts_.head_dim = 7;
    opts_.images = 5;
    opts_.seed = 42;
    opts_.plant_duplicates = 1;
    opts_.plant_collinear = 1;
    opts_.plant_shifted = 1;
    opts_.plant_hyperplane = true;
    path_ = (std::filesystem::temp_directory_path() / ("attnscope_dump_loop_" + std::to_string(::getpid()) + ".h5")).string();
    write_synth_dump(path_, opts_);
  }
  static void TearDownTestSuite() { std::filesystem::remove(path_); }
  static SynthOptions opts_;
  static std::string path_;
};
SynthOptions DumpLoop::opts_;
std::string DumpLoop::path_;

TEST_F(DumpLoop, VisitsEverySelectedHeadOnceInImageOrder) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {3, 1, 4};
  sel.layers = {2, 0};
  const Selection r = resolve(reader.schema(), sel);
  ASSERT_EQ(r.heads, (std::vector<int>{0, 1}));
  std::mutex m;
  std::multiset<std::tuple<int, int, int>> seen;
  std::vector<int> done;
  for_each_head(
      reader, r,
      [&](const HeadView& hv) {
        const ImageQKV want = synth_image(opts_, hv.image);
        EXPECT_TRUE(hv.q.isApprox(want.Q(hv.layer, hv.head), 0.0)) << "image " << hv.image << " layer " << hv.layer;
        EXPECT_TRUE(hv.k.isApprox(want.K(hv.layer, hv.head), 0.0)) << "image " << hv.image << " layer " << hv.layer;
        EXPECT_EQ(hv.q_raw, &hv.q);
        std::lock_guard<std::mutex> lock(m);
        seen.emplace(hv.image, hv.layer, hv.head);
      },
      [&](int image) {
        std::lock_guard<std::mutex> lock(m);
        EXPECT_EQ(seen.size(), (done.size() + 1) * 4) << "image " << image << " finished early";
        done.push_back(image);
      });
  EXPECT_EQ(done, (std::vector<int>{3, 1, 4}));
  for (int i : {3, 1, 4}) {
    for (int l : {2, 0}) {
      for (int h : {0, 1}) EXPECT_EQ(seen.count({i, l, h}), 1u) << i << " " << l << " " << h;
    }
  }
}

TEST_F(DumpLoop, TransformAppliesToQButNotToRawQueries) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {0};
  sel.transform = parse_query_transform("f1");
  const Selection r = resolve(reader.schema(), sel);
  for_each_head(reader, r, [&](const HeadView& hv) {
    ASSERT_NE(hv.q_raw, nullptr);
    const ImageQKV want = synth_image(opts_, 0);
    EXPECT_TRUE(hv.q_raw->isApprox(want.Q(hv.layer, hv.head), 0.0));
    const MatF f1 = r.transform.apply<float>(*hv.q_raw);
    EXPECT_TRUE(hv.q.isApprox(f1, 0.0)) << "layer " << hv.layer << " head " << hv.head;
  });
}

TEST_F(DumpLoop, BadSelectionsAreUsageErrors) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {5};
  EXPECT_THROW((void)resolve(reader.schema(), sel), UsageError);
  sel.images = {};
  sel.layers = {3};
  EXPECT_THROW((void)resolve(reader.schema(), sel), UsageError);
  sel.layers = {};
  sel.heads = {-1};
  EXPECT_THROW((void)resolve(reader.schema(), sel), UsageError);
}

TEST_F(DumpLoop, ExceptionsInWorkersReachTheCaller) {
  DumpReader reader(path_);
  const Selection r = resolve(reader.schema(), Selection{});
  EXPECT_THROW(for_each_head(reader, r, [](const HeadView& hv) {
                 if (hv.head == 1) throw NumericalError("boom");
               }),
               NumericalError);
}

TEST_F(DumpLoop, ConfusionRunEqualsBruteForceAndFindsPlantedPairs) {
  for (const char* spec : {"softmax", "linear:relu", "inline", "mala"}) {
    const std::vector<Variant> vs{parse_variant(spec)};
    DumpReader a(path_), b(path_);
    const Selection r = resolve(a.schema(), Selection{});
    std::vector<std::int64_t> fast_images, ref_images, fast_degenerate, ref_degenerate;
    auto collect = [](std::vector<std::int64_t>& images, std::vector<std::int64_t>& degenerate) {
      return [&images, &degenerate](int, const auto& c, const auto& dp) {
        images.push_back(c[0]);
        degenerate.push_back(dp[0]);
      };
    };
    const ConfusionResult fast = run_confusion(a, r, vs, ConfusionOptions{}, false,
                                               collect(fast_images, fast_degenerate));
    const ConfusionResult ref = run_confusion(b, r, vs, ConfusionOptions{}, true,
                                              collect(ref_images, ref_degenerate));
    EXPECT_EQ(fast_images, ref_images) << spec;
    EXPECT_EQ(fast_degenerate, ref_degenerate) << spec;
    EXPECT_EQ(fast.histogram, ref.histogram) << spec;
    EXPECT_EQ(fast.histogram_with_degenerate, ref.histogram_with_degenerate) << spec;
    for (std::size_t s = 0; s < fast.per_head[0].size(); ++s) {
      EXPECT_EQ(fast.per_head[0][s].count, ref.per_head[0][s].count) << spec << " slot " << s;
      EXPECT_EQ(fast.per_head[0][s].degenerate_pairs, ref.per_head[0][s].degenerate_pairs)
          << spec << " slot " << s;
    }
    if (std::string(spec) == "softmax") {
      // One shifted pair per head has the same softmax row: at least layers x heads per image.
      for (auto c : fast_images) EXPECT_GE(c, opts_.layers * opts_.heads) << spec;
    }
  }
}

TEST_F(DumpLoop, ModelTensorsAreNullWhereTheDumpHasNone) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {1};
  sel.need_model_tensors = true;
  for_each_head(reader, resolve(reader.schema(), sel), [](const HeadView& hv) {
    EXPECT_EQ(hv.attn, nullptr) << "layer " << hv.layer << " head " << hv.head;
    EXPECT_EQ(hv.out, nullptr) << "layer " << hv.layer << " head " << hv.head;
  });
}

class DumpLoopModelTensors : public test::ScratchDirTest {};

// The model's own attn and out reach the head they belong to, image by image, only when asked.
TEST_F(DumpLoopModelTensors, ComeWithTheirHeadOnlyWhenAsked) {
  SynthOptions o;
  o.layers = 3;
  o.heads = 2;
  o.grid = TokenGrid{1, 2, 3};
  o.head_dim = 4;
  o.images = 3;
  const int n = o.tokens();
  const auto tag = [](int image, int layer, int head) {
    return static_cast<float>(image * 100 + layer * 10 + head);
  };
  DumpWriterOptions w;
  w.with_attn = w.with_out = true;
  DumpWriter writer(path("m.h5"), o.attributes(), w);
  for (int i = 0; i < o.images; ++i) {
    std::vector<MatF> attn, out;
    for (int l = 0; l < o.layers; ++l)
      for (int h = 0; h < o.heads; ++h) {
        attn.push_back(MatF::Constant(n, n, tag(i, l, h)));
        out.push_back(MatF::Constant(n, o.head_dim, -tag(i, l, h)));
      }
    writer.append(synth_image(o, i), &attn, &out);
  }
  writer.close();

  DumpReader reader(path("m.h5"));
  Selection sel;
  sel.images = {2, 0};
  sel.layers = {2, 0};
  sel.heads = {1};
  sel.need_model_tensors = true;
  std::mutex m;
  int seen = 0;
  for_each_head(reader, resolve(reader.schema(), sel), [&](const HeadView& hv) {
    const std::string where = "image " + std::to_string(hv.image) + " layer " +
                              std::to_string(hv.layer) + " head " + std::to_string(hv.head);
    ASSERT_NE(hv.attn, nullptr) << where;
    ASSERT_NE(hv.out, nullptr) << where;
    EXPECT_EQ(*hv.attn, MatF::Constant(n, n, tag(hv.image, hv.layer, hv.head))) << where;
    EXPECT_EQ(*hv.out, MatF::Constant(n, o.head_dim, -tag(hv.image, hv.layer, hv.head))) << where;
    EXPECT_EQ(hv.q, synth_image(o, hv.image).Q(hv.layer, hv.head)) << where;
    const std::lock_guard<std::mutex> lock(m);
    ++seen;
  });
  EXPECT_EQ(seen, 4);
  sel.need_model_tensors = false;
  for_each_head(reader, resolve(reader.schema(), sel), [](const HeadView& hv) {
    EXPECT_EQ(hv.attn, nullptr);
    EXPECT_EQ(hv.out, nullptr);
  });
}

TEST(ParseIndexList, RangesAndErrors) {
  EXPECT_EQ(parse_index_list("0-3,7,5", "--images"), (std::vector<int>{0, 1, 2, 3, 7, 5}));
  EXPECT_TRUE(parse_index_list("", "--images").empty());
  EXPECT_THROW((void)parse_index_list("3-1", "--images"), UsageError);
  EXPECT_THROW((void)parse_index_list("x", "--layers"), UsageError);
  EXPECT_THROW((void)parse_index_list("-2", "--heads"), UsageError);
}

// A repeated index would repeat rows in every result: refused, as is an empty item anywhere.
TEST(ParseIndexList, RepeatsAndEmptyItemsAreErrors) {
  for (const char* spec : {"0-3,2", "1,1", "0-5,3-9"}) {
    try {
      (void)parse_index_list(spec, "--images");
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("listed twice"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("--images"), std::string::npos) << e.what();
    }
  }
  for (const char* spec : {"0,", ",0", "0,,1", ","}) {
    EXPECT_THROW((void)parse_index_list(spec, "--heads"), UsageError) << "'" << spec << "'";
  }
}

}  // namespace
}  // namespace attnscope::analyses

namespace attnscope::analyses {
namespace {

// The budget sets how many images are in flight; any budget that holds two gives the same visits,
// and what the loop measured reaches the selection's stats.
TEST_F(DumpLoop, BudgetSetsTheQueueNotTheResults) {
  DumpReader reader(path_);
  Selection base;
  base.need_v = false;
  base = resolve(reader.schema(), base);
  const LoopMemory least = [&] {
    Selection s = base;
    s.max_memory = std::size_t{1} << 40;
    return plan_loop_memory(reader.schema(), s);
  }();
  const std::size_t H = 2, N = 31, d = 7, L = 3;
  EXPECT_EQ(least.image_bytes, L * H * N * d * sizeof(float) * 2) << "q and k of every layer";
  EXPECT_EQ(least.fixed_bytes, read_buffer_bytes(reader.schema().attrs));
  EXPECT_EQ(least.depth, kMaxQueueDepth);
  EXPECT_EQ(least.chunk_cache, kMaxChunkCache);
  const std::size_t minimum = least.fixed_bytes + 2 * least.image_bytes;
  std::vector<std::vector<std::tuple<int, int, int>>> runs;
  for (std::size_t budget : {minimum, minimum + 3 * least.image_bytes, std::size_t{0}}) {
    Selection s = base;
    s.max_memory = budget;
    s.stats = std::make_shared<LoopStats>();
    const LoopMemory plan = plan_loop_memory(reader.schema(), s);
    if (budget == minimum) {
      EXPECT_EQ(plan.depth, 2u);
      EXPECT_EQ(plan.chunk_cache, 0u);
    }
    if (budget != 0) {
      EXPECT_LE(plan.fixed_bytes + plan.depth * plan.image_bytes + plan.chunk_cache, budget);
    }
    std::mutex m;
    std::vector<std::tuple<int, int, int>> seen;
    for_each_head(reader, s, [&](const HeadView& hv) {
      const std::lock_guard<std::mutex> lock(m);
      seen.emplace_back(hv.image, hv.layer, hv.head);
    });
    std::sort(seen.begin(), seen.end());
    runs.push_back(seen);
    EXPECT_EQ(s.stats->images, opts_.images) << budget;
    EXPECT_EQ(s.stats->queue_depth, plan.depth) << budget;
    EXPECT_EQ(reader.chunk_cache(), plan.chunk_cache) << budget;
    EXPECT_GE(s.stats->io_wait_seconds, 0.0);
    EXPECT_LE(s.stats->io_wait_seconds, s.stats->loop_seconds);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  EXPECT_EQ(runs[0].size(), static_cast<std::size_t>(opts_.images * 3 * 2));
  // One byte short of two images: refused, naming the size needed.
  Selection s = base;
  s.max_memory = minimum - 1;
  try {
    for_each_head(reader, s, [](const HeadView&) {});
    ADD_FAILURE() << "a budget below two images was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(minimum) + " bytes"), std::string::npos)
        << e.what();
  }
}

// Whole images at a time (the GPU's loop): every selected image once, in order, each with all its
// heads in selection order and the same inputs as for_each_head gives, batches of at most
// max_images, on_image after each batch's images in order; the read-ahead follows read_ahead.
TEST_F(DumpLoop, ImageBatchesHoldWholeImagesInOrder) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {4, 0, 2, 3, 1};
  sel.layers = {1, 2};
  sel.heads = {1, 0};
  sel.transform = parse_query_transform("f1");
  Selection r = resolve(reader.schema(), sel);
  r.read_ahead = 5;
  r.stats = std::make_shared<LoopStats>();
  EXPECT_EQ(plan_loop_memory(reader.schema(), r).depth, 5u);
  for (std::size_t max_images : {std::size_t{1}, std::size_t{2}, std::size_t{5}}) {
    std::vector<int> images, finished;
    std::size_t batches = 0, largest = 0;
    for_each_image_batch(
        reader, r, max_images,
        [&](const std::vector<ImageHeads>& batch) {
          ++batches;
          largest = std::max(largest, batch.size());
          EXPECT_EQ(finished.size(), images.size()) << "a batch began before the last one was finished";
          for (const ImageHeads& heads : batch) {
            ASSERT_EQ(heads.size(), 4u);
            const int image = heads.front().image;
            images.push_back(image);
            const ImageQKV want = synth_image(opts_, image);
            std::size_t at = 0;
            for (int l : {1, 2}) {
              for (int h : {1, 0}) {
                const HeadView& hv = heads[at++];
                EXPECT_EQ(std::tie(hv.image, hv.layer, hv.head), std::tie(image, l, h));
                ASSERT_NE(hv.q_raw, nullptr);
                EXPECT_TRUE(hv.q_raw->isApprox(want.Q(l, h), 0.0));
                EXPECT_TRUE(hv.q.isApprox(r.transform.apply<float>(want.Q(l, h)), 0.0));
                EXPECT_TRUE(hv.k.isApprox(want.K(l, h), 0.0));
              }
            }
          }
        },
        [&](int image) { finished.push_back(image); });
    EXPECT_EQ(images, sel.images) << "max_images " << max_images;
    EXPECT_EQ(finished, sel.images) << "max_images " << max_images;
    EXPECT_LE(largest, max_images);
    EXPECT_GE(batches, (sel.images.size() + max_images - 1) / max_images);
  }
  EXPECT_EQ(r.stats->images, 15);
  EXPECT_EQ(r.stats->queue_depth, 5u);
  EXPECT_THROW(for_each_image_batch(reader, r, 0, [](const std::vector<ImageHeads>&) {}), UsageError);
}

// The reader's error at image n surfaces after images before it were computed, and the reader
// thread is joined when the computing side throws.
TEST_F(DumpLoop, ComputeErrorStopsTheReader) {
  DumpReader reader(path_);
  Selection s = resolve(reader.schema(), {});
  s.max_memory = std::size_t{1} << 20;
  int images = 0;
  EXPECT_THROW(for_each_head(
                   reader, s, [](const HeadView&) {},
                   [&](int image) {
                     ++images;
                     if (image == 1) throw std::runtime_error("stop");
                   }),
               std::runtime_error);
  EXPECT_EQ(images, 2);
  // The reader is usable again afterwards.
  EXPECT_EQ(reader.read_image(4).image, 4);
}

// The pipelined loop: every selected head once, on_image in image order once all of its heads
// are done, lanes n % lanes (each lane's state untouched by another image between its heads and
// its on_image), on one thread and on several.
TEST_F(DumpLoop, PipelinedLoopFinishesImagesInOrderWithTheirOwnLanes) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {3, 1, 4, 0, 2};
  sel.layers = {2, 0};
  const Selection r = resolve(reader.schema(), sel);
  for (int threads : {1, 2, 3}) {
    set_threads(threads);
    for (std::size_t lanes : {std::size_t{1}, std::size_t{2}, std::size_t{3}}) {
      std::mutex m;
      std::multiset<std::tuple<int, int, int>> seen;
      std::vector<std::vector<int>> lane_images(lanes);  // images whose heads wrote to the lane
      std::vector<int> done;
      for_each_head_pipelined(
          reader, r, lanes,
          [&](const HeadView& hv, std::size_t lane) {
            const ImageQKV want = synth_image(opts_, hv.image);
            EXPECT_TRUE(hv.q.isApprox(want.Q(hv.layer, hv.head), 0.0)) << "image " << hv.image;
            std::lock_guard<std::mutex> lock(m);
            ASSERT_LT(lane, lanes);
            seen.emplace(hv.image, hv.layer, hv.head);
            lane_images[lane].push_back(hv.image);
          },
          [&](int image, std::size_t lane) {
            std::lock_guard<std::mutex> lock(m);
            const std::size_t n = done.size();
            EXPECT_EQ(lane, n % lanes) << "image " << image;
            EXPECT_EQ(image, sel.images[n]) << "images out of order";
            // Its four heads, and no other image's, since the lane was last finished.
            EXPECT_EQ(lane_images[lane], std::vector<int>(4, image)) << "image " << image;
            lane_images[lane].clear();
            done.push_back(image);
          });
      EXPECT_EQ(done, sel.images) << threads << " threads, " << lanes << " lanes";
      EXPECT_EQ(seen.size(), 20u);
      for (int i : sel.images) {
        for (int l : {2, 0}) {
          for (int h : {0, 1}) EXPECT_EQ(seen.count({i, l, h}), 1u) << i << " " << l << " " << h;
        }
      }
    }
  }
  set_threads(0);
  EXPECT_THROW(for_each_head_pipelined(reader, r, 0, [](const HeadView&, std::size_t) {},
                                       [](int, std::size_t) {}),
               UsageError);
}

// on_image runs without holding up the loop: with two lanes, the heads of the next image are
// computed while on_image of the one before is still running (here it waits for one of them; had
// it held the loop's lock, no head could start and the wait would time out). for_each_head: no
// head of the next image starts before on_image has returned.
TEST_F(DumpLoop, OnImageRunsWhileTheNextImagesHeadsAreComputed) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {0, 1, 2, 3};
  const Selection r = resolve(reader.schema(), sel);
  set_threads(2);
  std::mutex m;
  std::condition_variable cv;
  std::set<int> started;  // images with a head begun
  std::vector<int> overlapped;  // images whose on_image saw the next image's heads begin
  for_each_head_pipelined(
      reader, r, 2,
      [&](const HeadView& hv, std::size_t) {
        const std::lock_guard<std::mutex> lock(m);
        started.insert(hv.image);
        cv.notify_all();
      },
      [&](int image, std::size_t) {
        if (image == 3) return;  // the last image has no next one
        std::unique_lock<std::mutex> lock(m);
        if (cv.wait_for(lock, std::chrono::seconds(20), [&] { return started.count(image + 1) > 0; }))
          overlapped.push_back(image);
      });
  EXPECT_EQ(overlapped, (std::vector<int>{0, 1, 2}));

  // for_each_head: every event in one sequence; on_image sleeps, so that a head of the next image
  // begun early would show.
  std::vector<std::pair<int, bool>> events;  // (image, true for on_image)
  for_each_head(
      reader, r,
      [&](const HeadView& hv) {
        const std::lock_guard<std::mutex> lock(m);
        events.emplace_back(hv.image, false);
      },
      [&](int image) {
        ::usleep(3000);
        const std::lock_guard<std::mutex> lock(m);
        events.emplace_back(image, true);
      });
  set_threads(0);
  ASSERT_EQ(events.size(), 4u * (6 + 1));
  for (std::size_t e = 0; e < events.size(); ++e) {
    const std::size_t image = e / 7;  // six heads of each image, then its on_image
    EXPECT_EQ(events[e].first, sel.images[image]) << "event " << e;
    EXPECT_EQ(events[e].second, e % 7 == 6) << "event " << e;
  }
}

// A failure stops the loop and reaches the caller; the one reported is the first in the loop's
// own order whichever thread met which first, and every image before it was finished.
TEST_F(DumpLoop, PipelinedLoopReportsTheFirstFailureInImageOrder) {
  DumpReader reader(path_);
  const Selection r = resolve(reader.schema(), Selection{});
  for (int threads : {1, 2, 4}) {
    set_threads(threads);
    for (int round = 0; round < 20; ++round) {
      std::vector<int> done;
      try {
        for_each_head_pipelined(
            reader, r, 2,
            [](const HeadView& hv, std::size_t) {
              // Image 2's last head fails late, image 3's first head at once.
              if (hv.image == 2 && hv.layer == 2 && hv.head == 1) {
                ::usleep(2000);
                throw NumericalError("image 2");
              }
              if (hv.image == 3 && hv.layer == 0 && hv.head == 0) throw NumericalError("image 3");
            },
            [&](int image, std::size_t) { done.push_back(image); });
        ADD_FAILURE() << "no exception";
      } catch (const NumericalError& e) {
        EXPECT_STREQ(e.what(), "image 2") << threads << " threads";
      }
      EXPECT_EQ(done, (std::vector<int>{0, 1})) << threads << " threads";
    }
    // on_image's own failure: images after it are not finished.
    std::vector<int> done;
    EXPECT_THROW(for_each_head_pipelined(
                     reader, r, 2, [](const HeadView&, std::size_t) {},
                     [&](int image, std::size_t) {
                       done.push_back(image);
                       if (image == 1) throw std::runtime_error("stop");
                     }),
                 std::runtime_error);
    EXPECT_EQ(done, (std::vector<int>{0, 1}));
  }
  set_threads(0);
  EXPECT_EQ(reader.read_image(4).image, 4);  // the reader is usable again
}

// On an uncompressed dump each head's q, k and v can be read by the thread that computes it
// (ImageQKV::read_deferred): every head sees the values read_image gives, and a NaN is the
// reader's InputError of the first image in order that holds one (image 2's last head, not image
// 3's first, whichever a thread meets first); the images before it are finished. The same with
// the reader thread reading them.
TEST_F(DumpLoop, HeadsReadByTheirThreadsAreTheDumpsValuesAndNansStopTheLoopInOrder) {
  SynthOptions o = opts_;
  o.compression = 0;
  const std::string clean = path_ + ".raw.h5", bad = path_ + ".nan.h5";
  write_synth_dump(clean, o);
  std::filesystem::copy_file(clean, bad, std::filesystem::copy_options::overwrite_existing);
  {
    H5Handles h(bad);
    h.poke("/layers/2/q", {2, 1, 3, 4});
    h.poke("/layers/0/k", {3, 0, 0, 0});
  }
  std::vector<ImageQKV> want;
  {
    DumpReader r(clean);
    for (int i = 0; i < o.images; ++i) want.push_back(r.read_image(i));
  }
  for (const auto& [threads, who] : {std::pair{1, Selection::HeadReads::ComputingThreads},
                                    std::pair{2, Selection::HeadReads::ComputingThreads},
                                    std::pair{4, Selection::HeadReads::ComputingThreads},
                                    std::pair{2, Selection::HeadReads::ReaderThread}}) {
    set_threads(threads);
    DumpReader reader(clean);
    Selection sel;
    sel.head_reads = who;
    sel.stats = std::make_shared<LoopStats>();
    const Selection r = resolve(reader.schema(), sel);
    std::mutex mu;
    int heads = 0, mismatches = 0;
    for_each_head_pipelined(
        reader, r, 2,
        [&](const HeadView& hv, std::size_t) {
          const ImageQKV& w = want[static_cast<std::size_t>(hv.image)];
          const bool same = hv.q == w.Q(hv.layer, hv.head) && hv.k == w.K(hv.layer, hv.head) &&
                            hv.v == w.V(hv.layer, hv.head);
          std::lock_guard lock(mu);
          ++heads;
          mismatches += same ? 0 : 1;
        },
        [](int, std::size_t) {});
    EXPECT_EQ(heads, o.images * o.layers * o.heads) << threads << " threads";
    EXPECT_EQ(mismatches, 0) << threads << " threads";
    EXPECT_GT(reader.direct_reads(), 0U) << "the dump is read directly: the path under test";
    EXPECT_EQ(sel.stats->computing_threads_read, who == Selection::HeadReads::ComputingThreads);
    for (int round = 0; round < 10; ++round) {
      DumpReader nan_reader(bad);
      std::vector<int> done;
      try {
        for_each_head_pipelined(
            nan_reader, r, 2, [](const HeadView&, std::size_t) {},
            [&](int image, std::size_t) { done.push_back(image); });
        ADD_FAILURE() << "the NaN was not found";
      } catch (const InputError& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("/layers/2/q"), std::string::npos) << what;
        EXPECT_NE(what.find("image 2"), std::string::npos) << what;
      }
      EXPECT_EQ(done, (std::vector<int>{0, 1})) << threads << " threads";
    }
  }
  set_threads(0);
  std::filesystem::remove(clean);
  std::filesystem::remove(bad);
}

TEST(ByteSize, ParsesSuffixesAndRefusesGarbage) {
  EXPECT_EQ(parse_byte_size("1048576", "--max-memory"), 1048576u);
  EXPECT_EQ(parse_byte_size("800M", "--max-memory"), std::size_t{800} << 20);
  EXPECT_EQ(parse_byte_size("2G", "--max-memory"), std::size_t{2} << 30);
  EXPECT_EQ(parse_byte_size("2GiB", "--max-memory"), std::size_t{2} << 30);
  EXPECT_EQ(parse_byte_size("512k", "--max-memory"), std::size_t{512} << 10);
  EXPECT_EQ(parse_byte_size("1.5G", "--max-memory"), std::size_t{3} << 29);
  for (const char* bad : {"", "G", "0", "-1G", "12X", "1..5M", "1 G", "3MB2"}) {
    EXPECT_THROW((void)parse_byte_size(bad, "--max-memory"), UsageError) << "'" << bad << "'";
  }
  EXPECT_EQ(byte_size_text(512u << 20), "512 MiB");
  EXPECT_EQ(byte_size_text(1536u << 20), "1.5 GiB");
  EXPECT_EQ(byte_size_text(100), "100 bytes");
}

// Notes (notes.hpp) wait until the run goes ahead: held notes are printed, in order and once,
// when the first image is done, before it is handed on (a run refused before that prints its
// error alone); dropped notes never appear.
TEST_F(DumpLoop, HeldNotesArePrintedOnceTheFirstImageIsDone) {
  DumpReader reader(path_);
  Selection sel;
  sel.images = {0, 1};
  const Selection r = resolve(reader.schema(), sel);
  attnscope::hold_note("attnscope test: note: first");
  attnscope::hold_note("attnscope test: note: second");
  std::vector<std::string> at_image;
  testing::internal::CaptureStderr();
  for_each_head(
      reader, r, [](const HeadView&) {},
      [&](int) {
        std::string got = testing::internal::GetCapturedStderr();
        at_image.push_back(got);
        testing::internal::CaptureStderr();
      });
  const std::string after = testing::internal::GetCapturedStderr();
  ASSERT_EQ(at_image.size(), 2u);
  EXPECT_EQ(at_image[0], "attnscope test: note: first\nattnscope test: note: second\n");
  EXPECT_EQ(at_image[1], "");
  EXPECT_EQ(after, "");
  attnscope::hold_note("attnscope test: note: dropped");
  attnscope::drop_notes();
  testing::internal::CaptureStderr();
  attnscope::release_notes();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace attnscope::analyses
