// Reading an exported ViT (vit.hpp, docs/model-weights.md).
#include "attnscope/vit.hpp"

#include "attnscope/error.hpp"
#include "dump_internal.hpp"
#include "hdf5_util.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <iomanip>
#include <sstream>
#include <string>

namespace attnscope {
namespace {

using dump_detail::root_double;
using dump_detail::root_int;
using dump_detail::root_string;

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::string s = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

/// The dataset at `path` ("/a/b", from the root) as floats, checked to have exactly `shape` and
/// finite values; opened and read as the dump reader opens and reads its datasets.
std::vector<float> read_tensor(hid_t root, const std::string& file, const std::string& path,
                               const std::vector<hsize_t>& shape, std::size_t dtype_bytes = 0,
                               const std::string& dtype_name = "") {
  if (!h5::exists(root, path.substr(1))) {
    throw InputError(file, path, "a dataset of shape " + shape_text(shape), "none");
  }
  const h5::Handle ds = dump_detail::open_dataset(root, path, file);
  const h5::Handle t = h5::type(H5Dget_type(ds.get()));
  if (H5Tget_class(t.get()) != H5T_FLOAT) {
    throw InputError(file, path, "float32 or float16", h5::describe_type(t.get()));
  }
  if (dtype_bytes != 0 && H5Tget_size(t.get()) != dtype_bytes) {
    throw InputError(file, path, dtype_name + " as attribute 'weights_dtype' says",
                     h5::describe_type(t.get()));
  }
  const std::vector<hsize_t> dims = h5::dims(ds.get());
  if (dims != shape) throw InputError(file, path, "shape " + shape_text(shape), shape_text(dims));
  std::size_t n = 1;
  for (hsize_t d : dims) n *= static_cast<std::size_t>(d);
  std::vector<float> out(n);
  const h5::Handle half = h5::half_type();
  std::vector<std::uint16_t> scratch;
  const std::string why =
      dump_detail::read_floats(ds.get(), H5S_ALL, H5S_ALL, out.data(), n, half.get(), scratch);
  if (!why.empty()) throw InputError(file, path, "a readable dataset", why);
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) {
      throw InputError(file, path, "finite values", "a non-finite value at flat index " + std::to_string(i));
    }
  }
  return out;
}

[[noreturn]] void bad_attr(const std::string& file, const char* name, const std::string& expected,
                           const std::string& found) {
  throw InputError(file, std::string("attribute '") + name + "'", expected, found);
}

/// The Python loader (weights_io.load_weights) rebuilds the model from `config_json` alone: every
/// entry it holds must say what the attribute of the same meaning says, or this C++ forward pass
/// and the Python one would run different networks.
void check_config_json(hid_t root, const VitModel& m, const std::string& family, const std::string& fmap) {
  if (H5Aexists(root, "config_json") <= 0) return;  // not written by older exporters
  const std::string text = root_string(root, "config_json", m.path);
  nlohmann::json cfg;
  try {
    cfg = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    bad_attr(m.path, "config_json", "a JSON object (the Python ViTConfig)", "text that is not JSON");
  }
  if (!cfg.is_object()) bad_attr(m.path, "config_json", "a JSON object (the Python ViTConfig)", cfg.type_name());
  const auto disagree = [&](const std::string& key, const std::string& attr, const std::string& mine,
                            const std::string& theirs) {
    throw InputError(m.path, "attribute 'config_json'",
                     "\"" + key + "\" to agree with attribute '" + attr + "' (" + mine + ")", theirs);
  };
  const auto text_of = [](const nlohmann::json& v) { return v.dump(); };
  const std::pair<const char*, int> ints[] = {
      {"image_size", m.image_size}, {"patch_size", m.patch_size}, {"in_chans", m.in_chans},
      {"num_classes", m.num_classes}, {"embed_dim", m.embed_dim}, {"depth", m.depth},
      {"num_heads", m.num_heads}};
  for (const auto& [key, value] : ints) {
    if (!cfg.contains(key)) continue;
    const nlohmann::json& v = cfg[key];
    if (!v.is_number_integer() || v.get<long long>() != value) disagree(key, key, std::to_string(value), text_of(v));
  }
  if (cfg.contains("family")) {
    const nlohmann::json& v = cfg["family"];
    if (!v.is_string() || v.get<std::string>() != family) disagree("family", "attention_family", family, text_of(v));
  }
  if (cfg.contains("feature_map") && !cfg["feature_map"].is_null()) {
    const nlohmann::json& v = cfg["feature_map"];
    if (!v.is_string() || v.get<std::string>() != fmap) disagree("feature_map", "feature_map", fmap, text_of(v));
  }
  if (cfg.contains("mlp_ratio")) {
    const nlohmann::json& v = cfg["mlp_ratio"];
    if (!v.is_number() || static_cast<long long>(m.embed_dim * v.get<double>()) != m.mlp_hidden) {
      disagree("mlp_ratio", "mlp_hidden", std::to_string(m.mlp_hidden) + " = embed_dim x mlp_ratio", text_of(v));
    }
  }
  if (cfg.contains("local_residual")) {
    const nlohmann::json& v = cfg["local_residual"];
    if (!v.is_boolean() || v.get<bool>() != m.local_residual) {
      disagree("local_residual", "local_residual", m.local_residual ? "1" : "0", text_of(v));
    }
  }
}

