// Reference: Agent attention as LeapLabTHU/Agent-Attention agent_transformer/models/agent_deit.py
// computes it. n agent tokens A (the queries' grid pooled to a small grid); two softmax maps,
//   G = softmax over keys of (s A K^T + B1)     (n x N: agents gather from the tokens),
//   T = softmax over agents of (s Q A^T + B2)   (N x n: tokens read from the agents),
// and W = T G, so rank(W) <= n and every row sums to 1. B1, B2 are the position biases as the model
// formed them (the released code: bilinear 7x7 tables resized to the grid plus row and column
// terms, and separate terms for the CLS token); empty means none.
#include "../field_support.hpp"

namespace attnscope::reference {
namespace {

/// Row-wise softmax of s X Y^T + B (B empty: none), the row maximum subtracted.
MatD softmax_rows(const MatD& x, const MatD& y, double scale, const MatD& bias) {
  MatD p(x.rows(), y.rows());
  for (Eigen::Index i = 0; i < x.rows(); ++i) {
    double top = -std::numeric_limits<double>::infinity();
    for (Eigen::Index j = 0; j < y.rows(); ++j) {
      p(i, j) = scale * support::dot(x, i, y, j) + (bias.size() ? bias(i, j) : 0.0);
      top = std::max(top, p(i, j));
    }
    double total = 0.0;
    for (Eigen::Index j = 0; j < y.rows(); ++j) {
      p(i, j) = std::exp(p(i, j) - top);
      total += p(i, j);
    }
    for (Eigen::Index j = 0; j < y.rows(); ++j) p(i, j) /= total;
  }
  return p;
}

struct AgentMaps {
  MatD gather;  // G, n x N
  MatD read;    // T, N x n
};

AgentMaps maps(const MatD& q, const MatD& k, const MatD& agents, double scale,
               const MatD& agent_bias, const MatD& token_bias) {
  if (agents.cols() != q.cols() || k.cols() != q.cols() || agents.rows() < 1) {
    throw UsageError("agent: agents must be n x " + std::to_string(q.cols()) + " with n >= 1 (" +
                     "the head_dim of q and k); got " + std::to_string(agents.rows()) + "x" +
                     std::to_string(agents.cols()));
  }
  if (agent_bias.size())
    field::expect_shape("agent", "agent_bias", agent_bias, agents.rows(), k.rows());
  if (token_bias.size())
    field::expect_shape("agent", "token_bias", token_bias, q.rows(), agents.rows());
  return {softmax_rows(agents, k, scale, agent_bias), softmax_rows(q, agents, scale, token_bias)};
}

}  // namespace

MatD agent_weights(const MatD& q, const MatD& k, const MatD& agents, double scale,
                   const MatD& agent_bias, const MatD& token_bias) {
  const AgentMaps m = maps(q, k, agents, scale, agent_bias, token_bias);
  return field::product(m.read, m.gather);
}

MatD agent_outputs(const MatD& q, const MatD& k, const MatD& v, const MatD& agents, double scale,
                   const MatD& agent_bias, const MatD& token_bias) {
  const AgentMaps m = maps(q, k, agents, scale, agent_bias, token_bias);
  return field::product(m.read, field::product(m.gather, v));  // the module's agent_v first
}

MatD pooled_agents(const MatD& q, int prefix, int grid_h, int grid_w, int pool_h, int pool_w) {
  if (prefix < 0 || grid_h < 1 || grid_w < 1 || pool_h < 1 || pool_w < 1 ||
      q.rows() != prefix + static_cast<Eigen::Index>(grid_h) * grid_w) {
    throw UsageError("pooled_agents: q has " + std::to_string(q.rows()) + " tokens, expected " +
                     std::to_string(prefix) + " prefix + " + std::to_string(grid_h) + "x" +
                     std::to_string(grid_w) + " grid, pooled to a positive " +
                     std::to_string(pool_h) + "x" + std::to_string(pool_w));
  }
  MatD agents = MatD::Zero(static_cast<Eigen::Index>(pool_h) * pool_w, q.cols());
  for (int a = 0; a < pool_h; ++a) {
    const int r0 = a * grid_h / pool_h, r1 = ((a + 1) * grid_h + pool_h - 1) / pool_h;
    for (int b = 0; b < pool_w; ++b) {
      const int c0 = b * grid_w / pool_w, c1 = ((b + 1) * grid_w + pool_w - 1) / pool_w;
      const Eigen::Index agent = static_cast<Eigen::Index>(a) * pool_w + b;
      const double count = static_cast<double>((r1 - r0) * (c1 - c0));
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) {
          const Eigen::Index token = prefix + static_cast<Eigen::Index>(r) * grid_w + c;
          for (Eigen::Index t = 0; t < q.cols(); ++t) agents(agent, t) += q(token, t) / count;
        }
      }
    }
  }
  return agents;
}

MatD weights_agent(const Variant&, const MatD&, const MatD&, double, const Mask*,
                   std::vector<int>&) {
  field::needs_layer_data("agent", "the layer's agent tokens and position biases", "agent_weights");
}

}  // namespace attnscope::reference
