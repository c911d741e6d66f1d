#include "common/layer_manifest.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/layer_name.h"
#include "common/npy.h"
#include "common/safetensors.h"
#include "kernels/core/dtype.h"
#include "kernels/core/layer.h"
#include "kernels/core/status.h"

namespace qlinear {
namespace {

using Json = nlohmann::json;

constexpr const char* kKeys[] = {
    "name",          "weights",       "weight_scale",     "bias",
    "scheme",        "input_scale",   "input_zero_point", "logical_widths",
    "forced_kernel", "weight_sha256", "max_batch_rows",   "max_queue_delay_us"};

const char* type_name(const Json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

std::string resolve(absl::string_view base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return absl::StrCat(absl::StripSuffix(base_dir, "/"), "/", path);
}

// One entry of "layers" (`where` is "layers[I]" for messages).
absl::StatusOr<ManifestLayer> parse_entry(const Json& e, int index, absl::string_view base_dir) {
  const std::string where = absl::StrCat("layers[", index, "]");
  if (!e.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " must be an object, got ", type_name(e)));
  }
  ManifestLayer out;
  out.index = index;
  // The name first, so that later messages can give it.
  const auto name_it = e.find("name");
  if (name_it == e.end() || !name_it->is_string() || name_it->get<std::string>().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"name\" is required and must be a non-empty string"));
  }
  out.header.set_name(name_it->get<std::string>());
  if (absl::Status s = validate_layer_name(out.header.name()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", s.message()));
  }
  const std::string at = out.describe();
  for (const auto& [key, value] : e.items()) {
    bool known = false;
    for (const char* k : kKeys) known |= key == k;
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": unknown key \"", key, "\"; the keys are ", absl::StrJoin(kKeys, ", ")));
    }
  }
  auto string_at = [&](const char* key, std::string* v) -> absl::Status {
    const auto it = e.find(key);
    if (it == e.end()) return absl::OkStatus();
    if (!it->is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": \"", key, "\" must be a string, got ", type_name(*it)));
    }
    *v = it->get<std::string>();
    return absl::OkStatus();
  };
  // An integer in [lo, hi]; *present says whether the key is there.
  auto integer_at = [&](const char* key, int64_t lo, int64_t hi, int64_t* v,
                        bool* present) -> absl::Status {
    const auto it = e.find(key);
    *present = it != e.end();
    if (!*present) return absl::OkStatus();
    if (!it->is_number_integer() && !it->is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": \"", key, "\" must be an integer, got ",
                                                     type_name(*it), " (", it->dump(), ")"));
    }
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(at, ": \"", key, "\" is out of range"));
    }
    *v = it->get<int64_t>();
    if (*v < lo || *v > hi) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": \"", key, "\" must be in ", lo, "..", hi, ", got ", *v));
    }
    return absl::OkStatus();
  };

  // A tensor's source: a .npy file's path, or {"file": F, "tensor": T} for tensor T of the
  // safetensors file F; or (weights, weight_scale, bias, input_scale) an array of them, the
  // parts of a fused module, concatenated (see TensorSource::parts).
  auto one_source = [&](const char* key, const Json& j, TensorSource* v,
                        bool in_array) -> absl::Status {
    const bool scalar = std::string(key) == "input_scale" || std::string(key) == "input_zero_point";
    const std::string expected =
        in_array
            ? absl::StrCat(at, ": each part of \"", key, "\" must be ",
                           scalar ? "" : "the path of a .npy file or ",
                           "{\"file\": \"F.safetensors\", \"tensor\": \"T\"}")
            : absl::StrCat(at, ": \"", key, "\" must be ",
                           scalar ? "a number" : "the path of a .npy file",
                           " or {\"file\": \"F.safetensors\", \"tensor\": \"T\"}",
                           std::string(key) == "input_zero_point" ? "" : ", or an array of them");
    if (j.is_string() && !scalar) {
      if (j.get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": \"", key, "\" is an empty path (leave the key out for none)"));
      }
      v->path = resolve(base_dir, j.get<std::string>());
      return absl::OkStatus();
    }
    if (!j.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(expected, ", got ", type_name(j)));
    }
    for (const auto& [k, x] : j.items()) {
      if ((k != "file" && k != "tensor") || !x.is_string() || x.get<std::string>().empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(expected, "; \"", k, "\" is not one of them or not a non-empty string"));
      }
    }
    if (!j.contains("file") || !j.contains("tensor")) {
      return absl::InvalidArgumentError(absl::StrCat(expected, "; both keys are required"));
    }
    v->path = resolve(base_dir, j["file"].get<std::string>());
    v->tensor = j["tensor"].get<std::string>();
    return absl::OkStatus();
  };
  auto source_at = [&](const char* key, TensorSource* v) -> absl::Status {
    const auto it = e.find(key);
    if (it == e.end()) return absl::OkStatus();
    if (!it->is_array()) return one_source(key, *it, v, false);
    if (std::string(key) == "input_zero_point") {
      return absl::InvalidArgumentError(absl::StrCat(
          at,
          ": \"input_zero_point\" cannot be an array (fused static asymmetric modules are not "
          "served)"));
    }
    if (it->size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": \"", key, "\" as an array needs two or more parts"));
    }
    for (const Json& part : *it) {
      TensorSource p;
      if (absl::Status s = one_source(key, part, &p, true); !s.ok()) return s;
      v->parts.push_back(std::move(p));
    }
    return absl::OkStatus();
  };

  if (absl::Status s = source_at("weights", &out.weights); !s.ok()) return s;
  if (absl::Status s = source_at("weight_scale", &out.weight_scale); !s.ok()) return s;
  if (absl::Status s = source_at("bias", &out.bias); !s.ok()) return s;
  if (!out.weights.given() || !out.weight_scale.given()) {
    return absl::InvalidArgumentError(absl::StrCat(
        at, ": \"weights\" and \"weight_scale\" are required (.npy files or safetensors tensors)"));
  }

  std::string scheme = "dynamic_symmetric";
  if (absl::Status s = string_at("scheme", &scheme); !s.ok()) return s;
  absl::StatusOr<v1::Scheme> sc = parse_scheme_name(scheme);
  if (!sc.ok()) return absl::InvalidArgumentError(absl::StrCat(at, ": ", sc.status().message()));
  out.header.set_scheme(*sc);

  if (const auto it = e.find("input_scale"); it != e.end() && (it->is_object() || it->is_array())) {
    if (absl::Status s = source_at("input_scale", &out.input_scale); !s.ok()) return s;
    if (!out.input_scale.parts.empty() && *sc != v1::SCHEME_STATIC_SYMMETRIC) {
      return absl::InvalidArgumentError(absl::StrCat(
          at,
          ": \"input_scale\" as an array of parts is for a static_symmetric fused module only"));
    }
  } else if (it != e.end()) {
    if (!it->is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": \"input_scale\" must be a number or {\"file\": ..., \"tensor\": ...}, got ",
          type_name(*it)));
    }
    const std::optional<float> f = exact_float32(it->get<double>());
    if (!f.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ": \"input_scale\" ", it->dump(), " is out of the range of a float32"));
    }
    out.header.set_input_scale(*f);
  }
  int64_t v = 0;
  bool present = false;
  if (const auto it = e.find("input_zero_point");
      it != e.end() && (it->is_object() || it->is_array())) {
    if (absl::Status s = source_at("input_zero_point", &out.input_zero_point); !s.ok()) return s;
  } else if (absl::Status s = integer_at("input_zero_point", std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max(), &v, &present);
             !s.ok()) {
    return s;
  }
  if (present) out.header.set_input_zero_point(static_cast<int32_t>(v));
  if (absl::Status s =
          integer_at("max_batch_rows", 1, std::numeric_limits<int64_t>::max(), &v, &present);
      !s.ok()) {
    return s;
  }
  if (present) out.header.set_max_batch_rows(v);
  if (absl::Status s = integer_at("max_queue_delay_us", 0, 10'000'000, &v, &present); !s.ok()) {
    return s;
  }
  if (present) out.header.set_max_queue_delay_us(v);

  if (const auto it = e.find("logical_widths"); it != e.end()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at, ": \"logical_widths\" must be an array of positive integers, got ", type_name(*it)));
    }
    for (const Json& w : *it) {
      if (!w.is_number_integer() && !w.is_number_unsigned()) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": \"logical_widths\" must hold positive integers, got ", type_name(w)));
      }
      if (w.is_number_unsigned() &&
          w.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat(at, ": \"logical_widths\" holds a value out of range"));
      }
      if (w.get<int64_t>() < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            at, ": \"logical_widths\" must hold positive integers, got ", w.get<int64_t>()));
      }
      out.header.add_logical_widths(w.get<int64_t>());
    }
  }
  std::string s;
  if (absl::Status st = string_at("forced_kernel", &s); !st.ok()) return st;
  out.header.set_forced_kernel(s);
  s.clear();
  if (absl::Status st = string_at("weight_sha256", &s); !st.ok()) return st;
  out.header.set_weight_sha256(s);
  return out;
}

}  // namespace