/// The blocks stored under /blocks must be exactly /blocks/0 .. /blocks/depth-1.
void check_blocks(hid_t root, const VitModel& m) {
  if (!h5::exists(root, "blocks")) return;  // reported as the missing tensors of block 0
  const h5::Handle g = h5::group(H5Gopen2(root, "blocks", H5P_DEFAULT));
  H5G_info_t info{};
  if (!g.valid() || H5Gget_info(g.get(), &info) < 0) {
    throw InputError(m.path, "/blocks", "a readable group", h5::last_error());
  }
  const std::string want = std::to_string(m.depth) + " blocks (/blocks/0 to /blocks/" + std::to_string(m.depth - 1) +
                           ") as attribute 'depth' says";
  if (info.nlinks != static_cast<hsize_t>(m.depth)) {
    throw InputError(m.path, "/blocks", want, std::to_string(info.nlinks) + " entries");
  }
  for (int l = 0; l < m.depth; ++l) {
    if (!h5::exists(root, "blocks/" + std::to_string(l))) {
      throw InputError(m.path, "/blocks", want, "no /blocks/" + std::to_string(l));
    }
  }
}

}  // namespace

struct ImageRowReader::Impl {
  std::string path;
  h5::Handle file, images, logits;
  std::vector<int> shape;
  std::vector<std::int64_t> labels;
  int n = 0, classes = 0;
  h5::Handle half;
  std::vector<std::uint16_t> scratch;

  /// Row i of the [n, ...] float dataset `ds` as `cols` values.
  VecF row(hid_t ds, const std::string& name, int i, Eigen::Index cols) {
    if (i < 0 || i >= n) {
      throw InputError(path, name, "an image below " + std::to_string(n), std::to_string(i));
    }
    const std::vector<hsize_t> dims = h5::dims(ds);
    std::vector<hsize_t> off(dims.size(), 0), cnt = dims;
    off[0] = static_cast<hsize_t>(i);
    cnt[0] = 1;
    VecF out(cols);
    h5::Handle fs = h5::space(H5Dget_space(ds));
    h5::Handle ms = h5::space(H5Screate_simple(static_cast<int>(cnt.size()), cnt.data(), nullptr));
    std::string why;
    if (H5Sselect_hyperslab(fs.get(), H5S_SELECT_SET, off.data(), nullptr, cnt.data(), nullptr) < 0) {
      why = h5::last_error();
    } else {
      why = dump_detail::read_floats(ds, ms.get(), fs.get(), out.data(), static_cast<std::size_t>(cols),
                                     half.get(), scratch);
    }
    if (!why.empty()) {
      throw InputError(path, name, "readable data at image " + std::to_string(i), "a read error (" + why + ")");
    }
    for (Eigen::Index j = 0; j < cols; ++j) {
      if (!std::isfinite(out(j))) {
        throw InputError(path, name, "finite values",
                         "a non-finite value in image " + std::to_string(i) + " at flat index " + std::to_string(j));
      }
    }
    return out;
  }
};

