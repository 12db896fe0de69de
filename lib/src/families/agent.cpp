// agent (Agent attention, Han et al. ECCV 2024, as LeapLabTHU/Agent-Attention
// agent_transformer/models/agent_deit.py computes it): n agent tokens A (the image's queries
// pooled to a small grid; the dump keeps them per image), two softmax maps
//   G = softmax over keys of (s A K^T + B1)     (n x N: agents gather from the tokens)
//   T = softmax over agents of (s Q A^T + B2)   (N x n: tokens read from the agents)
// and W = T G: rows sum to 1, rank(W) <= n. B1 (agent_bias, n x N) and B2 (token_bias, N x n) are
// the position biases as the model formed them (CLS column and row included). A kernel family of
// width n: f_q(i) = T_i (token position i's bias row), f_k(j) = G_:j, normalised like linear
// attention (S_i = T_i.sum_j G_:j = 1 up to rounding, so the division changes nothing but makes a
// mask renormalise over the kept keys); outputs in linear time as T (G V). One convention: the
// paper's generalised agent attention with the code's biases; paper and code give the same rows.
#include "attnscope/family.hpp"

#include "../field_features.hpp"

namespace attnscope {
namespace {

/// Softmax of every row of logits in place (maximum subtracted, portable::exp).
void softmax_rows_in_place(Eigen::Ref<MatD> logits) {
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    const double top = logits.row(i).maxCoeff();
    double total = 0.0;
    for (Eigen::Index t = 0; t < logits.cols(); ++t)
      total += (logits(i, t) = portable::exp(logits(i, t) - top));
    logits.row(i) /= total;
  }
}

const MatD& agents_of(const Variant& v, Eigen::Index d) {
  const MatD& a = family_param(v, "agents", -1, d);
  if (a.rows() < 1) throw UsageError(v.name() + ": agents holds no agent");
  return a;
}

class Agent final : public KernelFamily {
 public:
  std::string_view name() const override { return "agent"; }
  std::string_view formula() const override {
    return "sum_a softmax_a(s q_i.A_a + B2_ia) softmax_j(s A_a.k_j + B1_aj), A the agents   (Agent "
           "attention, Han et al. 2024, agent_deit.py)";
  }
  MapRule map_rule() const override { return MapRule::None; }
  std::vector<std::string_view> params(const Variant& /*v*/) const override {
    return {"agents", "agent_bias", "token_bias"};
  }
  bool position_dependent() const override { return true; }
  std::vector<MagnitudeLaw> magnitude_laws() const override {
    return {MagnitudeLaw::LinearInvariant};
  }
  int feature_dim(const Variant& v, int d) const override {
    return static_cast<int>(agents_of(v, d).rows());
  }
  void query_features(const Variant& v, ConstRef<double> q, TokenPositions positions,
                      Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) const override {
    const MatD& agents = agents_of(v, q.cols());
    const MatD& bias = family_param(v, "token_bias", n_keys, agents.rows());
    for (Eigen::Index r = 0; r < q.rows(); ++r) {
      const Eigen::Index token = positions.at(r);
      if (token < 0 || token >= bias.rows()) {
        throw UsageError(v.name() + ": token " + std::to_string(token) + " has no token_bias row");
      }
      for (Eigen::Index a = 0; a < agents.rows(); ++a)
        out(r, a) = scale * q.row(r).dot(agents.row(a)) + bias(token, a);
    }
    softmax_rows_in_place(out);
  }
  void key_features(const Variant& v, ConstRef<double> /*q*/, ConstRef<double> k, double scale,
                    Eigen::Ref<MatD> out) const override {
    const MatD& agents = agents_of(v, k.cols());
    const MatD& bias = family_param(v, "agent_bias", agents.rows(), k.rows());
    MatD g(agents.rows(), k.rows());  // G: one row per agent, a softmax over the keys
    for (Eigen::Index a = 0; a < agents.rows(); ++a) {
      for (Eigen::Index j = 0; j < k.rows(); ++j)
        g(a, j) = scale * agents.row(a).dot(k.row(j)) + bias(a, j);
    }
    softmax_rows_in_place(g);
    out = g.transpose();
  }
  RowForm row_form(double S, int n_kept, double magnitude) const override {
    return normalised_row(S, n_kept, magnitude);
  }
  bool has_offset() const override { return false; }
  bool query_features_homogeneous(const Variant& /*v*/) const override { return false; }
};

}  // namespace

const AttentionFamily& family_agent() {
  static const Agent family;
  return family;
}

}  // namespace attnscope
