// Attention sinks and high-norm tokens (sinks.hpp).
#include "attnscope/analyses/sinks.hpp"

#include "attnscope/analyses/head_error.hpp"
#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "float_softmax_rows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace attnscope::analyses {

namespace {

std::string number(double x) {
  std::ostringstream s;
  s << x;
  return s.str();
}

}  // namespace

NormSource parse_norm_source(const std::string& s) {
  if (s == "v") return NormSource::Values;
  if (s == "out") return NormSource::Outputs;
  if (s == "none") return NormSource::None;
  throw UsageError("--norms: expected v, out or none, found '" + s + "'");
}

std::string to_string(NormSource s) {
  switch (s) {
    case NormSource::Values:
      return "v";
    case NormSource::Outputs:
      return "out";
    case NormSource::None:
      return "none";
  }
  return "?";
}

void check_sink_options(const SinkOptions& opt) {
  if (!std::isfinite(opt.threshold)) {
    throw UsageError("--threshold: expected a finite number, found " + number(opt.threshold));
  }
  if (!(opt.norm_ratio > 0.0) || !std::isfinite(opt.norm_ratio)) {
    throw UsageError("--norm-ratio: expected a finite number > 0, found " + number(opt.norm_ratio));
  }
}

namespace {

/// Rows g[0], ..., g[G - 1] folded into the column sums and minima: each sum takes the rows' weights
/// in their order, as one row at a time would (the same bits), with one load and store per column
/// for the G rows instead of one per row.
template <int G, class Row>
void fold_rows(const Row* g, Eigen::Index n, double* sum, double* low) {
  for (Eigen::Index j = 0; j < n; ++j) {
    double s = sum[j], m = low[j];
    for (int r = 0; r < G; ++r) {
      const double x = g[r](j);
      s += x;
      m = std::min(m, x);
    }
    sum[j] = s;
    low[j] = m;
  }
}

/// Column sums (over the rows not `dead`) and the sink test on every key's smallest weight, the
/// weights w_ij = weight(i)[j] (four rows at a time, fold_rows). `margin` > 0: false (out
/// unfinished) when a key's smallest weight is within margin of the threshold, where a weight's
/// error could change the test.
template <class RowWeights>
bool column_sinks(Eigen::Index rows, Eigen::Index n, const std::vector<char>* dead,
                  const RowWeights& weight, double threshold, double margin, HeadSinks& out) {
  std::vector<double> sum(static_cast<std::size_t>(n), 0.0);
  std::vector<double> low(static_cast<std::size_t>(n), std::numeric_limits<double>::infinity());
  std::vector<decltype(weight(Eigen::Index{0}))> group;
  group.reserve(4);
  const auto fold = [&] {
    switch (group.size()) {
      case 4: fold_rows<4>(group.data(), n, sum.data(), low.data()); break;
      case 3: fold_rows<3>(group.data(), n, sum.data(), low.data()); break;
      case 2: fold_rows<2>(group.data(), n, sum.data(), low.data()); break;
      case 1: fold_rows<1>(group.data(), n, sum.data(), low.data()); break;
      default: break;
    }
    group.clear();
  };
  for (Eigen::Index i = 0; i < rows; ++i) {
    if (dead != nullptr && (*dead)[static_cast<std::size_t>(i)] != 0) {
      ++out.degenerate;
      continue;
    }
    ++out.valid_rows;
    group.push_back(weight(i));
    if (group.size() == 4) fold();
  }
  fold();
  out.received.assign(static_cast<std::size_t>(n), 0.0);
  if (out.valid_rows == 0) return true;
  for (Eigen::Index j = 0; j < n; ++j) {
    const double lo = low[static_cast<std::size_t>(j)];
    if (margin > 0.0 && std::abs(lo - threshold) <= margin * std::abs(lo)) return false;
    out.received[static_cast<std::size_t>(j)] = sum[static_cast<std::size_t>(j)] / out.valid_rows;
    if (lo > threshold) out.sink_keys.push_back(static_cast<int>(j));
  }
  return true;
}

}  // namespace