std::string ManifestLayer::describe() const {
  return absl::StrCat("layer '", header.name(), "' (layers[", index, "])");
}

absl::StatusOr<std::vector<ManifestLayer>> parse_layer_manifest(absl::string_view json,
                                                                absl::string_view base_dir) {
  // JSON lets an object name a key twice (the last one counts); a manifest does not, so that a
  // key given twice by mistake cannot go unnoticed. The parser's callback sees every key, in
  // objects nested in objects and arrays (`where`: "", "layers", "layers[2]", ...).
  struct Frame {
    bool object = false;
    std::string where, last_key;
    std::set<std::string> keys;
    int elements = 0;
  };
  std::vector<Frame> frames;
  std::string duplicate;
  // A manifest nests four levels deep (layers, an entry, a fused module's parts, a part); one
  // nested much deeper is refused, its deeper values neither kept nor tracked (the parser then
  // reports no more events from inside them but their keys, at their depth).
  constexpr int kMaxDepth = 16;
  auto child_where = [&frames]() -> std::string {
    if (frames.empty()) return "";
    Frame& parent = frames.back();
    if (!parent.object) return absl::StrCat(parent.where, "[", parent.elements++, "]");
    return parent.where.empty() ? parent.last_key
                                : absl::StrCat(parent.where, ".", parent.last_key);
  };
  auto callback = [&](int depth, Json::parse_event_t event, Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start: {
        if (depth >= kMaxDepth) {
          if (duplicate.empty()) {
            duplicate = absl::StrCat("nested more than ", kMaxDepth, " levels deep");
          }
          return false;
        }
        Frame f;
        f.object = event == Json::parse_event_t::object_start;
        f.where = child_where();
        frames.push_back(std::move(f));
        break;
      }
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case Json::parse_event_t::key:
        if (depth > kMaxDepth) return false;  // inside a value dropped for its depth
        if (!frames.empty() && parsed.is_string()) {
          Frame& f = frames.back();
          f.last_key = parsed.get<std::string>();
          if (!f.keys.insert(f.last_key).second && duplicate.empty()) {
            duplicate = absl::StrCat(f.where.empty() ? "" : absl::StrCat(f.where, ": "),
                                     "the key \"", f.last_key, "\" is given twice");
          }
        }
        break;
      case Json::parse_event_t::value:
        if (!frames.empty() && !frames.back().object) ++frames.back().elements;
        break;
    }
    return true;
  };
  Json doc;
  try {
    doc = Json::parse(json.begin(), json.end(), callback);
  } catch (const Json::exception& e) {
    // e.what(): "[json.exception.parse_error.101] parse error at line 3, column 5: ...", or
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'".
    std::string what = e.what();
    if (const size_t p = what.find("] "); what.rfind("[json.exception", 0) == 0 && p != what.npos) {
      what = what.substr(p + 2);
    }
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", what));
  }
  if (!duplicate.empty()) return absl::InvalidArgumentError(duplicate);
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be an object with a \"layers\" array, got ", type_name(doc)));
  }
  for (const auto& [key, value] : doc.items()) {
    if (key != "layers") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown key \"", key, "\"; the manifest holds \"layers\" only"));
    }
  }
  const auto layers = doc.find("layers");
  if (layers == doc.end() || !layers->is_array()) {
    return absl::InvalidArgumentError("must have a \"layers\" array");
  }
  std::vector<ManifestLayer> out;
  std::map<std::string, int> first_index;
  for (size_t i = 0; i < layers->size(); ++i) {
    absl::StatusOr<ManifestLayer> e = parse_entry((*layers)[i], static_cast<int>(i), base_dir);
    if (!e.ok()) return e.status();
    const auto [it, inserted] = first_index.emplace(e->header.name(), e->index);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat("layer '", e->header.name(),
                                                     "' is named twice (layers[", it->second,
                                                     "] and layers[", e->index, "])"));
    }
    out.push_back(*std::move(e));
  }
  return out;
}

