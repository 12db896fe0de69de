// Attention maps: grid layout of a row, prefix weights, token parsing.
#include "attnscope/analyses/maps.hpp"
#include "attnscope/error.hpp"
#include "random_inputs.hpp"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace attnscope::analyses