HeadSinks head_sinks(const Variant& v, const MatF& q, const MatF& k, double scale,
                     double threshold) {
  // Softmax heads within the float range: float weights, unless a key's smallest weight is so
  // close to the threshold that their error bound could change the test (then the double path
  // decides). Softmax rows are never degenerate. The weights are float_softmax_weights', taken
  // row by row as they are made instead of stored as an N x N matrix and read again.
  if (detail::takes_float_softmax(v)) {
    detail::FloatSoftmaxRows& ws = detail::thread_float_softmax_rows();
    if (detail::float_softmax_rows(q, k, scale, 0, false, ws)) {
      HeadSinks out;
      const double margin = 2.0 * detail::relative_weight_error(ws.delta);
      const auto weight = [&ws](Eigen::Index i) { return detail::weight_row(ws, i); };
      if (column_sinks(ws.e.rows(), ws.e.cols(), nullptr, weight, threshold, margin, out))
        return out;
    }
  }
  Diagnostics diag;
  const MatD qd = q.cast<double>(), kd = k.cast<double>();
  const MatD w = attention_weights<double>(v, qd, kd, scale, nullptr, &diag);
  std::vector<char> dead(static_cast<std::size_t>(w.rows()), 0);
  for (int i : diag.degenerate_rows) dead[static_cast<std::size_t>(i)] = 1;
  HeadSinks out;
  const auto weight = [&w](Eigen::Index i) { return detail::double_row(w, i); };
  column_sinks(w.rows(), w.cols(), &dead, weight, threshold, 0.0, out);
  return out;
}

LayerNorms layer_norms(const std::vector<double>& squared, double norm_ratio) {
  LayerNorms out;
  std::vector<double> norms(squared.size());
  for (std::size_t t = 0; t < squared.size(); ++t) norms[t] = std::sqrt(squared[t]);
  if (!norms.empty()) {
    std::vector<double> sorted = norms;
    std::sort(sorted.begin(), sorted.end());
    const std::size_t m = sorted.size() / 2;
    out.median = sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
  }
  out.ratio.resize(norms.size());
  out.high.resize(norms.size());
  for (std::size_t t = 0; t < norms.size(); ++t) {
    if (out.median > 0.0) {
      out.ratio[t] = norms[t] / out.median;
      out.high[t] = out.ratio[t] > norm_ratio ? 1 : 0;
    } else {  // half the tokens or more are zero: any non-zero one stands out
      out.ratio[t] = norms[t] > 0.0 ? std::numeric_limits<double>::infinity() : 0.0;
      out.high[t] = norms[t] > 0.0 ? 1 : 0;
    }
  }
  return out;
}

void sinks_images(DumpReader& reader, const Selection& resolved,
                  const std::vector<Variant>& variants, const SinkOptions& opt, bool reference,
                  const std::function<void(SinksImage&&)>& sink) {
  check_sink_options(opt);
  const DumpSchema& schema = reader.schema();
  const double scale = schema.attrs.scale;
  const int tokens = schema.attrs.num_tokens;
  if (opt.norms == NormSource::Outputs) {
    for (int l : resolved.layers) {
      if (!schema.layer_has_out[static_cast<std::size_t>(l)]) {
        throw InputError(
            schema.files.front(), "/layers/" + std::to_string(l) + "/out",
            "the model's attention output [images, heads, tokens, head_dim] (--norms out; "
            "--norms v reads the values)",
            "none");
      }
    }
  }
  const std::size_t nh = resolved.heads.size();
  std::vector<int> layer_slot(static_cast<std::size_t>(schema.attrs.num_layers), -1);
  std::vector<int> head_slot(static_cast<std::size_t>(schema.max_heads()), -1);
  for (std::size_t s = 0; s < resolved.layers.size(); ++s)
    layer_slot[resolved.layers[s]] = static_cast<int>(s);
  for (std::size_t s = 0; s < nh; ++s) head_slot[resolved.heads[s]] = static_cast<int>(s);
  const std::size_t slots = resolved.layers.size() * nh;

  // Per image in flight, its lane's slots; each (layer, head) slot is written by one thread, so
  // the slots need no lock.
  struct Lane {
    std::vector<std::vector<HeadSinks>> heads;
    std::vector<std::vector<double>> squared;  // per slot: each token's |x_{h,t}|^2
  };
  std::vector<Lane> lanes(kImagesInFlight);
  for (Lane& l : lanes) {
    l.heads.assign(variants.size(), std::vector<HeadSinks>(slots));
    l.squared.resize(slots);
  }
  auto on_head = [&](const HeadView& hv, std::size_t lane) {
    auto& heads = lanes[lane].heads;
    const std::size_t s = static_cast<std::size_t>(layer_slot[hv.layer]) * nh +
                          static_cast<std::size_t>(head_slot[hv.head]);
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      heads[vi][s] = in_head(hv.image, hv.layer, hv.head, [&] {
        const Variant v = head_variant(variants, vi, hv);
        return reference ? head_sinks_reference(v, hv.q, hv.k, scale, opt.threshold)
                         : head_sinks(v, hv.q, hv.k, scale, opt.threshold);
      });
    }
    if (opt.norms == NormSource::None) return;
    const MatF& x = opt.norms == NormSource::Values ? hv.v : *hv.out;
    std::vector<double>& sq = lanes[lane].squared[s];
    sq.assign(static_cast<std::size_t>(x.rows()), 0.0);
    for (Eigen::Index t = 0; t < x.rows(); ++t) {
      double a = 0.0;
      for (Eigen::Index c = 0; c < x.cols(); ++c)
        a += static_cast<double>(x(t, c)) * static_cast<double>(x(t, c));
      sq[static_cast<std::size_t>(t)] = a;
    }
  };
  auto on_image = [&](int image, std::size_t lane) {
    const auto& squared = lanes[lane].squared;
    SinksImage done;
    done.image = image;
    done.heads = lanes[lane].heads;
    if (opt.norms != NormSource::None) {
      for (std::size_t ls = 0; ls < resolved.layers.size(); ++ls) {
        std::vector<double> total(static_cast<std::size_t>(tokens),
                                  0.0);  // heads in selection order
        for (std::size_t hs = 0; hs < nh; ++hs) {
          const std::vector<double>& sq = squared[ls * nh + hs];
          if (sq.empty())
            continue;  // a head this layer lacks (a dump whose layers differ in heads)
          for (std::size_t t = 0; t < total.size(); ++t) total[t] += sq[t];
        }
        LayerNorms ln = layer_norms(total, opt.norm_ratio);
        ln.layer = resolved.layers[ls];
        done.norms.push_back(std::move(ln));
      }
    }
    sink(std::move(done));
  };
  Selection sel = resolved;
  sel.need_v = opt.norms == NormSource::Values;
  sel.need_model_tensors = opt.norms == NormSource::Outputs;
  for_each_head_pipelined(reader, sel, kImagesInFlight, on_head, on_image);
}