absl::StatusOr<std::vector<ManifestLayer>> read_layer_manifest(const std::string& path) {
  absl::StatusOr<std::string> text = read_file(path);
  if (!text.ok()) return text.status();
  const size_t slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  absl::StatusOr<std::vector<ManifestLayer>> layers = parse_layer_manifest(*text, base_dir);
  if (!layers.ok()) {
    return absl::Status(layers.status().code(),
                        absl::StrCat(path, ": ", layers.status().message()));
  }
  return layers;
}

std::optional<float> exact_float32(double value) {
  if (!(std::fabs(value) <= std::numeric_limits<float>::max())) return std::nullopt;
  const float f = static_cast<float>(value);
  if (value != 0 && f == 0) return std::nullopt;
  return f;
}

absl::Status check_bias_not_empty(const v1::Tensor& bias, absl::string_view source, int64_t n) {
  if (!bias.data().empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(source, ": bias has 0 values, expected n=", n));
}

absl::StatusOr<v1::Tensor> read_float_tensor_npy(const std::string& path, absl::string_view what) {
  absl::StatusOr<NpyArray> a = read_npy_file(path);
  if (!a.ok()) return a.status();
  v1::Tensor t;
  if (a->dtype == NpyDType::kF4) {
    t.set_dtype(v1::DTYPE_FP32);
  } else if (a->dtype == NpyDType::kF2) {
    t.set_dtype(v1::DTYPE_FP16);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", what, " must be float32 (<f4) or float16 (<f2), got ", npy_descr(a->dtype)));
  }
  for (int64_t d : a->shape) t.add_shape(d);
  t.set_data(std::move(a->data));
  return t;
}