ImageRowReader::ImageRowReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  m.path = path;
  m.half = h5::half_type();
  m.file = dump_detail::open_read_only(path);
  h5::Handle root = h5::group(H5Gopen2(m.file.get(), "/", H5P_DEFAULT));
  const hid_t r = root.get();
  if (!h5::exists(r, "images")) throw InputError(path, "/images", "a dataset [images, C, H, W]", "none");
  m.images = dump_detail::open_dataset(r, "/images", path);
  const std::vector<hsize_t> dims = h5::dims(m.images.get());
  if (dims.size() != 4 || dims[0] == 0) {
    throw InputError(path, "/images", "a dataset [images, C, H, W] with at least one image", shape_text(dims));
  }
  {
    const h5::Handle t = h5::type(H5Dget_type(m.images.get()));
    const std::size_t bytes = H5Tget_size(t.get());
    if (H5Tget_class(t.get()) != H5T_FLOAT || (bytes != 4 && bytes != 2)) {
      throw InputError(path, "/images", "float32 or float16 images (the model's normalised input)",
                       h5::describe_type(t.get()));
    }
  }
  m.n = static_cast<int>(dims[0]);
  m.shape = {static_cast<int>(dims[1]), static_cast<int>(dims[2]), static_cast<int>(dims[3])};
  if (h5::exists(r, "labels")) {
    const h5::Handle ds = dump_detail::open_dataset(r, "/labels", path);
    h5::Handle t = h5::type(H5Dget_type(ds.get()));
    if (H5Tget_class(t.get()) != H5T_INTEGER) throw InputError(path, "/labels", "integers", h5::describe_type(t.get()));
    if (h5::dims(ds.get()) != std::vector<hsize_t>{dims[0]}) {
      throw InputError(path, "/labels", "shape [" + std::to_string(dims[0]) + "]", shape_text(h5::dims(ds.get())));
    }
    m.labels.resize(dims[0]);
    if (H5Dread(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, m.labels.data()) < 0) {
      throw InputError(path, "/labels", "a readable dataset", h5::last_error());
    }
  }
  if (h5::exists(r, "logits")) {
    m.logits = dump_detail::open_dataset(r, "/logits", path);
    const std::vector<hsize_t> ld = h5::dims(m.logits.get());
    if (ld.size() != 2 || ld[0] != dims[0]) {
      throw InputError(path, "/logits", "shape [" + std::to_string(dims[0]) + ", classes]", shape_text(ld));
    }
    m.classes = static_cast<int>(ld[1]);
  }
}

ImageRowReader::~ImageRowReader() = default;

int ImageRowReader::count() const { return impl_->n; }
const std::vector<int>& ImageRowReader::shape() const { return impl_->shape; }
const std::vector<std::int64_t>& ImageRowReader::labels() const { return impl_->labels; }
int ImageRowReader::logit_classes() const { return impl_->classes; }

VecF ImageRowReader::image(int i) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  return m.row(m.images.get(), "/images", i,
               static_cast<Eigen::Index>(m.shape[0]) * m.shape[1] * m.shape[2]);
}

VecF ImageRowReader::logits(int i) {
  h5::quiet_hdf5();
  Impl& m = *impl_;
  if (!m.logits.valid()) throw InputError(m.path, "/logits", "the model's logits", "none");
  return m.row(m.logits.get(), "/logits", i, m.classes);
}

