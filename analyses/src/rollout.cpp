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
#include <atomic>
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
  MatD a;
  rollout_step_into(heads, fusion, fixed, a);
  return a;
}

namespace {

/// rollout_step_into's step from the heads' rows: row_of(h, i) gives head h's row i as a functor
/// of the column j. Row by row, entry by entry the operations of the whole-matrix form (the same
/// bits): the heads fused in their order, the mean's division, the identity, the row's sums.
template <class RowOf>
void step_of_rows(std::size_t heads, Eigen::Index rows, Eigen::Index cols, const RowOf& row_of,
                  HeadFusion fusion, int* fixed, MatD& a) {
  if (heads == 0) throw UsageError("rollout: a layer without heads");
  a.resize(rows, cols);  // keeps a's storage when it has the size already
  const double count = static_cast<double>(heads);
  for (Eigen::Index i = 0; i < rows; ++i) {
    double* out = a.row(i).data();
    const auto first = row_of(std::size_t{0}, i);
    for (Eigen::Index j = 0; j < cols; ++j) out[j] = first(j);
    for (std::size_t h = 1; h < heads; ++h) {
      const auto next = row_of(h, i);
      if (fusion == HeadFusion::Mean)
        for (Eigen::Index j = 0; j < cols; ++j) out[j] += next(j);
      if (fusion == HeadFusion::Max)
        for (Eigen::Index j = 0; j < cols; ++j) out[j] = std::max(out[j], next(j));
      if (fusion == HeadFusion::Min)
        for (Eigen::Index j = 0; j < cols; ++j) out[j] = std::min(out[j], next(j));
    }
    if (fusion == HeadFusion::Mean)
      for (Eigen::Index j = 0; j < cols; ++j) out[j] /= count;
    if (i < cols) out[i] += 1.0;
    const double sum = lane_sum(cols, [out](Eigen::Index j) { return out[j]; });
    const double magnitude = lane_sum(cols, [out](Eigen::Index j) { return std::abs(out[j]); });
    if (sum > kTinyDenominator * magnitude) {
      for (Eigen::Index j = 0; j < cols; ++j) out[j] /= sum;
    } else {
      for (Eigen::Index j = 0; j < cols; ++j) out[j] = 0.0;
      if (i < cols) out[i] = 1.0;
      if (fixed != nullptr) ++*fixed;
    }
  }
}

}  // namespace