absl::StatusOr<v1::Scheme> parse_scheme_name(absl::string_view name) {
  for (Scheme s : {Scheme::kDynamicSymmetric, Scheme::kStaticSymmetric, Scheme::kDynamicAsymmetric,
                   Scheme::kStaticAsymmetric}) {
    if (name == scheme_name(s)) return static_cast<v1::Scheme>(static_cast<int>(s));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown scheme '", name,
      "'; expected dynamic_symmetric, static_symmetric, dynamic_asymmetric or static_asymmetric"));
}

std::string TensorSource::describe() const {
  if (!parts.empty()) {
    std::vector<std::string> each;
    for (const TensorSource& p : parts) each.push_back(p.describe());
    return absl::StrCat("[", absl::StrJoin(each, "; "), "]");
  }
  return tensor.empty() ? path : absl::StrCat(path, ", tensor '", tensor, "'");
}

namespace {

// What a tensor is read as.
enum class Kind {
  kWeights,      // I8 [N, K]
  kFloats,       // weight_scale, bias: F32, F16 or BF16
  kFloatScalar,  // input_scale: one F32, F16 or BF16
  kIntScalar,    // input_zero_point: one I32 or I8
};

bool is_float(const std::string& dt) { return dt == "F32" || dt == "F16" || dt == "BF16"; }
// The DType of a float safetensors dtype (is_float).
DType float_dtype(const std::string& dt) {
  return dt == "F32" ? DType::kF32 : dt == "F16" ? DType::kF16 : DType::kBF16;
}

// The safetensors tensor `src` names, checked for what it is read as.
absl::StatusOr<std::pair<const SafetensorsHeader*, const SafetensorsTensor*>> lookup(
    SafetensorsHeaderCache& cache, const TensorSource& src, Kind kind, absl::string_view what) {
  ASSIGN_OR_RETURN(const SafetensorsHeader* h, cache.get(src.path));
  const auto it = h->tensors.find(src.tensor);
  if (it == h->tensors.end()) {
    return absl::NotFoundError(absl::StrCat(src.path, " has no tensor '", src.tensor, "'"));
  }
  const SafetensorsTensor& t = it->second;
  std::string wanted;
  switch (kind) {
    case Kind::kWeights:
      if (t.dtype != "I8" || t.shape.size() != 2) wanted = "I8 of shape [N, K]";
      break;
    case Kind::kFloats:
      if (!is_float(t.dtype)) wanted = "F32, F16 or BF16";
      break;
    case Kind::kFloatScalar:
      if (!is_float(t.dtype) || t.elements() != 1) wanted = "one value of F32, F16 or BF16";
      break;
    case Kind::kIntScalar:
      if ((t.dtype != "I32" && t.dtype != "I8") || t.elements() != 1)
        wanted = "one value of I32 or I8";
      break;
  }
  if (!wanted.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(src.describe(), ": ", what, " must be ", wanted,
                                                   ", got ", t.dtype, " ", shape_string(t.shape)));
  }
  return std::make_pair(h, &t);
}

