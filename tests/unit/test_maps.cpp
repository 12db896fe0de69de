// Attention maps: grid layout of a row, prefix weights, token parsing, and the streamed run over a
// dump (its order, and no map for a degenerate row).
#include "attnscope/analyses/maps.hpp"
#include "attnscope/error.hpp"
#include "attnscope/synth.hpp"
#include "random_inputs.hpp"
#include "scratch_dir.hpp"

#include <gtest/gtest.h>

#include <tuple>

namespace attnscope::analyses {
namespace {

TEST(Maps, GridCellsHoldTheRowInTokenOrder) {
  const TokenGrid g{2, 3, 4};
  for (const char* spec : {"softmax", "inline", "mala@code"}) {
    const Variant v = parse_variant(spec);
    const MatF q = test::random_matrix(g.tokens(), 5, 1).cast<float>();
    const MatF k = test::random_matrix(g.tokens(), 5, 2).cast<float>();
    const ExactRows rows(v, q, k, 0.5);
    for (int t : {0, 1, 2, 7, 13}) {
      const AttentionMap m = attention_map(rows, g, t);
      const VecD w = rows.row(t);
      ASSERT_EQ(m.grid.rows(), 3) << spec;
      ASSERT_EQ(m.grid.cols(), 4) << spec;
      ASSERT_EQ(m.prefix.size(), 2u) << spec;
      EXPECT_EQ(m.prefix[0], w(0)) << spec << " token " << t;
      EXPECT_EQ(m.prefix[1], w(1)) << spec << " token " << t;
      for (int r = 0; r < 3; ++r) {
        for (int c = 0; c < 4; ++c) EXPECT_EQ(m.grid(r, c), w(2 + 4 * r + c)) << spec << " token " << t;
      }
      EXPECT_EQ(m.query_row, t < 2 ? -1 : (t - 2) / 4) << spec << " token " << t;
      EXPECT_EQ(m.query_col, t < 2 ? -1 : (t - 2) % 4) << spec << " token " << t;
      EXPECT_NEAR(m.grid.sum() + m.prefix[0] + m.prefix[1], 1.0, 1e-12) << spec << " token " << t;
    }
  }
}

TEST(Maps, ParseTokensAcceptsIndicesAndCells) {
  const TokenGrid g{1, 14, 14};
  EXPECT_EQ(parse_tokens("0,7:7,196", g), (std::vector<int>{0, 1 + 7 * 14 + 7, 196}));
  EXPECT_THROW((void)parse_tokens("197", g), UsageError);
  EXPECT_THROW((void)parse_tokens("14:0", g), UsageError);
  EXPECT_THROW((void)parse_tokens("a", g), UsageError);
  EXPECT_THROW((void)parse_tokens("1,,2", g), UsageError);
}

// A token named twice, also once as an index and once as a cell, would repeat its map.
TEST(Maps, ParseTokensRefusesRepeats) {
  const TokenGrid g{1, 14, 14};
  for (const char* spec : {"5,5", "0,7:7,106", "7:7,7:7"}) {
    try {
      (void)parse_tokens(spec, g);
      ADD_FAILURE() << "accepted '" << spec << "'";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("listed twice"), std::string::npos) << e.what();
    }
  }
}

class MapsRunTest : public test::ScratchDirTest {};

// Every map of a run is attention_map of its head's row; an image's maps arrive together, ordered
// by variant, layer, head and token; a row without weights gets no map and is counted.
TEST_F(MapsRunTest, MapsOfEachImageInOrderAndNoneForDegenerateRows) {
  SynthOptions o;
  o.layers = 2;
  o.heads = 2;
  o.grid = TokenGrid{1, 3, 4};
  o.head_dim = 5;
  o.images = 3;
  // A seed whose random queries of tokens 5 and 0 all keep a positive entry (with d = 5, one row in
  // 32 has none and would be degenerate by chance): the only degenerate rows are the planted ones.
  o.seed = 1;
  // Layer 0, head 1 gets queries with no positive entry: linear:relu has phi(q) = 0 there, so
  // every row of that head is degenerate (softmax's are not).
  std::vector<ImageQKV> images;
  {
    DumpWriter writer(path("d.h5"), o.attributes(), DumpWriterOptions{});
    for (int i = 0; i < o.images; ++i) {
      ImageQKV img = synth_image(o, i);
      img.q[1] = -img.q[1].cwiseAbs() - MatF::Constant(o.tokens(), o.head_dim, 0.5f);
      writer.append(img);
      images.push_back(std::move(img));
    }
    writer.close();
  }
  DumpReader reader(path("d.h5"));
  const std::vector<Variant> variants = parse_variants("softmax,linear:relu");
  Selection sel;
  sel.images = {2, 0};
  sel.layers = {1, 0};
  const Selection r = resolve(reader.schema(), sel);
  const std::vector<int> tokens = {5, 0};
  std::vector<int> seen_images;
  long long maps = 0;
  const MapsRun run = run_maps(reader, r, variants, tokens, [&](int image, const std::vector<MapEntry>& got) {
    seen_images.push_back(image);
    // softmax: 2 layers x 2 heads x 2 tokens; linear:relu: the same less layer 0 head 1.
    ASSERT_EQ(got.size(), 8u + 6u) << "image " << image;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const MapEntry& e = got[i];
      const std::string where = "image " + std::to_string(image) + " variant " +
                                variants[e.variant].name() + " layer " + std::to_string(e.layer) +
                                " head " + std::to_string(e.head) + " token " + std::to_string(e.map.token);
      EXPECT_EQ(e.image, image) << where;
      EXPECT_FALSE(e.variant == 1 && e.layer == 0 && e.head == 1) << where << ": a degenerate row has a map";
      if (i > 0) {
        const MapEntry& p = got[i - 1];
        EXPECT_LT(std::tie(p.variant, p.layer, p.head, p.map.token),
                  std::tie(e.variant, e.layer, e.head, e.map.token))
            << where;
      }
      const ImageQKV& img = images[static_cast<std::size_t>(image)];
      const ExactRows rows(variants[e.variant], img.Q(e.layer, e.head), img.K(e.layer, e.head),
                           o.scale());
      const AttentionMap want = attention_map(rows, o.grid, e.map.token);
      EXPECT_EQ(e.map.grid, want.grid) << where;
      EXPECT_EQ(e.map.prefix, want.prefix) << where;
    }
    maps += static_cast<long long>(got.size());
  });
  EXPECT_EQ(seen_images, (std::vector<int>{2, 0}));
  EXPECT_EQ(run.maps, maps);
  EXPECT_EQ(run.maps, 28);
  EXPECT_EQ(run.degenerate_rows, 2 * 2) << "2 images x 2 tokens of linear:relu's layer 0, head 1";
}

