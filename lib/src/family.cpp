// The family registry (family.hpp): the list of families, built from lib/src/families/ (the build
// writes one ATTNSCOPE_FAMILY(name) line per file there), and the defaults of the interface.
#include "attnscope/family.hpp"

#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"
#include "feature_map_apply.hpp"

#include <cmath>

namespace attnscope {

#define ATTNSCOPE_FAMILY(name) const AttentionFamily& family_##name();
#include "family_list.inc"
#undef ATTNSCOPE_FAMILY

const std::vector<const AttentionFamily*>& all_families() {
  static const std::vector<const AttentionFamily*> list = [] {
    std::vector<const AttentionFamily*> out;
#define ATTNSCOPE_FAMILY(name) out.push_back(&family_##name());
#include "family_list.inc"
#undef ATTNSCOPE_FAMILY
    return out;
  }();
  return list;
}

std::string example_spec(const AttentionFamily& family) {
  return std::string(family.name()) + (family.map_rule() == MapRule::Required ? ":relu" : "");
}

std::string known_families() {
  std::string out;
  for (const AttentionFamily* f : all_families()) {
    if (!out.empty()) out += ", ";
    out += f->name();
  }
  return out;
}

const AttentionFamily* family_named(std::string_view name) {
  for (const AttentionFamily* f : all_families()) {
    if (f->name() == name) return f;
  }
  return nullptr;
}

const AttentionFamily& find_family(std::string_view name) {
  if (const AttentionFamily* f = family_named(name)) return *f;
  throw UsageError("unknown attention family '" + std::string(name) + "'; known: " + known_families());
}

bool AttentionFamily::supports(const Variant& v, std::string* why) const {
  if (v.convention != Convention::CodeRope) return true;
  if (why) {
    *why = v.name() + ": code+rope names MALA's released form (RoPE in the numerator only: "
                      "mala@code+rope, the family mala_rope); " + std::string(name()) + " has no such convention";
  }
  return false;
}

std::pair<int, int> AttentionFamily::output_columns(const Variant& /*v*/, int dv) const { return {0, dv}; }

const MatD& family_param(const Variant& v, std::string_view name, Eigen::Index rows, Eigen::Index cols) {
  const auto where = std::string(" (the layer's family parameter ") + std::string(name) +
                     (name == "agents" ? ", /layers/L/agents of a dump" : ", /layers/L/family_params of a dump") +
                     ", docs/dump-format.md)";
  const MatD* m = nullptr;
  if (v.params) {
    const auto it = v.params->values.find(name);
    if (it != v.params->values.end()) m = &it->second;
  }
  if (m == nullptr) throw UsageError(v.name() + ": needs " + std::string(name) + where + "; none is given");
  const auto str = [](Eigen::Index x) { return x >= 0 ? std::to_string(x) : std::string("any"); };
  if ((rows >= 0 && m->rows() != rows) || (cols >= 0 && m->cols() != cols)) {
    throw UsageError(v.name() + ": " + std::string(name) + where + " is " + std::to_string(m->rows()) + " x " +
                     std::to_string(m->cols()) + ", expected " + str(rows) + " x " + str(cols));
  }
  return *m;
}

bool AttentionFamily::rows_sum_to_one(const Variant& v) const { return v.convention != Convention::CodeRope; }

int KernelFamily::feature_dim(const Variant& v, int d) const { return v.map.out_dim(d); }

double KernelFamily::feature_factor(const Variant& v, double scale, Eigen::Index n_keys) const {
  if (v.convention == Convention::Paper) return 1.0;
  return std::sqrt(scale / static_cast<double>(n_keys));
}

void KernelFamily::query_features(const Variant& v, ConstRef<double> q, TokenPositions /*positions*/,
                                  Eigen::Index n_keys, double scale, Eigen::Ref<MatD> out) const {
  detail::apply_feature_map_into<double>(v.map, q, feature_factor(v, scale, n_keys), out);
}

void KernelFamily::key_features(const Variant& v, ConstRef<double> /*q*/, ConstRef<double> k,
                                double scale, Eigen::Ref<MatD> out) const {
  detail::apply_feature_map_into<double>(v.map, k, feature_factor(v, scale, k.rows()), out);
}

RowForm KernelFamily::variant_row_form(const Variant& /*v*/, double S, int n_kept, double magnitude) const {
  return row_form(S, n_kept, magnitude);
}

bool KernelFamily::query_features_homogeneous(const Variant& v) const {
  return v.map.positively_homogeneous();
}

RowForm normalised_row(double S, int n_kept, double magnitude) {
  if (n_kept == 0 || !(std::abs(S) > kTinyDenominator * magnitude)) return {};  // also S == 0
  return {1.0 / S, 0.0, false};
}

}  // namespace attnscope
