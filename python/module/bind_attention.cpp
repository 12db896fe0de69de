// weights() and outputs() of any registry variant (lib/include/attnscope/attention.hpp), on a
// single head or a stack of heads, in float for float16/float32 inputs and in double for float64.
#include "arrays.hpp"
#include "bindings.hpp"

#include "attnscope/attention.hpp"
#include "attnscope/error.hpp"
#include "attnscope/variant.hpp"

#include <optional>

namespace attnscope::python {

namespace {

/// The mask argument: None, or a [tokens, tokens] bool array shared by every head.
std::optional<Mask> mask_of(const pyb::object& obj, Eigen::Index tokens) {
  if (obj.is_none()) return std::nullopt;
  // Bool only: a cast of floats or ints would take 0.5, NaN or 2 for "visible".
  const auto given = pyb::array::ensure(obj);
  if (!given || given.dtype().kind() != 'b') {
    throw pyb::type_error("mask: expected a [tokens, tokens] bool array, got " +
                          (given ? std::string(pyb::str(given.dtype())) : std::string("no array")));
  }
  auto a = pyb::array_t<bool, pyb::array::c_style | pyb::array::forcecast>::ensure(given);
  if (!a) throw pyb::type_error("mask: expected a [tokens, tokens] bool array");
  if (a.ndim() != 2 || a.shape(0) != tokens || a.shape(1) != tokens) {
    throw UsageError("mask: expected a [" + std::to_string(tokens) + ", " + std::to_string(tokens) +
                     "] bool array (True: the key stays visible)");
  }
  Mask m(tokens, tokens);
  std::copy(a.data(), a.data() + a.size(), m.data());
  return m;
}

/// The degenerate rows of every head: a list for a single head, a nested list [images][heads].
pyb::object degenerate_lists(bool single, Eigen::Index images, Eigen::Index heads,
                             const std::vector<std::vector<int>>& rows) {
  if (single) return pyb::cast(rows.front());
  pyb::list out;
  for (Eigen::Index i = 0; i < images; ++i) {
    pyb::list per_image;
    for (Eigen::Index h = 0; h < heads; ++h) per_image.append(pyb::cast(rows[i * heads + h]));
    out.append(per_image);
  }
  return out;
}

/// The array results are written into: a new one, or `out_obj` when given, which must be a
/// writeable C-contiguous array of T with exactly `shape` (TypeError / UsageError otherwise).
template <typename T>
pyb::array_t<T> result_array(const pyb::object& out_obj, const std::vector<pyb::ssize_t>& shape) {
  if (out_obj.is_none()) return pyb::array_t<T>(shape);
  const char* want = sizeof(T) == 4 ? "float32" : "float64";
  if (!pyb::isinstance<pyb::array_t<T, pyb::array::c_style>>(out_obj)) {
    throw pyb::type_error(std::string("out: expected a C-contiguous ") + want +
                          " array (the dtype the inputs compute in)");
  }
  auto out = pyb::reinterpret_borrow<pyb::array_t<T, pyb::array::c_style>>(out_obj);
  if (!out.writeable()) throw UsageError("out: the array is read-only");
  if (std::vector<pyb::ssize_t>(out.shape(), out.shape() + out.ndim()) != shape) {
    std::string s;
    for (auto x : shape) s += (s.empty() ? "" : ", ") + std::to_string(x);
    throw UsageError("out: expected shape [" + s + "]");
  }
  return out;
}

template <typename T>
pyb::tuple weights_of(pyb::handle q_obj, pyb::handle k_obj, const Variant& v,
                      const pyb::object& scale, const pyb::object& mask_obj,
                      const pyb::object& out_obj) {
  const Heads<T> q(q_obj, "q"), k(k_obj, "k");
  require_same_heads(q, k, true);
  const double s = scale_or_default(scale, q.dim());
  const std::optional<Mask> mask = mask_of(mask_obj, q.tokens());
  pyb::array_t<T> out = result_array<T>(out_obj, q.shape({q.tokens(), q.tokens()}));
  T* dst = out.mutable_data();
  const Eigen::Index n = q.tokens();
  std::vector<std::vector<int>> degenerate(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    Diagnostics diag;
    Eigen::Map<Mat<T>>(dst + i * n * n, n, n) =
        attention_weights<T>(v, q.head(i), k.head(i), s, mask ? &*mask : nullptr, &diag);
    degenerate[static_cast<std::size_t>(i)] = std::move(diag.degenerate_rows);
  });
  return pyb::make_tuple(out, degenerate_lists(q.single(), q.images(), q.heads(), degenerate));
}

template <typename T>
pyb::tuple outputs_of(pyb::handle q_obj, pyb::handle k_obj, pyb::handle v_obj, const Variant& v,
                      const pyb::object& scale, const pyb::object& mask_obj) {
  const Heads<T> q(q_obj, "q"), k(k_obj, "k"), values(v_obj, "v");
  require_same_heads(q, k, true);
  require_same_heads(q, values, false);
  const double s = scale_or_default(scale, q.dim());
  const std::optional<Mask> mask = mask_of(mask_obj, q.tokens());
  const Eigen::Index n = q.tokens(), dv = values.dim();
  pyb::array_t<T> out(q.shape({n, dv}));
  T* dst = out.mutable_data();
  std::vector<std::vector<int>> degenerate(static_cast<std::size_t>(q.count()));
  for_each_index(q.count(), [&](Eigen::Index i) {
    Diagnostics diag;
    Eigen::Map<Mat<T>> head_out(dst + i * n * dv, n, dv);
    attention_outputs_into<T>(v, q.head(i), k.head(i), values.head(i), s, head_out,
                              mask ? &*mask : nullptr, &diag);
    degenerate[static_cast<std::size_t>(i)] = std::move(diag.degenerate_rows);
  });
  return pyb::make_tuple(out, degenerate_lists(q.single(), q.images(), q.heads(), degenerate));
}

}  // namespace

