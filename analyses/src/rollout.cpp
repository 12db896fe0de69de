// Attention rollout (rollout.hpp): heads fused in order, the identity added, rows normalised,
// layers multiplied with the fixed-order products of portable_math.hpp.
#include "attnscope/analyses/rollout.hpp"

#include "attnscope/analyses/confusion.hpp"
#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/lane_sum.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/portable_math.hpp"
#include "float_softmax_rows.hpp"

#include <algorithm>
#include <cmath>

namespace attnscope::analyses {

HeadFusion parse_head_fusion(const std::string& s) {
  if (s == "mean") return HeadFusion::Mean;
  if (s == "max") return HeadFusion::Max;
  if (s == "min") return HeadFusion::Min;
  throw UsageError("--fusion: expected mean, max or min, found '" + s + "'");
}

std::string to_string(HeadFusion f) {
  switch (f) {
    case HeadFusion::Mean:
      return "mean";
    case HeadFusion::Max:
      return "max";
    case HeadFusion::Min:
      return "min";
  }
  return "?";
}

MatD rollout_step(const std::vector<MatD>& heads, HeadFusion fusion, int* fixed) {
  if (heads.empty()) throw UsageError("rollout: a layer without heads");
  MatD a = heads.front();
  for (std::size_t h = 1; h < heads.size(); ++h) {
    if (fusion == HeadFusion::Mean) a += heads[h];
    if (fusion == HeadFusion::Max) a = a.cwiseMax(heads[h]);
    if (fusion == HeadFusion::Min) a = a.cwiseMin(heads[h]);
  }
  if (fusion == HeadFusion::Mean) a /= static_cast<double>(heads.size());
  a.diagonal().array() += 1.0;
  for (Eigen::Index i = 0; i < a.rows(); ++i) {
    const double* row = a.row(i).data();
    const double sum = lane_sum(a.cols(), [row](Eigen::Index j) { return row[j]; });
    const double magnitude = lane_sum(a.cols(), [row](Eigen::Index j) { return std::abs(row[j]); });
    if (sum > kTinyDenominator * magnitude) {
      a.row(i) /= sum;
    } else {
      a.row(i).setZero();
      a(i, i) = 1.0;
      if (fixed != nullptr) ++*fixed;
    }
  }
  return a;
}

MatD rollout(const std::vector<std::vector<MatD>>& layers, HeadFusion fusion, int* fixed) {
  if (layers.empty()) throw UsageError("rollout: no layer");
  MatD r = rollout_step(layers.front(), fusion, fixed);
  MatD next(r.rows(), r.cols());
  for (std::size_t l = 1; l < layers.size(); ++l) {
    const MatD a = rollout_step(layers[l], fusion, fixed);
    portable::product(a, r, next);
    r.swap(next);
  }
  return r;
}

void carry_cls_row(const MatD& step, VecD& v, VecD& next) {
  // next_j = sum_i v_i A(i, j), summed in i's order for every j (vectorised across j).
  next.resize(v.size());
  next.setZero();
  for (Eigen::Index i = 0; i < step.rows(); ++i) {
    const double vi = v(i);
    const double* row = step.row(i).data();
    double* out = next.data();
    for (Eigen::Index j = 0; j < step.cols(); ++j) out[j] += vi * row[j];
  }
  v.swap(next);
}

VecD rollout_cls_row(const std::vector<std::vector<MatD>>& layers, HeadFusion fusion, int* fixed) {
  if (layers.empty()) throw UsageError("rollout: no layer");
  // The steps are independent: formed on OpenMP threads, their counts added in the layers' order.
  std::vector<MatD> steps(layers.size());
  std::vector<int> counts(layers.size(), 0);
  parallel_for(static_cast<int>(layers.size()), [&](int l) {
    const auto ul = static_cast<std::size_t>(l);
    steps[ul] = rollout_step(layers[ul], fusion, &counts[ul]);
  });
  if (fixed != nullptr)
    for (int c : counts) *fixed += c;
  VecD v = steps.back().row(0).transpose();
  VecD next(v.size());
  for (std::size_t l = steps.size() - 1; l-- > 0;) carry_cls_row(steps[l], v, next);
  return v;
}

std::vector<int> layers_in_model_order(const DumpSchema& schema, std::vector<int> layers) {
  std::stable_sort(layers.begin(), layers.end(),
                   [&](int a, int b) { return schema.model_layer(a) < schema.model_layer(b); });
  return layers;
}

namespace {

/// One head's N x N weights for the rollout (rollout_images' doc) into w; returns its degenerate
/// rows.
int rollout_head_weights(const Variant& v, const MatF& q, const MatF& k, double scale, bool reference, MatD& w) {
  if (reference) {
    const ExactRows rows(v, q, k, scale);
    w.resize(rows.tokens(), rows.tokens());
    for (int i = 0; i < rows.tokens(); ++i) rows.row(i, w.row(i).data());
    return rows.degenerate_count();
  }
  if (detail::takes_float_softmax(v) && detail::float_softmax_weights(q, k, scale, w))
    return 0;
  Diagnostics diag;
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  w = attention_weights<double>(v, qd, kd, scale, nullptr, &diag);
  return static_cast<int>(diag.degenerate_rows.size());
}

}  // namespace

RolloutRow rollout_of_heads(const Variant& v, const std::vector<std::vector<MatF>>& q,
                            const std::vector<std::vector<MatF>>& k, double scale,
                            HeadFusion fusion, bool reference) {
  if (q.empty() || q.size() != k.size()) {
    throw UsageError("rollout: expected q and k of the same layers, at least one");
  }
  std::vector<std::vector<MatD>> layers(q.size());
  RolloutRow out;
  for (std::size_t l = 0; l < q.size(); ++l) {
    if (q[l].size() != q[0].size() || k[l].size() != q[l].size() || q[l].empty()) {
      throw UsageError("rollout: every layer needs the same heads, at least one, in q and k");
    }
    layers[l].resize(q[l].size());
    for (std::size_t h = 0; h < q[l].size(); ++h) {
      out.degenerate_rows += rollout_head_weights(v, q[l][h], k[l][h], scale, reference, layers[l][h]);
    }
  }
  int fixed = 0;
  if (reference) {
    const MatD r = rollout_reference(layers, fusion, &fixed);
    out.cls.assign(r.row(0).data(), r.row(0).data() + r.cols());
  } else {
    const VecD r = rollout_cls_row(layers, fusion, &fixed);
    out.cls.assign(r.data(), r.data() + r.size());
  }
  out.fixed_rows = fixed;
  return out;
}

bool rollout_holds_every_head(const DumpSchema& schema, const Selection& resolved, std::size_t variants,
                              bool reference) {
  const auto n = static_cast<double>(schema.attrs.num_tokens);
  const double all_heads =
      8.0 * n * n * static_cast<double>(resolved.layers.size() * resolved.heads.size() * variants);
  const std::size_t budget = resolved.max_memory == 0 ? kDefaultMaxMemory : resolved.max_memory;
  return reference || all_heads <= static_cast<double>(budget);
}

void rollout_images(DumpReader& reader, const Selection& resolved,
                    const std::vector<Variant>& variants, HeadFusion fusion, bool reference,
                    const std::function<void(RolloutImage&&)>& sink) {
  const DumpSchema& schema = reader.schema();
  if (schema.attrs.grid.prefix < 1) {
    throw InputError(schema.files.front(), "attribute 'prefix_tokens'",
                     "at least 1: a CLS token, whose row of the rollout is the map", "0");
  }
  const double scale = schema.attrs.scale;
  const std::size_t nh = resolved.heads.size();
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s)
    layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);
  const std::vector<int> order = layers_in_model_order(schema, resolved.layers);
  Selection sel = resolved;
  sel.need_v = false;

  if (!rollout_holds_every_head(schema, resolved, variants.size(), reference)) {
    std::vector<MatD> heads(nh);
    std::vector<int> dead(nh, 0);
    MatD step;
    VecD v, next;
    for_each_image_batch(reader, sel, 1, [&](const std::vector<ImageHeads>& images) {
      const ImageHeads& image = images.front();
      RolloutImage done;
      done.image = image.front().image;
      for (const Variant& var : variants) {
        std::int64_t degenerate = 0;
        int fixed = 0;
        for (std::size_t o = order.size(); o-- > 0;) {
          const std::size_t ls = static_cast<std::size_t>(layer_slot[order[o]]);
          parallel_for(static_cast<int>(nh), [&](int hs) {
            const HeadView& hv = image[ls * nh + static_cast<std::size_t>(hs)];
            in_head(hv.image, hv.layer, hv.head, [&] {
              dead[static_cast<std::size_t>(hs)] =
                  rollout_head_weights(head_variant(hv.own_variant != nullptr ? *hv.own_variant : var, hv),
                                       hv.q, hv.k, scale, false, heads[static_cast<std::size_t>(hs)]);
            });
          });
          for (int c : dead) degenerate += c;
          step = rollout_step(heads, fusion, &fixed);
          if (o + 1 == order.size()) {
            v = step.row(0).transpose();
          } else {
            carry_cls_row(step, v, next);
          }
        }
        done.cls.emplace_back(v.data(), v.data() + v.size());
        done.fixed_rows.push_back(fixed);
        done.degenerate_rows.push_back(degenerate);
      }
      sink(std::move(done));
    });
    return;
  }

  // [variant][slot]: each slot written by one thread per image.
  std::vector<std::vector<MatD>> weights(variants.size(),
                                         std::vector<MatD>(resolved.layers.size() * nh));
  std::vector<std::vector<int>> dead(variants.size(),
                                     std::vector<int>(resolved.layers.size() * nh, 0));
  auto on_head = [&](const HeadView& hv) {
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      in_head(hv.image, hv.layer, hv.head, [&] {
        dead[vi][s] = rollout_head_weights(head_variant(variants, vi, hv), hv.q, hv.k, scale,
                                           reference, weights[vi][s]);
      });
    }
  };
  auto on_image = [&](int image) {
    RolloutImage done;
    done.image = image;
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      std::vector<std::vector<MatD>> layers;
      std::int64_t degenerate = 0;
      for (int l : order) {
        const std::size_t ls = static_cast<std::size_t>(layer_slot[l]);
        std::vector<MatD> heads;
        for (std::size_t hs = 0; hs < nh; ++hs) {
          heads.push_back(std::move(weights[vi][ls * nh + hs]));
          degenerate += dead[vi][ls * nh + hs];
        }
        layers.push_back(std::move(heads));
      }
      int fixed = 0;
      // The heads' matrices go back to `weights` below, so that the next image reuses them.
      auto give_back = [&] {
        for (std::size_t o = 0; o < order.size(); ++o) {
          const std::size_t ls = static_cast<std::size_t>(layer_slot[order[o]]);
          for (std::size_t hs = 0; hs < nh; ++hs)
            weights[vi][ls * nh + hs] = std::move(layers[o][hs]);
        }
      };
      if (reference) {
        const MatD r = rollout_reference(layers, fusion, &fixed);
        done.cls.emplace_back(r.row(0).data(), r.row(0).data() + r.cols());
      } else {
        const VecD r = rollout_cls_row(layers, fusion, &fixed);
        done.cls.emplace_back(r.data(), r.data() + r.size());
      }
      give_back();
      done.fixed_rows.push_back(fixed);
      done.degenerate_rows.push_back(degenerate);
    }
    sink(std::move(done));
  };
  for_each_head(reader, sel, on_head, on_image);
}

}  // namespace attnscope::analyses