VitModel load_vit(const std::string& path) {
  h5::Handle f = dump_detail::open_read_only(path);
  h5::Handle root = h5::group(H5Gopen2(f.get(), "/", H5P_DEFAULT));
  const hid_t r = root.get();
  VitModel m;
  m.path = path;
  const std::string format = root_string(r, "format", path);
  if (format != "attnscope-vit-weights") bad_attr(path, "format", "attnscope-vit-weights", "'" + format + "'");
  const int version = root_int(r, "format_version", path);
  if (version != 1) bad_attr(path, "format_version", "1", std::to_string(version));
  m.model_name = root_string(r, "model_name", path);
  const std::string family = root_string(r, "attention_family", path);
  const std::string fmap = root_string(r, "feature_map", path);
  const std::string convention = root_string(r, "convention", path);
  try {
    m.variant = parse_variant(family + (fmap.empty() || fmap == "none" ? "" : ":" + fmap) + "@" + convention);
  } catch (const UsageError& e) {
    bad_attr(path, "attention_family", "a variant of the registry (attnscope info --families)", e.what());
  }
  if (H5Aexists(r, "local_residual") > 0) {
    const int lr = root_int(r, "local_residual", path);
    if (lr != 0 && lr != 1) bad_attr(path, "local_residual", "0 or 1", std::to_string(lr));
    m.local_residual = lr == 1;
  }
  const std::string activation = root_string(r, "activation", path);
  if (activation != "gelu_erf") bad_attr(path, "activation", "gelu_erf", "'" + activation + "'");
  m.scale = root_double(r, "scale", path);
  if (!(std::isfinite(m.scale) && m.scale > 0.0)) bad_attr(path, "scale", "a positive finite float", std::to_string(m.scale));
  m.layer_norm_eps = root_double(r, "layer_norm_eps", path);
  if (!(std::isfinite(m.layer_norm_eps) && m.layer_norm_eps > 0.0)) {
    std::ostringstream found;
    found << m.layer_norm_eps;
    bad_attr(path, "layer_norm_eps", "a positive finite float", found.str());
  }
  const auto positive = [&](const char* name) {
    const int v = root_int(r, name, path);
    if (v < 1) bad_attr(path, name, "an integer >= 1", std::to_string(v));
    return v;
  };
  m.image_size = positive("image_size");
  m.patch_size = positive("patch_size");
  m.in_chans = positive("in_chans");
  m.num_classes = positive("num_classes");
  m.embed_dim = positive("embed_dim");
  m.depth = positive("depth");
  m.num_heads = positive("num_heads");
  m.head_dim = positive("head_dim");
  m.mlp_hidden = positive("mlp_hidden");
  m.grid = TokenGrid{root_int(r, "prefix_tokens", path), positive("grid_height"), positive("grid_width")};
  if (m.grid.prefix != 1) bad_attr(path, "prefix_tokens", "1 (a CLS token)", std::to_string(m.grid.prefix));
  if (m.image_size % m.patch_size != 0 || m.grid.height != m.image_size / m.patch_size ||
      m.grid.width != m.grid.height) {
    bad_attr(path, "grid_height", "image_size / patch_size = " + std::to_string(m.image_size / m.patch_size),
             std::to_string(m.grid.height) + " x " + std::to_string(m.grid.width));
  }
  if (m.num_heads * m.head_dim != m.embed_dim) {
    bad_attr(path, "head_dim", "embed_dim / num_heads", std::to_string(m.head_dim));
  }
  // The Python model computes with head_dim^-0.5 whatever the file says: a file whose scale is
  // another number contradicts its own head_dim.
  const double want_scale = 1.0 / std::sqrt(static_cast<double>(m.head_dim));
  if (std::abs(m.scale - want_scale) > 1e-6 * want_scale) {
    std::ostringstream os;
    os << std::setprecision(9) << "head_dim^-0.5 = " << want_scale << " (attribute 'head_dim' is "
       << m.head_dim << "; the model computes with it)";
    std::ostringstream found;
    found << std::setprecision(9) << m.scale;
    bad_attr(path, "scale", os.str(), found.str());
  }
  if (H5Aexists(r, "num_tokens") > 0) {
    const int tokens = root_int(r, "num_tokens", path);
    if (tokens != m.grid.tokens()) {
      bad_attr(path, "num_tokens",
               "prefix_tokens + grid_height x grid_width = " + std::to_string(m.grid.tokens()), std::to_string(tokens));
    }
  }
  std::size_t dtype_bytes = 0;
  std::string dtype = "float32";
  if (H5Aexists(r, "weights_dtype") > 0) {
    dtype = root_string(r, "weights_dtype", path);
    if (dtype != "float32" && dtype != "float16") bad_attr(path, "weights_dtype", "float32 or float16", "'" + dtype + "'");
  }
  dtype_bytes = dtype == "float16" ? 2 : 4;
  check_config_json(r, m, family, fmap);
  check_blocks(r, m);
  const auto tensor = [&](const std::string& name, const std::vector<hsize_t>& shape) {
    return read_tensor(r, path, name, shape, dtype_bytes, dtype);
  };
  const auto matrix = [&](const std::string& name, int rows, int cols) -> MatF {
    const std::vector<float> v = tensor(name, {static_cast<hsize_t>(rows), static_cast<hsize_t>(cols)});
    return Eigen::Map<const MatF>(v.data(), rows, cols);
  };
  const auto vector = [&](const std::string& name, int n) -> VecF {
    const std::vector<float> v = tensor(name, {static_cast<hsize_t>(n)});
    return Eigen::Map<const VecF>(v.data(), n);
  };
  const int d = m.embed_dim, n = m.grid.tokens(), p = m.patch_size, c = m.in_chans;
  const auto pp = static_cast<hsize_t>(p);
  const std::vector<float> patch = tensor("/patch_embed/proj/weight",
                                               {static_cast<hsize_t>(d), static_cast<hsize_t>(c), pp, pp});
  m.patch_w = Eigen::Map<const MatF>(patch.data(), d, c * p * p);
  m.patch_b = vector("/patch_embed/proj/bias", d);
  const std::vector<float> cls = tensor("/cls_token", {1, 1, static_cast<hsize_t>(d)});
  m.cls_token = Eigen::Map<const VecF>(cls.data(), d);
  const std::vector<float> pos = tensor("/pos_embed", {1, static_cast<hsize_t>(n), static_cast<hsize_t>(d)});
  m.pos_embed = Eigen::Map<const MatF>(pos.data(), n, d);
  for (int l = 0; l < m.depth; ++l) {
    const std::string b = "/blocks/" + std::to_string(l) + "/";
    VitBlock k;
    k.norm1_w = vector(b + "norm1/weight", d);
    k.norm1_b = vector(b + "norm1/bias", d);
    k.qkv_w = matrix(b + "attn/qkv/weight", 3 * d, d);
    k.qkv_b = vector(b + "attn/qkv/bias", 3 * d);
    k.proj_w = matrix(b + "attn/proj/weight", d, d);
    k.proj_b = vector(b + "attn/proj/bias", d);
    k.norm2_w = vector(b + "norm2/weight", d);
    k.norm2_b = vector(b + "norm2/bias", d);
    k.fc1_w = matrix(b + "mlp/fc1/weight", m.mlp_hidden, d);
    k.fc1_b = vector(b + "mlp/fc1/bias", m.mlp_hidden);
    k.fc2_w = matrix(b + "mlp/fc2/weight", d, m.mlp_hidden);
    k.fc2_b = vector(b + "mlp/fc2/bias", d);
    if (m.local_residual) {
      const auto in = static_cast<hsize_t>(d / m.num_heads);
      const std::vector<float> c1 = tensor(b + "attn/local_residual/conv1/weight",
                                                {static_cast<hsize_t>(d), in, 1});
      const std::vector<float> c2 = tensor(b + "attn/local_residual/conv2/weight",
                                                {static_cast<hsize_t>(9 * d), in, 1});
      k.lr_conv1_w = Eigen::Map<const MatF>(c1.data(), d, d / m.num_heads);
      k.lr_conv2_w = Eigen::Map<const MatF>(c2.data(), 9 * d, d / m.num_heads);
      k.lr_conv1_b = vector(b + "attn/local_residual/conv1/bias", d);
      k.lr_conv2_b = vector(b + "attn/local_residual/conv2/bias", 9 * d);
    }
    m.blocks.push_back(std::move(k));
  }
  m.norm_w = vector("/norm/weight", d);
  m.norm_b = vector("/norm/bias", d);
  m.head_w = matrix("/head/weight", m.num_classes, d);
  m.head_b = vector("/head/bias", m.num_classes);
  return m;
}

}  // namespace attnscope