Variant variant_of(const std::string& spec, const std::string& convention) {
  Variant v = parse_variant(spec, parse_convention(convention));
  std::string why;
  if (!v.supports(&why)) throw UsageError(v.name() + ": " + why);
  return v;
}

void bind_attention(pyb::module_& m) {
  m.def(
      "variant_name",
      [](const std::string& spec, const std::string& convention) {
        return variant_of(spec, convention).name();
      },
      pyb::arg("spec"), pyb::arg("convention") = "paper");
  m.def("families", [] {
    std::vector<std::string> names;
    for (const AttentionFamily* f : all_families()) names.emplace_back(f->name());
    return names;
  });
  m.def(
      "weights",
      [](pyb::handle q, pyb::handle k, const std::string& spec, const pyb::object& scale,
         const pyb::object& mask, const std::string& convention, const pyb::object& out) {
        const Variant v = variant_of(spec, convention);
        return scalar_of({{"q", q}, {"k", k}}) == Scalar::Double
                   ? weights_of<double>(q, k, v, scale, mask, out)
                   : weights_of<float>(q, k, v, scale, mask, out);
      },
      pyb::arg("q"), pyb::arg("k"), pyb::arg("variant"), pyb::arg("scale"), pyb::arg("mask"),
      pyb::arg("convention"), pyb::arg("out") = pyb::none());
  m.def(
      "outputs",
      [](pyb::handle q, pyb::handle k, pyb::handle values, const std::string& spec,
         const pyb::object& scale, const pyb::object& mask, const std::string& convention) {
        const Variant v = variant_of(spec, convention);
        return scalar_of({{"q", q}, {"k", k}, {"v", values}}) == Scalar::Double
                   ? outputs_of<double>(q, k, values, v, scale, mask)
                   : outputs_of<float>(q, k, values, v, scale, mask);
      },
      pyb::arg("q"), pyb::arg("k"), pyb::arg("v"), pyb::arg("variant"), pyb::arg("scale"),
      pyb::arg("mask"), pyb::arg("convention"));
}

}  // namespace attnscope::python
