// Synthetic dumps with planted structure (see synth.hpp for the model).
#include "attnscope/synth.hpp"

#include "attnscope/error.hpp"
#include "attnscope/family.hpp"
#include "attnscope/parallel.hpp"
#include "attnscope/seed.hpp"
#include "attnscope/variant.hpp"
#include "dump_internal.hpp"
#include "normal_draws.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace attnscope {

namespace {

constexpr double kTwoPi = 6.283185307179586476925286766559;
constexpr double kLengthScale = 1.5;     // grid cells over which the positional code decorrelates
constexpr double kLocalBonus = 3.0;      // s * q.k gained by a key at the query's own cell, layer 0
constexpr double kHyperplaneNorm = 0.5;  // |x|: keys lie at distance 1/|x| = 2 from the origin
constexpr long long kMaxTokens = 1 << 24;  // keeps every token count and index inside int

enum Stream : std::uint64_t { kModel = 1, kData = 2, kPlant = 3 };

std::uint64_t stream_seed(std::uint64_t seed, Stream s, std::initializer_list<int> idx) {
  std::uint64_t h = mix_seed(seed, s);
  for (int i : idx) h = mix_seed(h, static_cast<std::uint64_t>(i));
  return h;
}

double unit(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }

/// Positional strength a_l: falls linearly from 1 to 0.5 over the layers, scaled so that
/// s * a^2 * |g|^2 = kLocalBonus * a_l^2 whatever d is.
double positional_amplitude(const SynthOptions& o, int layer) {
  const double al = o.layers > 1 ? 1.0 - 0.5 * layer / (o.layers - 1) : 1.0;
  return al * std::sqrt(kLocalBonus / std::sqrt(static_cast<double>(o.head_dim)));
}

/// Positional codes of every token (N x d; zero rows for prefix tokens): random Fourier features
/// of the grid position, so g_t . g_u ~ d exp(-|pos_t - pos_u|^2 / (2 l^2)).
MatD positional_codes(const SynthOptions& o, int layer, int head) {
  detail::NormalDraws normal(stream_seed(o.seed, kModel, {layer, head}));
  const int d = o.head_dim;
  MatD omega(d, 2);
  VecD phase(d);
  for (int m = 0; m < d; ++m) {
    omega(m, 0) = normal.next() / kLengthScale;
    omega(m, 1) = normal.next() / kLengthScale;
  }
  std::mt19937_64 gen(stream_seed(o.seed, kModel, {layer, head, -1}));
  for (int m = 0; m < d; ++m) phase(m) = kTwoPi * unit(gen);
  MatD g = MatD::Zero(o.tokens(), d);
  for (int t = o.grid.prefix; t < o.tokens(); ++t) {
    const double r = o.grid.row(t), c = o.grid.col(t);
    for (int m = 0; m < d; ++m) {
      g(t, m) = std::sqrt(2.0) * std::cos(omega(m, 0) * r + omega(m, 1) * c + phase(m));
    }
  }
  return g;
}

void project_onto_hyperplane(MatD& K, const VecD& x) {
  const double xx = x.squaredNorm();
  for (Eigen::Index t = 0; t < K.rows(); ++t) {
    const double off = (1.0 - K.row(t).dot(x)) / xx;
    K.row(t) += off * x.transpose();
  }
}

struct HeadData {
  MatF q, k, v;
};

HeadData synth_head(const SynthOptions& o, int image, int layer, int head, const MatD& g) {
  const int N = o.tokens(), d = o.head_dim;
  const double a = positional_amplitude(o, layer);
  detail::NormalDraws normal(stream_seed(o.seed, kData, {image, layer, head}));
  MatD q(N, d), k(N, d), v(N, d);
  for (MatD* m : {&q, &k, &v}) {
    for (int t = 0; t < N; ++t) {
      for (int c = 0; c < d; ++c) (*m)(t, c) = normal.next();
    }
  }
  q += a * g;
  k += a * g;
  const VecD x = hyperplane_normal(o, layer, head);
  if (x.size() > 0) project_onto_hyperplane(k, x);
  for (const PlantedPair& p : planted_pairs(o, image, layer, head)) {
    switch (p.kind) {
      case PlantKind::Duplicate:
        q.row(p.j) = q.row(p.i);
        break;
      case PlantKind::Collinear:
        q.row(p.j) = p.factor * q.row(p.i);
        break;
      case PlantKind::Shifted:
        q.row(p.j) = q.row(p.i) + p.factor * x.transpose();
        break;
    }
  }
  return {q.cast<float>(), k.cast<float>(), v.cast<float>()};
}

}  // namespace

