// TokenGrid windows: corners, edges, centre, prefix tokens, against a brute-force reference.
#include "attnscope/error.hpp"
#include "attnscope/layout.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>

namespace attnscope {
namespace {

std::string where(const TokenGrid& g, int t, int k) {
  return "grid prefix=" + std::to_string(g.prefix) + " " + std::to_string(g.height) + "x" +
         std::to_string(g.width) + " token " + std::to_string(t) + " k=" + std::to_string(k);
}

TEST(TokenGrid, CoordinatesFollowTheLayout) {
  const TokenGrid g{2, 3, 4};
  EXPECT_EQ(g.tokens(), 14);
  EXPECT_FALSE(g.on_grid(1));
  EXPECT_TRUE(g.on_grid(2));
  EXPECT_FALSE(g.on_grid(14));
  EXPECT_EQ(g.row(2 + 4 * 2 + 3), 2);
  EXPECT_EQ(g.col(2 + 4 * 2 + 3), 3);
  for (int t = g.prefix; t < g.tokens(); ++t) EXPECT_EQ(g.token(g.row(t), g.col(t)), t);
}

TEST(TokenGrid, WindowsMatchBruteForceEverywhere) {
  for (const TokenGrid g : {TokenGrid{1, 14, 14}, TokenGrid{0, 3, 5}, TokenGrid{2, 1, 7},
                            TokenGrid{0, 1, 1}, TokenGrid{3, 6, 2}}) {
    for (int k : {1, 3, 5, 7, 29}) {
      for (int t = 0; t < g.tokens(); ++t) {
        const std::vector<int> w = g.window(t, k);
        EXPECT_EQ(w, reference::window(g, t, k)) << where(g, t, k);
        EXPECT_EQ(g.window_size(t, k), static_cast<int>(w.size())) << where(g, t, k);
        std::vector<int> without = w;
        without.erase(std::remove(without.begin(), without.end(), t), without.end());
        EXPECT_EQ(g.neighbours(t, k), without) << where(g, t, k);
        if (g.on_grid(t)) {
          EXPECT_TRUE(std::find(w.begin(), w.end(), t) != w.end()) << where(g, t, k);
        } else {
          EXPECT_TRUE(w.empty()) << where(g, t, k);
        }
      }
    }
  }
}

TEST(TokenGrid, ClippedSizesAtCornerEdgeCentre) {
  const TokenGrid g{1, 14, 14};
  EXPECT_EQ(g.window_size(g.token(0, 0), 3), 4);
  EXPECT_EQ(g.window_size(g.token(0, 5), 3), 6);
  EXPECT_EQ(g.window_size(g.token(13, 13), 3), 4);
  EXPECT_EQ(g.window_size(g.token(6, 6), 3), 9);
  EXPECT_EQ(g.window_size(g.token(6, 6), 7), 49);
  EXPECT_EQ(g.window_size(g.token(0, 0), 7), 16);
  EXPECT_EQ(g.window_size(0, 3), 0);
  EXPECT_EQ(g.window(g.token(0, 0), 3),
            (std::vector<int>{g.token(0, 0), g.token(0, 1), g.token(1, 0), g.token(1, 1)}));
  EXPECT_EQ(g.window(g.token(4, 4), 1), std::vector<int>{g.token(4, 4)});
  EXPECT_TRUE(g.neighbours(g.token(4, 4), 1).empty());
}

TEST(TokenGrid, EvenOrNonPositiveWindowThrows) {
  const TokenGrid g{1, 4, 4};
  EXPECT_THROW((void)g.window(3, 2), UsageError);
  EXPECT_THROW((void)g.window_size(3, 0), UsageError);
  EXPECT_THROW((void)g.neighbours(3, -3), UsageError);
}

}  // namespace
}  // namespace attnscope
