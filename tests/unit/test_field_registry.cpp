// The families of the field in the registry (lib/src/families/mlla.cpp, rala.cpp, mala_rope.cpp,
// polaformer.cpp, agent.cpp): their weights, linear-time outputs and low-rank form against the
// plain-loop references (lib/src/reference/families/), with each head's parameters bound to the
// variant as the dump loop binds them; awkward sizes, tiny and huge magnitudes, masks, token
// permutations, PolaFormer's scale invariance (with its negative control), and the refusals
// (missing parameters, a RoPE table of the wrong size). The generic tests of every family
// (variant_specs.hpp) walk the families computed from q and k alone; these take the others.
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"
#include "compare.hpp"
#include "random_inputs.hpp"
#include "reference.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

namespace attnscope {
namespace {

namespace ref = reference;

constexpr std::uint64_t kSeed = 20251128;
constexpr double kTol = 1e-12;  // double against double, relative to the largest |want|
constexpr std::array<int, 5> kN{1, 2, 7, 50, 63};
constexpr std::array<int, 3> kD{2, 6, 16};  // RoPE turns pairs: even head dims
constexpr std::array<double, 4> kMagnitudes{1.0, 1e-8, 1e8, 1e30};

/// The field's families by spec, every convention each computes.
const std::vector<std::string>& field_specs() {
  static const std::vector<std::string> specs{"mlla@paper",
                                              "mlla@code",
                                              "rala@paper",
                                              "rala@code",
                                              "mala_rope@paper",
                                              "mala_rope@code",
                                              "polaformer:same@paper",
                                              "polaformer:same@code",
                                              "polaformer:opposite@paper",
                                              "polaformer:opposite@code",
                                              "agent@code"};
  return specs;
}

::testing::AssertionResult relatively_near(const MatD& got, const MatD& want, double tol,
                                           const std::string& config) {
  if (got.rows() != want.rows() || got.cols() != want.cols()) {
    return ::testing::AssertionFailure() << config << ": shape " << got.rows() << "x" << got.cols()
                                         << " against " << want.rows() << "x" << want.cols();
  }
  const double top = want.size() ? want.cwiseAbs().maxCoeff() : 0.0;
  if (top == 0.0) return test::matrices_near(got, want, 0.0, config);
  return test::matrices_near(MatD(got / top), MatD(want / top), tol, config);
}

/// One head: inputs, the parameters a dump would hold for it, and its references.
struct Head {
  MatD q, k, v;
  double scale = 0.0;
  ref::Rotation rotation;
  VecD feature_scale, exponent;
  MatD agents, agent_bias, token_bias;
  std::shared_ptr<FamilyParams> params = std::make_shared<FamilyParams>();
};

Head random_head(int n, int d, double magnitude, std::uint64_t seed) {
  Head h;
  const test::Qkv in = test::random_qkv(n, d, d + 1, seed);  // dv odd: torch.chunk's halves differ
  h.q = magnitude * in.q;
  h.k = magnitude * in.k;
  h.v = in.v;
  h.scale = 1.0 / std::sqrt(static_cast<double>(d));
  const MatD angles = 3.0 * test::random_matrix(n, d / 2, seed + 11);
  h.rotation = ref::rotation_from_angles(angles);
  h.feature_scale = (test::random_matrix(d, 1, seed + 12).array().abs() + 0.5).matrix();
  h.exponent = (1.0 + 2.0 / (1.0 + (-test::random_matrix(d, 1, seed + 13)).array().exp())).matrix();
  const int agents = std::max(1, std::min(n, 4));
  h.agents = magnitude * test::random_matrix(agents, d, seed + 14);
  h.agent_bias = 0.3 * test::random_matrix(agents, n, seed + 15);
  h.token_bias = 0.3 * test::random_matrix(n, agents, seed + 16);
  FamilyParams& p = *h.params;
  p.values["rope_cos"] = h.rotation.cos;
  p.values["rope_sin"] = h.rotation.sin;
  p.values["feature_scale"] = h.feature_scale.transpose();
  p.values["exponent"] = h.exponent.transpose();
  p.values["agents"] = h.agents;
  p.values["agent_bias"] = h.agent_bias;
  p.values["token_bias"] = h.token_bias;
  return h;
}

/// The reference's weights of a variant (and its degenerate rows).
MatD reference_weights(const Variant& v, const Head& h, std::vector<int>* degenerate) {
  const std::string family(v.family->name());
  if (family == "mlla") return ref::mlla_weights(v.convention, h.q, h.k, h.rotation, degenerate);
  if (family == "rala")
    return ref::rala_weights(v.convention, h.q, h.k, h.scale, h.rotation, degenerate);
  if (family == "mala_rope")
    return ref::mala_rope_weights(v.convention, h.q, h.k, h.scale, h.rotation, degenerate);
  if (family == "polaformer") {
    std::vector<int> same, opposite;
    const ref::PolaMaps m = ref::polaformer_weights(v.convention, h.q, h.k, h.feature_scale,
                                                    h.exponent, &same, &opposite);
    if (degenerate) *degenerate = v.part == 0 ? same : opposite;
    return v.part == 0 ? m.same : m.opposite;
  }
  if (family == "agent")
    return ref::agent_weights(h.q, h.k, h.agents, h.scale, h.agent_bias, h.token_bias);
  throw std::logic_error("no reference for " + family);
}

/// The model's output as the released module forms it (keys and values summed first).
MatD reference_outputs(const Variant& v, const Head& h) {
  const std::string family(v.family->name());
  if (family == "mlla") return ref::mlla_outputs(v.convention, h.q, h.k, h.v, h.rotation);
  if (family == "rala") return ref::rala_outputs(v.convention, h.q, h.k, h.v, h.scale, h.rotation);
  if (family == "mala_rope")
    return ref::mala_rope_outputs(v.convention, h.q, h.k, h.v, h.scale, h.rotation);
  if (family == "polaformer")
    return ref::polaformer_outputs(v.convention, h.q, h.k, h.v, h.feature_scale, h.exponent);
  if (family == "agent")
    return ref::agent_outputs(h.q, h.k, h.v, h.agents, h.scale, h.agent_bias, h.token_bias);
  throw std::logic_error("no reference for " + family);
}

std::string where(const std::string& spec, int n, int d, double magnitude, std::uint64_t seed) {
  std::ostringstream os;
  os << spec << " N=" << n << " d=" << d << " magnitude=" << magnitude << " seed=" << seed;
  return os.str();
}

TEST(FieldRegistry, ListsTwelveFamiliesAndTheReleasedMalaByItsDumpName) {
  EXPECT_GE(all_families().size(), 12u) << known_families();
  for (const char* name : {"mlla", "rala", "mala_rope", "polaformer", "agent"}) {
    EXPECT_NO_THROW((void)find_family(name)) << name;
  }
  // Dumps of the released MALA name it mala@code+rope: the mala family hands that convention over.
  const Variant v = parse_variant("mala@code+rope");
  EXPECT_EQ(v.name(), "mala_rope:elu1@code");
  EXPECT_TRUE(v.supports());
  EXPECT_FALSE(v.rows_sum_to_one());
  EXPECT_EQ(parse_variant("mala@code").name(), "mala:elu1@code");  // negative control: no RoPE
  EXPECT_FALSE(parse_variant("mala@code").needs_params());
  // PolaFormer's two maps by the map slot; the same-sign map by default.
  EXPECT_EQ(parse_variant("polaformer@code").name(), "polaformer:same@code");
  EXPECT_EQ(parse_variant("polaformer:opposite").part, 1);
  EXPECT_THROW((void)parse_variant("polaformer:relu"), UsageError);
  EXPECT_TRUE(parse_variant("polaformer@paper").rows_sum_to_one());
  EXPECT_FALSE(parse_variant("polaformer@code").rows_sum_to_one());
  EXPECT_TRUE(parse_variant("agent").rows_sum_to_one());
  EXPECT_FALSE(parse_variant("mlla@paper").rows_sum_to_one());
}

TEST(FieldRegistry, WeightsOutputsAndLowRankFormEqualTheReferences) {
  std::uint64_t seed = kSeed;
  int cases = 0;
  for (const std::string& spec : field_specs()) {
    for (int n : kN) {
      for (int d : kD) {
        for (double magnitude : kMagnitudes) {
          ++seed;
          const Head h = random_head(n, d, magnitude, seed);
          const Variant v = parse_variant(spec).with_params(h.params);
          const std::string cfg = where(spec, n, d, magnitude, seed);
          std::vector<int> want_degenerate;
          const MatD want = reference_weights(v, h, &want_degenerate);
          Diagnostics diag;
          const MatD w = attention_weights<double>(v, h.q, h.k, h.scale, nullptr, &diag);
          // Rounding of an entry is relative to the size of its terms, |z_i| |m_j| (W = Z M), not
          // to the entry: a rotated numerator that cancels to nearly 0 (q and k at right angles
          // after ELU+1 at 1e8) is rounding in both computations.
          const LowRankForm lr = low_rank_form<double>(v, h.q, h.k, h.scale);
          const double terms = lr.Z.rowwise().norm().maxCoeff() * lr.M.colwise().norm().maxCoeff();
          const double size = std::max(want.cwiseAbs().maxCoeff(), terms);
          const double v_size = h.v.cwiseAbs().maxCoeff() * static_cast<double>(n);
          ASSERT_LE((w - want).cwiseAbs().maxCoeff(), kTol * size) << cfg << " weights";
          EXPECT_EQ(diag.degenerate_rows, want_degenerate) << cfg;
          // Linear-time outputs against the released module's route, on the channels the map
          // weighs.
          const MatD o = attention_outputs<double>(v, h.q, h.k, h.v, h.scale);
          const auto [c0, nc] = v.family->output_columns(v, static_cast<int>(h.v.cols()));
          ASSERT_LE((o.middleCols(c0, nc) - reference_outputs(v, h).middleCols(c0, nc))
                        .cwiseAbs()
                        .maxCoeff(),
                    kTol * size * v_size)
              << cfg << " outputs";
          ASSERT_LE((o - ref::apply_weights(want, h.v)).cwiseAbs().maxCoeff(), kTol * size * v_size)
              << cfg << " outputs = W V";
          ASSERT_LE((MatD(lr.Z * lr.M) - want).cwiseAbs().maxCoeff(), kTol * size) << cfg << " Z M";
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases,
            static_cast<int>(field_specs().size() * kN.size() * kD.size() * kMagnitudes.size()));
}

TEST(FieldRegistry, FloatInputsGiveTheDoubleRowsRoundedOnce) {
  for (const std::string& spec : field_specs()) {
    const Head h = random_head(50, 16, 1.0, kSeed + 7);
    const MatD q = test::rounded<float>(h.q), k = test::rounded<float>(h.k);
    const Variant v = parse_variant(spec).with_params(h.params);
    const MatD want = attention_weights<double>(v, q, k, h.scale);
    const MatF got = attention_weights<float>(v, q.cast<float>(), k.cast<float>(), h.scale);
    EXPECT_TRUE(relatively_near(MatD(got.cast<double>()), want, 1e-6, spec + " float"));
  }
}

/// The independent masked rows: each family's row form over the kept keys (references have no
/// masks).
TEST(FieldRegistry, MasksRederiveEachRowOverTheKeptKeys) {
  const int n = 40, d = 8;
  const Head h = random_head(n, d, 1.0, kSeed + 3);
  const Mask mask = test::random_mask(n, n, 0.6, kSeed + 4, 2);
  for (const std::string& spec : field_specs()) {
    const Variant v = parse_variant(spec).with_params(h.params);
    Diagnostics diag;
    const MatD w = attention_weights<double>(v, h.q, h.k, h.scale, &mask, &diag);
    const KernelFeatures f = kernel_features(v, h.q, h.k, h.scale);
    const double eps = v.convention == Convention::Code && v.family->name() != "agent" ? 1e-6 : 0.0;
    const bool mala = v.family->name() == "mala_rope";
    MatD want = MatD::Zero(n, n);
    for (int i = 0; i < n; ++i) {
      double S = 0.0;
      int kept = 0;
      for (int j = 0; j < n; ++j) {
        if (!mask(i, j)) continue;
        S += f.norm_q().row(i).dot(f.norm_k().row(j));
        ++kept;
      }
      for (int j = 0; j < n && kept > 0; ++j) {
        if (!mask(i, j)) continue;
        const double num = f.q.row(i).dot(f.k.row(j));
        want(i, j) = mala ? (1.0 + 1.0 / (S + eps)) * num - S / kept : num / (S + kept * eps);
      }
    }
    EXPECT_TRUE(relatively_near(w, want, kTol, spec + " masked"));
    EXPECT_EQ(diag.degenerate_rows, (std::vector<int>{0, 1})) << spec;  // the rows that keep no key
    // The masked outputs are the masked weights times V.
    EXPECT_TRUE(relatively_near(attention_outputs<double>(v, h.q, h.k, h.v, h.scale, &mask),
                                ref::apply_weights(w, h.v), kTol, spec + " masked outputs"));
  }
}

/// Renumbering the tokens (q, k, and every per-token parameter) renumbers W: W' = P W P^T.
TEST(FieldRegistry, TokenPermutationPermutesTheWeights) {
  const int n = 30, d = 6;
  const Head h = random_head(n, d, 1.0, kSeed + 5);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(kSeed));
  const auto rows = [&](const MatD& m) {
    MatD out(m.rows(), m.cols());
    for (int i = 0; i < n; ++i) out.row(i) = m.row(perm[static_cast<std::size_t>(i)]);
    return out;
  };
  const auto cols = [&](const MatD& m) {
    MatD out(m.rows(), m.cols());
    for (int j = 0; j < n; ++j) out.col(j) = m.col(perm[static_cast<std::size_t>(j)]);
    return out;
  };
  auto permuted = std::make_shared<FamilyParams>(*h.params);
  permuted->values["rope_cos"] = rows(h.rotation.cos);
  permuted->values["rope_sin"] = rows(h.rotation.sin);
  permuted->values["token_bias"] = rows(h.token_bias);
  permuted->values["agent_bias"] = cols(h.agent_bias);
  for (const std::string& spec : field_specs()) {
    const MatD w =
        attention_weights<double>(parse_variant(spec).with_params(h.params), h.q, h.k, h.scale);
    const MatD wp = attention_weights<double>(parse_variant(spec).with_params(permuted), rows(h.q),
                                              rows(h.k), h.scale);
    EXPECT_TRUE(relatively_near(wp, cols(rows(w)), kTol, spec + " permuted"));
    // Negative control: the tokens renumbered but not their parameters changes the weights (but
    // for PolaFormer, whose parameters are per channel, not per token).
    if (spec.rfind("polaformer", 0) == 0) continue;
    const MatD wrong = attention_weights<double>(parse_variant(spec).with_params(h.params),
                                                 rows(h.q), rows(h.k), h.scale);
    EXPECT_GT((wrong - cols(rows(w))).cwiseAbs().maxCoeff(), 1e-6 * w.cwiseAbs().maxCoeff())
        << spec;
  }
}

/// PolaFormer's paper maps with one exponent p for every channel: f(a x) = a^p f(x), so scaling
/// q leaves each row unchanged; with exponents that differ it does not (negative control), nor in
/// the code convention at a small scale (its eps).
TEST(FieldRegistry, PolaFormerPaperRowsIgnoreTheQueryScaleWithOneExponent) {
  const int n = 20, d = 8;
  Head h = random_head(n, d, 1.0, kSeed + 6);
  auto uniform = std::make_shared<FamilyParams>(*h.params);
  uniform->values["exponent"] = MatD::Constant(1, d, 2.5);
  for (const char* spec : {"polaformer:same@paper", "polaformer:opposite@paper"}) {
    const Variant v = parse_variant(spec).with_params(uniform);
    const MatD w = attention_weights<double>(v, h.q, h.k, h.scale);
    EXPECT_TRUE(relatively_near(attention_weights<double>(v, MatD(7.0 * h.q), h.k, h.scale), w,
                                kTol, spec));
    const Variant varied = parse_variant(spec).with_params(h.params);
    const MatD wv = attention_weights<double>(varied, h.q, h.k, h.scale);
    EXPECT_GT((attention_weights<double>(varied, MatD(7.0 * h.q), h.k, h.scale) - wv)
                  .cwiseAbs()
                  .maxCoeff(),
              1e-6)
        << spec << ": exponents that differ";
  }
  const Variant code = parse_variant("polaformer@code").with_params(uniform);
  const MatD wc = attention_weights<double>(code, MatD(1e-3 * h.q), h.k, h.scale);
  EXPECT_GT(
      (attention_weights<double>(code, MatD(1e-4 * h.q), h.k, h.scale) - wc).cwiseAbs().maxCoeff(),
      1e-3 * wc.cwiseAbs().maxCoeff());
}

TEST(FieldRegistry, MissingOrMisshapenParametersAreRefusedByName) {
  const Head h = random_head(10, 4, 1.0, kSeed + 8);
  const std::vector<std::pair<std::string, std::string>> needs{{"mlla", "rope_cos"},
                                                               {"rala", "rope_cos"},
                                                               {"mala@code+rope", "rope_cos"},
                                                               {"polaformer", "feature_scale"},
                                                               {"agent", "agents"}};
  for (const auto& [spec, param] : needs) {
    try {
      (void)attention_weights<double>(parse_variant(spec), h.q, h.k, h.scale);
      ADD_FAILURE() << spec << " computed without its parameters";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(param), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("/layers/L/"), std::string::npos) << e.what();
    }
  }
  // A RoPE table of another token count.
  auto short_table = std::make_shared<FamilyParams>(*h.params);
  short_table->values["rope_cos"] = h.rotation.cos.topRows(9);
  try {
    (void)attention_weights<double>(parse_variant("mlla").with_params(short_table), h.q, h.k,
                                    h.scale);
    ADD_FAILURE() << "a 9-token RoPE table was taken for 10 tokens";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("expected 10 x 2"), std::string::npos) << e.what();
  }
  // Without parameters the families of q and k alone are unchanged (negative control).
  EXPECT_NO_THROW((void)attention_weights<double>(parse_variant("mala@code"), h.q, h.k, h.scale));
}

/// RALA's keys depend on every query of the head: the weights of a few queries alone are not
/// those rows of the head's (so every analysis hands attention_weights the head's queries).
TEST(FieldRegistry, RalaKeysReadTheMeanOfTheQueriesGiven) {
  const Head h = random_head(12, 4, 1.0, kSeed + 9);
  const Variant v = parse_variant("rala@code").with_params(h.params);
  const MatD all = attention_weights<double>(v, h.q, h.k, h.scale);
  const MatD first = attention_weights<double>(v, MatD(h.q.topRows(3)), h.k, h.scale);
  EXPECT_GT((first - all.topRows(3)).cwiseAbs().maxCoeff(), 1e-9);
  const Variant mlla = parse_variant("mlla@code").with_params(h.params);  // negative control
  EXPECT_TRUE(relatively_near(attention_weights<double>(mlla, MatD(h.q.topRows(3)), h.k, h.scale),
                              MatD(attention_weights<double>(mlla, h.q, h.k, h.scale).topRows(3)),
                              kTol, "mlla rows"));
}

}  // namespace
}  // namespace attnscope