double SynthOptions::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim)); }

DumpAttributes SynthOptions::attributes() const {
  DumpAttributes a;
  a.model_name = model_name;
  a.attention_family = family;
  a.convention = convention;
  a.feature_map = feature_map;
  a.scale = scale();
  a.num_layers = layers;
  a.num_heads = heads;
  a.head_dim = head_dim;
  a.num_tokens = tokens();
  a.grid = grid;
  return a;
}

void SynthOptions::validate() const {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) throw UsageError(what);
  };
  need(layers >= 1, "layers must be >= 1, got " + std::to_string(layers));
  need(heads >= 1, "heads must be >= 1, got " + std::to_string(heads));
  need(head_dim >= 1, "head dim must be >= 1, got " + std::to_string(head_dim));
  need(images >= 1, "images must be >= 1 (a dump holds at least one image), got " +
                        std::to_string(images));
  need(grid.height >= 1 && grid.width >= 1, "grid must be at least 1 x 1, got " +
                                                std::to_string(grid.height) + " x " +
                                                std::to_string(grid.width));
  need(grid.prefix >= 0, "prefix tokens must be >= 0, got " + std::to_string(grid.prefix));
  const long long n = grid.prefix + static_cast<long long>(grid.height) * grid.width;
  need(n <= kMaxTokens,
       "at most " + std::to_string(kMaxTokens) + " tokens, got " + std::to_string(n));
  need(compression >= 0 && compression <= 9,
       "compression must be a gzip level 0-9, got " + std::to_string(compression));
  need(family_named(family) != nullptr,
       "family must be one of " + known_families() + ", got '" + family + "'");
  need(find_convention(convention).has_value(),
       "convention must be " + convention_names() + ", got '" + convention + "'");
  need(!feature_map.empty(), "feature map must be a spec or 'none'");
  need(plant_duplicates >= 0 && plant_collinear >= 0 && plant_shifted >= 0,
       "planted pair counts must be >= 0");
  need(plant_shifted == 0 || plant_hyperplane, "shifted pairs need the planted hyperplane");
  const long pairs = static_cast<long>(plant_duplicates) + plant_collinear + plant_shifted;
  need(2 * pairs <= tokens(), std::to_string(pairs) + " planted pairs need " +
                                  std::to_string(2 * pairs) + " distinct tokens, there are " +
                                  std::to_string(tokens()));
  // Each image's block of a layer is one HDF5 chunk [1, heads, tokens, head_dim], and HDF5's
  // chunks hold less than 4 GiB.
  const long double block = static_cast<long double>(heads) * static_cast<long double>(tokens()) *
                            head_dim * (dtype == DType::F16 ? 2 : 4);
  need(block < 4294967296.0L,
       "--heads x tokens x --head-dim: one image's block of a layer would take " +
           std::to_string(static_cast<unsigned long long>(block)) +
           " bytes, more than an HDF5 chunk holds (under 4 GiB)");
  // The reader's own checks: synth never writes a dump that attnscope would refuse to read.
  try {
    dump_detail::validate_attributes(attributes(), "synth");
  } catch (const InputError& e) {
    static const std::pair<const char*, const char*> kFlagOf[] = {
        {"'num_layers'", "--layers"},       {"'num_heads'", "--heads"},
        {"'head_dim'", "--head-dim"},       {"'grid_height'", "--grid-height"},
        {"'grid_width'", "--grid-width"},   {"'prefix_tokens'", "--prefix"},
        {"'num_tokens'", "--prefix, --grid-height, --grid-width"},
        {"'feature_map'", "--family, --feature-map"},
        {"'attention_family'", "--family"}, {"'convention'", "--convention"}};
    std::string flag = "the options";
    for (const auto& [attr, f] : kFlagOf) {
      if (e.object().find(attr) != std::string::npos) flag = f;
    }
    std::string why = e.what();
    why = why.substr(std::min(why.size(), std::string("synth: ").size()));
    throw UsageError(flag + " would write a dump that readers refuse: " + why);
  }
}