// maps_images hands each image its own maps and its own degenerate rows; run_maps sums them.
TEST_F(MapsRunTest, EachImageCountsItsOwnDegenerateRows) {
  SynthOptions o;
  o.layers = 1;
  o.heads = 2;
  o.grid = TokenGrid{1, 2, 3};
  o.head_dim = 4;
  o.images = 3;
  {
    DumpWriter writer(path("d.h5"), o.attributes(), DumpWriterOptions{});
    for (int i = 0; i < o.images; ++i) {
      ImageQKV img = synth_image(o, i);
      // Positive queries and keys give every linear:relu row a positive denominator, except in
      // image 1, whose head 0 gets queries with no positive entry: every row degenerate.
      const MatF lift = MatF::Constant(o.tokens(), o.head_dim, 0.5f);
      for (int h = 0; h < o.heads; ++h) {
        img.q[static_cast<std::size_t>(h)] = img.q[static_cast<std::size_t>(h)].cwiseAbs() + lift;
        img.k[static_cast<std::size_t>(h)] = img.k[static_cast<std::size_t>(h)].cwiseAbs() + lift;
      }
      if (i == 1) img.q[0] = -img.q[0];
      writer.append(img);
    }
    writer.close();
  }
  DumpReader reader(path("d.h5"));
  const std::vector<Variant> variants = parse_variants("linear:relu");
  const Selection r = resolve(reader.schema(), Selection{});
  const std::vector<int> tokens = {0, 4, 6};
  std::vector<int> seen;
  std::vector<long long> degenerate, maps;
  maps_images(reader, r, variants, tokens, [&](MapsImage&& img) {
    seen.push_back(img.image);
    degenerate.push_back(img.degenerate_rows);
    maps.push_back(static_cast<long long>(img.maps.size()));
    for (const MapEntry& e : img.maps) EXPECT_EQ(e.image, img.image);
  });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(degenerate, (std::vector<long long>{0, 3, 0})) << "3 tokens of image 1's head 0";
  EXPECT_EQ(maps, (std::vector<long long>{6, 3, 6}));
  const MapsRun run = run_maps(reader, r, variants, tokens, [](int, const std::vector<MapEntry>&) {});
  EXPECT_EQ(run.maps, 15);
  EXPECT_EQ(run.degenerate_rows, 3);
}

}  // namespace
}  // namespace attnscope::analyses