// Whether the parts of a fused module's `what` (`src`, part i of dtype dtypes[i] holding
// elements[i] values) fit its weights' parts of `rows` rows: as many parts, part i holding rows[i]
// values or, where per_tensor_allowed, every part one value; all of one dtype.
absl::Status check_parts(const TensorSource& src, absl::string_view what,
                         const std::vector<std::string>& dtypes,
                         const std::vector<int64_t>& elements, const std::vector<int64_t>& rows,
                         bool per_tensor_allowed) {
  if (rows.size() != src.parts.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has ", src.parts.size(),
                                                   " parts where the weights have ", rows.size()));
  }
  bool scalars = per_tensor_allowed, channels = true;
  for (size_t i = 0; i < dtypes.size(); ++i) {
    scalars = scalars && elements[i] == 1;
    channels = channels && elements[i] == rows[i];
    if (!scalars && !channels) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.parts[i].describe(), ": part ", i, " of ", what, " holds ", elements[i],
                       " values where its weights have ", rows[i], " rows",
                       per_tensor_allowed ? " (or one for all, in every part)" : ""));
    }
    if (dtypes[i] != dtypes[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(src.describe(), ": the parts of ", what, " are of different dtypes"));
    }
  }
  return absl::OkStatus();
}

// A float tensor (weight_scale, bias) from its source: a .npy file of float32 or float16, or a
// safetensors tensor of F32, F16 or BF16.
absl::StatusOr<v1::Tensor> read_float_tensor(SafetensorsHeaderCache& cache, const TensorSource& src,
                                             absl::string_view what,
                                             const std::vector<int64_t>& widths = {},
                                             bool per_tensor_allowed = true) {
  if (!src.parts.empty()) {
    // The parts of a fused module, one after another: [N_1 (, 1)] ... -> [N (, 1)], or one value
    // each (per-tensor scales) -> [parts], one per logical width. Part i holds N_i values (the
    // i-th weights part's rows), or one value where per-tensor values are allowed; all alike.
    std::vector<v1::Tensor> parts;
    std::vector<std::string> dtypes;
    std::vector<int64_t> elements;
    bool scalars = true;
    for (const TensorSource& p : src.parts) {
      ASSIGN_OR_RETURN(v1::Tensor t, read_float_tensor(cache, p, what));
      int64_t n = 1;
      for (int64_t d : t.shape()) n *= d;
      scalars = scalars && n == 1 && per_tensor_allowed;
      dtypes.push_back(v1::DType_Name(t.dtype()));
      elements.push_back(n);
      parts.push_back(std::move(t));
    }
    // Parts stored as rows, [1, N_i] (SPEC section 1's [1, c]), stack as [N_i] ones: where one
    // part is plainly a row (N_i > 1), a [1, 1] part beside it is one too (else a column's).
    auto row = [](const v1::Tensor& t) { return t.shape_size() == 2 && t.shape(0) == 1; };
    if (std::any_of(parts.begin(), parts.end(),
                    [&](const v1::Tensor& t) { return row(t) && t.shape(1) > 1; })) {
      for (v1::Tensor& t : parts) {
        if (!row(t)) continue;
        const int64_t n = t.shape(1);
        t.clear_shape();
        t.add_shape(n);
      }
    }
    RETURN_IF_ERROR(check_parts(src, what, dtypes, elements, widths, per_tensor_allowed));
    v1::Tensor out;
    out.set_dtype(parts[0].dtype());
    int64_t rows = 0;
    for (const v1::Tensor& t : parts) {
      const bool same_rest =
          t.shape_size() >= 1 && t.shape_size() == parts[0].shape_size() &&
          std::equal(t.shape().begin() + 1, t.shape().end(), parts[0].shape().begin() + 1);
      if (!scalars && !same_rest) {
        return absl::InvalidArgumentError(
            absl::StrCat(src.describe(), ": the parts of ", what,
                         " are not of shapes [N_i] (or [1, N_i]) or [N_i, 1] alike"));
      }
      rows += scalars ? 1 : t.shape(0);
      out.mutable_data()->append(t.data());
    }
    out.add_shape(rows);
    if (!scalars) {
      for (int i = 1; i < parts[0].shape_size(); ++i) out.add_shape(parts[0].shape(i));
    }
    return out;
  }
  if (src.tensor.empty()) return read_float_tensor_npy(src.path, what);
  ASSIGN_OR_RETURN(auto found, lookup(cache, src, Kind::kFloats, what));
  const SafetensorsTensor& t = *found.second;
  v1::Tensor out;
  out.set_dtype(static_cast<v1::DType>(static_cast<int>(float_dtype(t.dtype))));
  for (int64_t d : t.shape) out.add_shape(d);
  ASSIGN_OR_RETURN(std::string bytes, read_safetensors_tensor(*found.first, src.tensor));
  out.set_data(std::move(bytes));
  return out;
}