void rollout_step_into(const std::vector<MatD>& heads, HeadFusion fusion, int* fixed, MatD& a) {
  if (heads.empty()) throw UsageError("rollout: a layer without heads");
  const auto row_of = [&heads](std::size_t h, Eigen::Index i) { return detail::double_row(heads[h], i); };
  step_of_rows(heads.size(), heads.front().rows(), heads.front().cols(), row_of, fusion, fixed, a);
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

namespace {

/// Row 0 of steps[L-1] ... steps[0] (the layers' steps in the model's order): e_0^T A_L carried
/// through A_{L-1}, ..., A_1 by carry_cls_row.
VecD cls_row_of_steps(const std::vector<const MatD*>& steps) {
  VecD v = steps.back()->row(0).transpose();
  VecD next(v.size());
  for (std::size_t l = steps.size() - 1; l-- > 0;) carry_cls_row(*steps[l], v, next);
  return v;
}

}  // namespace

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
  std::vector<const MatD*> in_order;
  for (const MatD& step : steps) in_order.push_back(&step);
  return cls_row_of_steps(in_order);
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

/// One head's weights as rollout_images holds them until its layer's step: a softmax head in the
/// float range as its float exponentials and their row sums (4 N^2 bytes; the step reads them
/// through weight_row, the values float_softmax_weights would have stored), any other as its
/// N x N double weights.
struct HeadWeights {
  MatD w;
  MatF e;
  std::vector<double> sum;
  bool is_float = false;
};

/// rollout_head_weights into hw, keeping a float head's exponentials (swapped with the thread's
/// buffers: no copy, no allocation once both have the head's size). A slot holds one form at a
/// time (the other released), so that it never holds more than the 8 N^2 bytes of
/// image_state_bytes.
int head_weights_into(const Variant& v, const MatF& q, const MatF& k, double scale, bool reference,
                      HeadWeights& hw) {
  if (!reference && detail::takes_float_softmax(v)) {
    detail::FloatSoftmaxRows& ws = detail::thread_float_softmax_rows();
    if (detail::float_softmax_rows(q, k, scale, 0, false, ws)) {
      hw.e.swap(ws.e);
      hw.sum.swap(ws.sum);
      hw.w.resize(0, 0);
      hw.is_float = true;
      return 0;
    }
  }
  hw.e.resize(0, 0);
  hw.is_float = false;
  return rollout_head_weights(v, q, k, scale, reference, hw.w);
}

/// The step of a layer's nh heads (rollout_step_into's bits): from the float exponentials when
/// every head has them, otherwise from the double weights, the float heads widened first.
void step_of_heads(HeadWeights* hw, std::size_t nh, HeadFusion fusion, int* fixed, MatD& step) {
  const bool all_float = std::all_of(hw, hw + nh, [](const HeadWeights& h) { return h.is_float; });
  if (all_float) {
    const auto row_of = [hw](std::size_t h, Eigen::Index i) {
      return detail::weight_row(hw[h].e, hw[h].sum, i);
    };
    step_of_rows(nh, hw[0].e.rows(), hw[0].e.cols(), row_of, fusion, fixed, step);
    return;
  }
  for (std::size_t h = 0; h < nh; ++h) {
    if (!hw[h].is_float) continue;
    detail::widen_weights(hw[h].e, hw[h].sum, hw[h].w);
    hw[h].e.resize(0, 0);
    hw[h].is_float = false;
  }
  const auto row_of = [hw](std::size_t h, Eigen::Index i) { return detail::double_row(hw[h].w, i); };
  step_of_rows(nh, hw[0].w.rows(), hw[0].w.cols(), row_of, fusion, fixed, step);
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

namespace {

/// Bytes of one image's state when rollout_images holds every head: each selected head's weights
/// and each layer's step, 8 N^2 bytes each per variant (at most: a float head holds 4 N^2).
double image_state_bytes(const DumpSchema& schema, const Selection& resolved, std::size_t variants) {
  const auto n = static_cast<double>(schema.attrs.num_tokens);
  const auto layers = static_cast<double>(resolved.layers.size());
  return 8.0 * n * n * static_cast<double>(variants) * (layers * static_cast<double>(resolved.heads.size()) + layers);
}

/// Images in flight when every head is held: two while one image's state is small (a thread then
/// starts the next image instead of waiting for the last heads of one), one above (the second
/// image's buffers would cost more in first touches than the waiting; measured at N = 3136).
constexpr double kTwoImagesBelow = 32.0 * 1024 * 1024;
std::size_t images_in_flight(double state_bytes) { return state_bytes <= kTwoImagesBelow ? kImagesInFlight : 1; }

}  // namespace

bool rollout_holds_every_head(const DumpSchema& schema, const Selection& resolved, std::size_t variants,
                              bool reference) {
  const double state = image_state_bytes(schema, resolved, variants);
  const std::size_t budget = resolved.max_memory == 0 ? kDefaultMaxMemory : resolved.max_memory;
  return reference || static_cast<double>(images_in_flight(state)) * state <= static_cast<double>(budget);
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
          rollout_step_into(heads, fusion, &fixed, step);
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

  // One or two images in flight (for_each_head_pipelined, images_in_flight; one under
  // `reference`), each with its lane: the heads' weights [variant][slot], each slot written by one
  // thread; and on the fast path each layer's step, formed by the thread that finishes the layer's
  // last head (the heads in their order, as rollout_cls_row forms it), so that the steps are
  // formed while other heads are computed. on_image then only carries the CLS row through the
  // steps, as rollout_cls_row does (the same bits); under `reference` it forms the whole product.
  const std::size_t lanes_wanted =
      reference ? 1 : images_in_flight(image_state_bytes(schema, resolved, variants.size()));
  const std::size_t nl = resolved.layers.size();
  struct Lane {
    std::vector<std::vector<HeadWeights>> weights;  // [variant][slot]
    std::vector<std::vector<int>> dead;      // [variant][slot]
    std::vector<std::vector<MatD>> steps;    // [variant][layer slot]
    std::vector<std::vector<int>> fixed;     // [variant][layer slot]
    std::vector<std::atomic<std::size_t>> left;  // per layer slot: its heads not yet measured
  };
  std::vector<Lane> lanes(lanes_wanted);
  for (Lane& lane : lanes) {
    lane.weights.assign(variants.size(), std::vector<HeadWeights>(nl * nh));
    lane.dead.assign(variants.size(), std::vector<int>(nl * nh, 0));
    lane.steps.assign(variants.size(), std::vector<MatD>(nl));
    lane.fixed.assign(variants.size(), std::vector<int>(nl, 0));
    lane.left = std::vector<std::atomic<std::size_t>>(nl);
    for (auto& c : lane.left) c.store(nh);
  }
  auto on_head = [&](const HeadView& hv, std::size_t at) {
    Lane& lane = lanes[at];
    const auto ls = static_cast<std::size_t>(layer_slot[hv.layer]);
    const std::size_t s = ls * nh + static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      in_head(hv.image, hv.layer, hv.head, [&] {
        lane.dead[vi][s] = head_weights_into(head_variant(variants, vi, hv), hv.q, hv.k, scale,
                                             reference, lane.weights[vi][s]);
      });
    }
    // The last of the layer's heads (acquire: the others' weights are written) forms its steps.
    if (lane.left[ls].fetch_sub(1, std::memory_order_acq_rel) != 1 || reference) return;
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      lane.fixed[vi][ls] = 0;
      step_of_heads(&lane.weights[vi][ls * nh], nh, fusion, &lane.fixed[vi][ls], lane.steps[vi][ls]);
    }
  };
  auto on_image = [&](int image, std::size_t at) {
    Lane& lane = lanes[at];
    for (std::size_t ls = 0; ls < nl; ++ls) {
      if (lane.left[ls].load() != 0) throw UsageError("rollout: a layer without every selected head");
    }
    RolloutImage done;
    done.image = image;
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      std::int64_t degenerate = 0;
      for (int d : lane.dead[vi]) degenerate += d;
      int fixed = 0;
      if (reference) {
        // The heads' matrices, layers in the model's order, and back to the lane afterwards (a
        // swap both ways).
        std::vector<std::vector<MatD>> layers(order.size(), std::vector<MatD>(nh));
        const auto swap_with_lane = [&] {
          for (std::size_t o = 0; o < order.size(); ++o) {
            const auto ls = static_cast<std::size_t>(layer_slot[order[o]]);
            for (std::size_t hs = 0; hs < nh; ++hs) layers[o][hs].swap(lane.weights[vi][ls * nh + hs].w);
          }
        };
        swap_with_lane();
        const MatD r = rollout_reference(layers, fusion, &fixed);
        done.cls.emplace_back(r.row(0).data(), r.row(0).data() + r.cols());
        swap_with_lane();
      } else {
        std::vector<const MatD*> steps;
        for (int l : order) {
          const auto ls = static_cast<std::size_t>(layer_slot[l]);
          fixed += lane.fixed[vi][ls];
          steps.push_back(&lane.steps[vi][ls]);
        }
        const VecD v = cls_row_of_steps(steps);
        done.cls.emplace_back(v.data(), v.data() + v.size());
      }
      done.fixed_rows.push_back(fixed);
      done.degenerate_rows.push_back(degenerate);
    }
    for (auto& c : lane.left) c.store(nh);
    sink(std::move(done));
  };
  for_each_head_pipelined(reader, sel, lanes_wanted, on_head, on_image);
}

}  // namespace attnscope::analyses