std::vector<PlantedPair> planted_pairs(const SynthOptions& o, int image, int layer, int head) {
  const int total = o.plant_duplicates + o.plant_collinear + o.plant_shifted;
  if (total == 0) return {};
  std::mt19937_64 gen(stream_seed(o.seed, kPlant, {image, layer, head}));
  std::vector<int> perm(static_cast<std::size_t>(o.tokens()));
  std::iota(perm.begin(), perm.end(), 0);
  for (std::size_t n = perm.size(); n > 1; --n) {  // Fisher-Yates, portable draws
    std::swap(perm[n - 1], perm[detail::uniform_below(gen, n)]);
  }
  std::vector<PlantedPair> out;
  for (int p = 0; p < total; ++p) {
    PlantedPair pp;
    pp.i = perm[static_cast<std::size_t>(2 * p)];
    pp.j = perm[static_cast<std::size_t>(2 * p + 1)];
    if (p < o.plant_duplicates) {
      pp.kind = PlantKind::Duplicate;
    } else if (p < o.plant_duplicates + o.plant_collinear) {
      pp.kind = PlantKind::Collinear;
      pp.factor = (gen() & 1U) != 0U ? 2.0 : 0.5;
    } else {
      pp.kind = PlantKind::Shifted;
      pp.factor = 1.0 + 2.0 * unit(gen);
    }
    out.push_back(pp);
  }
  return out;
}

VecD hyperplane_normal(const SynthOptions& o, int layer, int head) {
  if (!o.plant_hyperplane) return {};
  detail::NormalDraws normal(stream_seed(o.seed, kModel, {layer, head, -2}));
  VecD x(o.head_dim);
  for (int c = 0; c < o.head_dim; ++c) x(c) = normal.next();
  return x * (kHyperplaneNorm / x.norm());
}

ImageQKV synth_image(const SynthOptions& o, int image) {
  ImageQKV img;
  img.image = image;
  img.heads = o.heads;
  img.layers.resize(static_cast<std::size_t>(o.layers));
  std::iota(img.layers.begin(), img.layers.end(), 0);
  const int slots = o.layers * o.heads;
  img.q.resize(static_cast<std::size_t>(slots));
  img.k.resize(static_cast<std::size_t>(slots));
  img.v.resize(static_cast<std::size_t>(slots));
  parallel_for(slots, [&](int s) {
    const int layer = s / o.heads, head = s % o.heads;
    HeadData h = synth_head(o, image, layer, head, positional_codes(o, layer, head));
    img.q[static_cast<std::size_t>(s)] = std::move(h.q);
    img.k[static_cast<std::size_t>(s)] = std::move(h.k);
    img.v[static_cast<std::size_t>(s)] = std::move(h.v);
  });
  return img;
}

void write_synth_dump(const std::string& path, const SynthOptions& o,
                      const std::function<void(int)>& on_image) {
  o.validate();
  DumpWriterOptions wo;
  wo.dtype = o.dtype;
  wo.compression = o.compression;
  DumpWriter w(path, o.attributes(), wo);
  for (int i = 0; i < o.images; ++i) {
    w.append(synth_image(o, i));
    if (on_image) on_image(i);
  }
  w.close();
}

std::string to_string(PlantKind k) {
  switch (k) {
    case PlantKind::Duplicate:
      return "duplicate";
    case PlantKind::Collinear:
      return "collinear";
    case PlantKind::Shifted:
      return "shifted";
  }
  return "unknown";
}

}  // namespace attnscope