// The one value of a safetensors tensor of one element (input_scale: F32, F16 or BF16;
// input_zero_point: I32 or I8), as a double (exact for each).
absl::StatusOr<double> read_scalar(SafetensorsHeaderCache& cache, const TensorSource& src,
                                   Kind kind, absl::string_view what) {
  ASSIGN_OR_RETURN(auto found, lookup(cache, src, kind, what));
  const std::string& dt = found.second->dtype;
  ASSIGN_OR_RETURN(std::string b, read_safetensors_tensor(*found.first, src.tensor));
  const auto* p = reinterpret_cast<const unsigned char*>(b.data());
  if (dt == "I8") return static_cast<double>(static_cast<int8_t>(p[0]));
  if (dt == "I32") {
    int32_t v;
    std::memcpy(&v, p, 4);
    return static_cast<double>(v);
  }
  return static_cast<double>(load_as_f32(b.data(), float_dtype(dt), 0));
}

// Each of a layer's tensors with what it is read as.
struct Use {
  const TensorSource* src;
  Kind kind;
  const char* what;
};
std::vector<Use> uses(const ManifestLayer& l) {
  return {{&l.weights, Kind::kWeights, "weights"},
          {&l.weight_scale, Kind::kFloats, "weight_scale"},
          {&l.bias, Kind::kFloats, "bias"},
          {&l.input_scale, Kind::kFloatScalar, "input_scale"},
          {&l.input_zero_point, Kind::kIntScalar, "input_zero_point"}};
}

// One source's weights: a .npy file of int8 [N, K] (read once, copied once into *weights) or an
// I8 [N, K] safetensors tensor (read straight into *weights).
absl::Status read_weights(SafetensorsHeaderCache& cache, const TensorSource& ws,
                          std::vector<int64_t>* shape, std::vector<int8_t>* weights) {
  if (ws.tensor.empty()) {
    absl::StatusOr<std::string> file = read_file(ws.path);
    if (!file.ok()) return file.status();
    absl::StatusOr<NpyView> w = view_npy(*file);
    if (!w.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(ws.path, ": ", w.status().message()));
    }
    if (w->dtype != NpyDType::kI1 || w->shape.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(ws.path, ": weights must be int8 (|i1) of shape [N, K], got ",
                       npy_descr(w->dtype), " ", shape_string(w->shape)));
    }
    *shape = w->shape;
    weights->assign(w->data.begin(), w->data.end());
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(auto found, lookup(cache, ws, Kind::kWeights, "weights"));
  *shape = found.second->shape;
  weights->resize(static_cast<size_t>(found.second->bytes));
  return read_safetensors_tensor_into(*found.first, ws.tensor,
                                      reinterpret_cast<char*>(weights->data()));
}