SinksTotals::SinksTotals(const std::vector<Variant>& variants, const Selection& resolved,
                         int tokens, bool norms)
    : tokens_(tokens) {
  res_.variants = variants;
  const std::size_t nh = resolved.heads.size();
  SinksHeadTotal empty;
  empty.received_sum.assign(static_cast<std::size_t>(tokens), 0.0);
  empty.sink_images.assign(static_cast<std::size_t>(tokens), 0);
  res_.heads.assign(variants.size(),
                    std::vector<SinksHeadTotal>(resolved.layers.size() * nh, empty));
  for (auto& hs : res_.heads) {
    for (std::size_t s = 0; s < hs.size(); ++s) {
      hs[s].layer = resolved.layers[s / nh];
      hs[s].head = resolved.heads[s % nh];
    }
  }
  if (norms) {
    for (int l : resolved.layers) {
      SinksLayerTotal t;
      t.layer = l;
      t.ratio_sum.assign(static_cast<std::size_t>(tokens), 0.0);
      t.high_images.assign(static_cast<std::size_t>(tokens), 0);
      res_.layers.push_back(std::move(t));
    }
  }
}

void SinksTotals::add(const SinksImage& img) {
  const std::string what = "sinks: image " + std::to_string(img.image) + "'s part";
  const auto n = static_cast<std::size_t>(tokens_);
  if (img.heads.size() != res_.heads.size() || img.norms.size() != res_.layers.size()) {
    throw Error(what + " does not match the run");
  }
  for (std::size_t vi = 0; vi < img.heads.size(); ++vi) {
    if (img.heads[vi].size() != res_.heads[vi].size())
      throw Error(what + " does not match the selection's heads");
    for (std::size_t s = 0; s < img.heads[vi].size(); ++s) {
      const HeadSinks& h = img.heads[vi][s];
      SinksHeadTotal& t = res_.heads[vi][s];
      t.degenerate_rows += h.degenerate;
      if (h.valid_rows == 0) continue;
      if (h.received.size() != n) throw Error(what + " does not match the tokens");
      ++t.images;
      double top = -std::numeric_limits<double>::infinity();
      for (std::size_t j = 0; j < n; ++j) {
        t.received_sum[j] += h.received[j];
        top = std::max(top, h.received[j]);
      }
      t.top_received_sum += top;
      if (!h.sink_keys.empty()) ++t.images_with_sink;
      for (int j : h.sink_keys) {
        if (j < 0 || static_cast<std::size_t>(j) >= n)
          throw Error(what + " names a key out of range");
        ++t.sink_images[static_cast<std::size_t>(j)];
      }
    }
  }
  for (std::size_t ls = 0; ls < img.norms.size(); ++ls) {
    const LayerNorms& ln = img.norms[ls];
    SinksLayerTotal& t = res_.layers[ls];
    if (ln.ratio.size() != n || ln.high.size() != n)
      throw Error(what + " does not match the tokens");
    ++t.images;
    for (std::size_t j = 0; j < n; ++j) {
      t.ratio_sum[j] += ln.ratio[j];
      t.high_images[j] += ln.high[j];
      t.high_tokens += ln.high[j];
    }
  }
  ++res_.images;
}

}  // namespace attnscope::analyses