// For a fused module whose parts are safetensors tensors, from their headers: every weights part
// of one K, and each float tensor's parts of one dtype, each fitting its weights part's rows (or,
// for weight_scale, one value in every part).
absl::Status check_parts_fit(SafetensorsHeaderCache& cache, const ManifestLayer& l) {
  const std::vector<TensorSource>& wp = l.weights.parts;
  if (wp.empty()) return absl::OkStatus();
  auto header_of = [&](const TensorSource& p) -> const SafetensorsTensor* {
    if (p.tensor.empty()) return nullptr;
    auto h = cache.get(p.path);
    if (!h.ok()) return nullptr;
    const auto it = (*h)->tensors.find(p.tensor);
    return it == (*h)->tensors.end() ? nullptr : &it->second;
  };
  std::vector<int64_t> rows;
  for (const TensorSource& p : wp) {
    const SafetensorsTensor* t = header_of(p);
    if (t == nullptr) return absl::OkStatus();  // a .npy part: checked when read
    if (!rows.empty() && t->shape[1] != header_of(wp[0])->shape[1]) {
      return absl::InvalidArgumentError(
          absl::StrCat(p.describe(), ": K=", t->shape[1],
                       " where the first part has K=", header_of(wp[0])->shape[1]));
    }
    rows.push_back(t->shape[0]);
  }
  for (const auto& [src, what, per_tensor_allowed] :
       {std::tuple<const TensorSource*, const char*, bool>{&l.weight_scale, "weight_scale", true},
        {&l.bias, "bias", false}}) {
    if (src->parts.empty()) continue;
    std::vector<std::string> dtypes;
    std::vector<int64_t> elements;
    for (const TensorSource& p : src->parts) {
      const SafetensorsTensor* t = header_of(p);
      if (t == nullptr) return absl::OkStatus();  // a .npy part: checked when read
      dtypes.push_back(t->dtype);
      elements.push_back(t->elements());
    }
    RETURN_IF_ERROR(check_parts(*src, what, dtypes, elements, rows, per_tensor_allowed));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<const SafetensorsHeader*> SafetensorsHeaderCache::get(const std::string& path) {
  auto it = headers_.find(path);
  if (it == headers_.end()) {
    absl::StatusOr<SafetensorsHeader> h = read_safetensors_header(path);
    if (!h.ok()) return h.status();
    it = headers_.emplace(path, *std::move(h)).first;
  }
  return &it->second;
}

absl::Status check_manifest_tensors(const std::vector<ManifestLayer>& layers,
                                    SafetensorsHeaderCache* headers) {
  SafetensorsHeaderCache own;
  SafetensorsHeaderCache& cache = headers != nullptr ? *headers : own;
  for (const ManifestLayer& l : layers) {
    std::vector<Use> each;
    for (const Use& u : uses(l)) {
      if (u.src->parts.empty()) each.push_back(u);
      for (const TensorSource& p : u.src->parts) each.push_back({&p, u.kind, u.what});
    }
    for (const Use& u : each) {
      const TensorSource& src = *u.src;
      if (src.path.empty()) continue;
      absl::Status s;
      if (src.tensor.empty()) {
        struct stat st;
        const int err = stat(src.path.c_str(), &st) != 0 ? errno : 0;
        if (err != 0 || !S_ISREG(st.st_mode)) {
          s = absl::Status(
              err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kInvalidArgument,
              absl::StrCat(src.path, err == ENOENT ? " does not exist"
                                     : err != 0    ? absl::StrCat(": ", std::strerror(err))
                                                   : " is not a regular file"));
        }
      } else {
        s = lookup(cache, src, u.kind, u.what).status();
      }
      if (!s.ok()) return absl::Status(s.code(), absl::StrCat(l.describe(), ": ", s.message()));
    }
    // A fused module whose parts are all safetensors tensors: the checks on how they fit
    // together that need only their headers (read_manifest_layer makes them all, .npy parts too).
    if (absl::Status s = check_parts_fit(cache, l); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(l.describe(), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

namespace {
absl::Status read_manifest_layer_files(const ManifestLayer& layer, v1::LayerHeader* header,
                                       std::vector<int8_t>* weights,
                                       SafetensorsHeaderCache* headers);
}  // namespace

namespace {

// An entry's weight bytes as its files give them (a .npy file's header counted too), and the
// most that reading one of its sources holds beside them (see manifest_layer_read_bytes).
struct WeightReadBytes {
  int64_t total = 0, beside = 0;
};

absl::StatusOr<WeightReadBytes> weight_read_bytes(const ManifestLayer& layer,
                                                  SafetensorsHeaderCache& cache) {
  const bool fused = !layer.weights.parts.empty();
  WeightReadBytes r;
  auto add = [&](const TensorSource& ws) -> absl::Status {
    int64_t bytes = 0, copy = 0;
    if (ws.tensor.empty()) {
      struct stat st {};
      if (stat(ws.path.c_str(), &st) != 0) {
        return absl::NotFoundError(absl::StrCat(ws.path, ": ", std::strerror(errno)));
      }
      bytes = static_cast<int64_t>(st.st_size);  // the weights, and the header's few bytes
      copy = fused ? 2 * bytes : bytes;          // the file read, and a part's own vector
    } else {
      ASSIGN_OR_RETURN(auto found, lookup(cache, ws, Kind::kWeights, "weights"));
      bytes = found.second->bytes;
      copy = fused ? bytes : 0;
    }
    r.total += bytes;
    r.beside = std::max(r.beside, copy);
    return absl::OkStatus();
  };
  if (!fused) {
    RETURN_IF_ERROR(add(layer.weights));
  } else {
    for (const TensorSource& p : layer.weights.parts) RETURN_IF_ERROR(add(p));
  }
  return r;
}

}  // namespace

absl::StatusOr<int64_t> manifest_layer_read_bytes(const ManifestLayer& layer,
                                                  SafetensorsHeaderCache* headers) {
  SafetensorsHeaderCache own;
  ASSIGN_OR_RETURN(const WeightReadBytes r,
                   weight_read_bytes(layer, headers != nullptr ? *headers : own));
  return r.total + r.beside;
}

absl::Status read_manifest_layer(const ManifestLayer& layer, v1::LayerHeader* header,
                                 std::vector<int8_t>* weights, SafetensorsHeaderCache* headers) {
  // Buffers are sized from the files' own headers: one too large to allocate is this layer's
  // error, not an exception out of the start-up or the CLI.
  try {
    return read_manifest_layer_files(layer, header, weights, headers);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "layers[", layer.index, "] ('", layer.header.name(),
        "'): out of memory reading its files (a tensor larger than this host can hold?)"));
  }
}

namespace {
absl::Status read_manifest_layer_files(const ManifestLayer& layer, v1::LayerHeader* header,
                                       std::vector<int8_t>* weights,
                                       SafetensorsHeaderCache* headers) {
  *header = layer.header;
  SafetensorsHeaderCache own;
  SafetensorsHeaderCache& cache = headers != nullptr ? *headers : own;
  std::vector<int64_t> shape;
  if (layer.weights.parts.empty()) {
    if (absl::Status s = read_weights(cache, layer.weights, &shape, weights); !s.ok()) return s;
  } else {
    // A fused module: the parts' rows one after another; their Ns are the logical widths. The
    // weights are sized for every part first, so that no part's append holds two copies of them
    // (manifest_layer_read_bytes counts on it).
    weights->clear();
    ASSIGN_OR_RETURN(const WeightReadBytes sizes, weight_read_bytes(layer, cache));
    weights->reserve(static_cast<size_t>(sizes.total));
    std::vector<int64_t> widths;
    for (const TensorSource& p : layer.weights.parts) {
      std::vector<int64_t> part_shape;
      std::vector<int8_t> part;
      if (absl::Status s = read_weights(cache, p, &part_shape, &part); !s.ok()) return s;
      if (!widths.empty() && part_shape[1] != shape[1]) {
        return absl::InvalidArgumentError(absl::StrCat(p.describe(), ": K=", part_shape[1],
                                                       " where the first part has K=", shape[1]));
      }
      if (widths.empty()) shape = part_shape;
      widths.push_back(part_shape[0]);
      weights->insert(weights->end(), part.begin(), part.end());
    }
    shape[0] = 0;
    for (int64_t w : widths) shape[0] += w;
    if (header->logical_widths_size() == 0) {
      for (int64_t w : widths) header->add_logical_widths(w);
    } else if (!std::equal(widths.begin(), widths.end(), header->logical_widths().begin(),
                           header->logical_widths().end())) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"logical_widths\" [", absl::StrJoin(header->logical_widths(), ", "),
                       "] differ from the weights' parts [", absl::StrJoin(widths, ", "), "]"));
    }
  }
  header->set_n(shape[0]);
  header->set_k(shape[1]);
  const std::vector<int64_t> widths(header->logical_widths().begin(),
                                    header->logical_widths().end());
  const std::vector<int64_t> part_rows =
      layer.weights.parts.empty() ? std::vector<int64_t>{} : widths;
  ASSIGN_OR_RETURN(*header->mutable_weight_scale(),
                   read_float_tensor(cache, layer.weight_scale, "weight_scale", part_rows, true));
  if (layer.bias.given()) {
    ASSIGN_OR_RETURN(*header->mutable_bias(),
                     read_float_tensor(cache, layer.bias, "bias", part_rows, false));
    RETURN_IF_ERROR(check_bias_not_empty(
        header->bias(),
        layer.bias.parts.empty() ? layer.bias.describe() : std::string("the bias parts"),
        shape[0]));
  }
  if (layer.input_scale.given()) {
    // A fused module's parts: the largest of their scales (a calibrated checkpoint gives its
    // parts, which see the same input, the same scale; the largest never clips).
    double d = 0;
    if (layer.input_scale.parts.empty()) {
      ASSIGN_OR_RETURN(d, read_scalar(cache, layer.input_scale, Kind::kFloatScalar, "input_scale"));
    } else {
      if (header->scheme() != v1::SCHEME_STATIC_SYMMETRIC) {
        return absl::InvalidArgumentError(
            "\"input_scale\" as parts is for a static_symmetric fused module only");
      }
      for (size_t i = 0; i < layer.input_scale.parts.size(); ++i) {
        const TensorSource& p = layer.input_scale.parts[i];
        ASSIGN_OR_RETURN(const double v, read_scalar(cache, p, Kind::kFloatScalar, "input_scale"));
        if (!(std::isfinite(v) && v > 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat(p.describe(), ": input_scale must be finite and > 0, got ", v));
        }
        d = i == 0 ? v : std::max(d, v);
      }
    }
    header->set_input_scale(static_cast<float>(d));
  }
  if (layer.input_zero_point.given()) {
    ASSIGN_OR_RETURN(const double d, read_scalar(cache, layer.input_zero_point, Kind::kIntScalar,
                                                 "input_zero_point"));
    header->set_input_zero_point(static_cast<int32_t>(d));
  }
  return absl::OkStatus();
}
}  // namespace

}  // namespace qlinear
