// manifest: writes the layer manifest of a safetensors checkpoint of W8A8 int8 layers (the
// compressed-tensors format that vLLM loads), so that a server serves its layers as they are
// stored (qlinear-server --layer-manifest, qlinear-cli load --manifest).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli/cli.h"
#include "common/layer_name.h"
#include "common/npy.h"
#include "common/safetensors.h"

namespace qlinear::cli {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

// How the checkpoint quantizes activations: compressed-tensors' config_groups[*].input_activations.
struct ActivationScheme {
  bool dynamic = true, symmetric = true;
};

// The activation scheme config.json's quantization config gives, if there is a config.json; an
// error where it names a quantization qlinear does not serve (weights other than symmetric int8
// per channel or per tensor, activations other than int8).
absl::StatusOr<std::optional<ActivationScheme>> config_scheme(const fs::path& dir) {
  const fs::path config = dir / "config.json";
  std::error_code ec;
  const bool there = fs::exists(config, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read ", config.string(), ": ", ec.message()));
  }
  if (!there) return std::optional<ActivationScheme>();
  absl::StatusOr<std::string> text = read_file(config.string());
  if (!text.ok()) return text.status();
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(config.string(), ": ", what));
  };
  try {
    const Json doc = Json::parse(*text);
    // Where checkpoints keep it: quantization_config; compression_config (older
    // compressed-tensors); text_config.quantization_config (vision-language models).
    const Json* q = nullptr;
    if (doc.is_object()) {
      if (doc.contains("quantization_config")) {
        q = &doc["quantization_config"];
      } else if (doc.contains("compression_config")) {
        q = &doc["compression_config"];
      } else if (doc.contains("text_config") && doc["text_config"].is_object() &&
                 doc["text_config"].contains("quantization_config")) {
        q = &doc["text_config"]["quantization_config"];
      }
    }
    if (q == nullptr) return bad("has no quantization_config; not a quantized checkpoint");
    auto str = [](const Json& o, const char* key) {
      return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>()
                                                                    : std::string();
    };
    auto int8 = [](const Json& o) {
      return o.is_object() && o.contains("num_bits") && o["num_bits"].is_number_integer() &&
             o["num_bits"].get<int64_t>() == 8 && o.contains("type") && o["type"] == "int";
    };
    // A boolean where given, else `otherwise`; *ok false where given as something else.
    auto flag = [](const Json& o, const char* key, bool otherwise, bool* ok) {
      if (!o.contains(key) || o[key].is_null()) return otherwise;
      if (!o[key].is_boolean()) {
        *ok = false;
        return otherwise;
      }
      return o[key].get<bool>();
    };
    if (str(*q, "quant_method") != "compressed-tensors" || !q->contains("config_groups") ||
        !(*q)["config_groups"].is_object()) {
      return bad(
          "the quantization config is not compressed-tensors with config_groups (the W8A8 int8 "
          "format vLLM loads)");
    }
    std::optional<ActivationScheme> scheme;
    for (const auto& [group, g] : (*q)["config_groups"].items()) {
      const std::string at = absl::StrCat("config group '", group, "'");
      if (!g.is_object() || !g.contains("weights") || !int8(g["weights"])) {
        return bad(absl::StrCat(at, " does not quantize weights to int8"));
      }
      const Json& w = g["weights"];
      bool ok = true;
      const bool w_symmetric = flag(w, "symmetric", true, &ok);
      const std::string strategy = str(w, "strategy");
      if (!ok || !w_symmetric || (strategy != "channel" && strategy != "tensor")) {
        return bad(absl::StrCat(at,
                                " quantizes weights other than symmetric per channel or per "
                                "tensor (strategy '",
                                strategy, "'); qlinear serves those two"));
      }
      if (!g.contains("input_activations") || g["input_activations"].is_null()) {
        return bad(
            absl::StrCat(at, " leaves the activations unquantized (W8A16); qlinear serves W8A8"));
      }
      const Json& a = g["input_activations"];
      if (!int8(a)) return bad(absl::StrCat(at, " does not quantize activations to int8"));
      ActivationScheme s;
      s.dynamic = flag(a, "dynamic", false, &ok);
      s.symmetric = flag(a, "symmetric", true, &ok);
      if (!ok) return bad(absl::StrCat(at, ": dynamic and symmetric must be true or false"));
      if (scheme && (scheme->dynamic != s.dynamic || scheme->symmetric != s.symmetric)) {
        return bad("config groups quantize activations in different ways; not supported");
      }
      scheme = s;
    }
    if (!scheme) return bad("config_groups is empty");
    return scheme;
  } catch (const Json::exception& e) {
    return bad(absl::StrCat("not valid JSON: ", e.what()));
  }
}

}  // namespace

int cmd_manifest(const CommandArgs& args) {
  std::string checkpoint, output;
  bool fuse = true;
  ArgParser p(
      "qlinear-cli manifest --checkpoint DIR --output FILE",
      "Writes a layer manifest for a safetensors checkpoint of W8A8 int8 layers (the\n"
      "compressed-tensors format vLLM loads). Every int8 2-D tensor NAME.weight with a\n"
      "NAME.weight_scale becomes layer NAME, its tensors taken from the checkpoint's files as\n"
      "they are (with NAME.bias, NAME.input_scale and NAME.input_zero_point where there).\n"
      "The scheme comes from config.json's quantization config (config_groups'\n"
      "input_activations: dynamic or static, symmetric or not; weights must be symmetric int8 per\n"
      "channel or per tensor); without a config.json, from the tensors (static where an\n"
      "input_scale is stored, static asymmetric where an input_zero_point is too; dynamic\n"
      "asymmetric checkpoints need their config.json).\n"
      "Files are named by their names where FILE is written into DIR, by absolute paths\n"
      "otherwise. The q/k/v and gate/up projections of a layer become one fused layer each, as\n"
      "vLLM serves them (--fuse=false: one layer per module). Nothing is sent to a server: give\n"
      "FILE to qlinear-server --layer-manifest or to qlinear-cli load --manifest.");
  p.add("checkpoint", &checkpoint, "Folder of the checkpoint: *.safetensors and config.json");
  p.add("output", &output, "The manifest to write (JSON)");
  p.add("fuse", &fuse,
        "Fuse q/k/v_proj into qkv_proj and gate/up_proj into gate_up_proj, as vLLM serves them "
        "(--fuse=false: one layer per module)");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  if (checkpoint.empty() || output.empty()) {
    return usage_error("--checkpoint DIR and --output FILE are required");
  }
  std::error_code ec;
  const fs::path dir = fs::canonical(checkpoint, ec);
  if (ec) return fail(absl::NotFoundError(absl::StrCat(checkpoint, ": ", ec.message())));
  if (!fs::is_directory(dir, ec)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(checkpoint, " is not a folder")));
  }
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec) && it->path().extension() == ".safetensors") {
      files.push_back(it->path());
    }
  }
  if (ec) {
    return fail(absl::PermissionDeniedError(
        absl::StrCat("cannot list ", dir.string(), ": ", ec.message())));
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return fail(absl::NotFoundError(absl::StrCat("no *.safetensors files in ", dir.string())));
  }
  absl::StatusOr<std::optional<ActivationScheme>> config = config_scheme(dir);
  if (!config.ok()) return fail(config.status());

  // Where the manifest names the files from: their names where it lies in the checkpoint's folder.
  // (The folder as the server will take it: that of the path given, links in it resolved.)
  const fs::path out_dir = fs::weakly_canonical(fs::absolute(output, ec).parent_path(), ec);
  const bool beside = !ec && out_dir == dir;
  struct Where {
    std::string file;
    SafetensorsTensor t;
  };
  std::map<std::string, Where> tensors;
  for (const fs::path& f : files) {
    absl::StatusOr<SafetensorsHeader> h = read_safetensors_header(f.string());
    if (!h.ok()) return fail(h.status());
    const std::string name = beside ? f.filename().string() : f.string();
    for (auto& [t, info] : h->tensors) {
      if (!tensors.emplace(t, Where{name, info}).second) {
        return fail(absl::InvalidArgumentError(
            absl::StrCat("tensor '", t, "' is in two files: ", tensors[t].file, " and ", name)));
      }
    }
  }
  auto ref = [&](const std::string& tensor) {
    return Json{{"file", tensors[tensor].file}, {"tensor", tensor}};
  };
  Json layers = Json::array();
  int64_t bytes = 0;
  std::set<std::string> schemes;
  std::vector<std::string> no_scale, not_2d;
  for (const auto& [t, where] : tensors) {
    if (!absl::EndsWith(t, ".weight") || where.t.dtype != "I8") continue;
    if (where.t.shape.size() != 2) {
      not_2d.push_back(t);
      continue;
    }
    const std::string name = t.substr(0, t.size() - std::string(".weight").size());
    if (!tensors.count(name + ".weight_scale")) {
      no_scale.push_back(t);
      continue;
    }
    if (absl::Status s = validate_layer_name(name); !s.ok()) {
      return fail(absl::InvalidArgumentError(absl::StrCat("tensor '", t, "': ", s.message())));
    }
    if (tensors.count(name + ".weight_zero_point")) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("layer ", name, " has asymmetric weights (", name,
                       ".weight_zero_point); qlinear serves symmetric int8 weights")));
    }
    const bool has_scale = tensors.count(name + ".input_scale") > 0;
    const bool has_zp = tensors.count(name + ".input_zero_point") > 0;
    if (!config->has_value() && has_zp && !has_scale) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("layer ", name,
                       " has an input_zero_point but no input_scale; give the "
                       "checkpoint's config.json")));
    }
    const ActivationScheme s =
        config->has_value() ? **config : ActivationScheme{!has_scale, !has_zp};
    if (!s.dynamic && !has_scale) {
      return fail(absl::InvalidArgumentError(absl::StrCat(
          "layer ", name, ": config.json gives static activation scales but there is no tensor ",
          name, ".input_scale")));
    }
    if (!s.dynamic && !s.symmetric && !has_zp) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("layer ", name, ": static asymmetric activations need a tensor ", name,
                       ".input_zero_point")));
    }
    Json e = {{"name", name},
              {"weights", ref(t)},
              {"weight_scale", ref(name + ".weight_scale")},
              {"scheme", absl::StrCat(s.dynamic ? "dynamic" : "static", "_",
                                      s.symmetric ? "symmetric" : "asymmetric")}};
    schemes.insert(e["scheme"].get<std::string>());
    if (tensors.count(name + ".bias")) e["bias"] = ref(name + ".bias");
    if (!s.dynamic) e["input_scale"] = ref(name + ".input_scale");
    if (!s.dynamic && !s.symmetric) e["input_zero_point"] = ref(name + ".input_zero_point");
    layers.push_back(std::move(e));
    bytes += static_cast<int64_t>(where.t.bytes);
  }
  // vLLM's fused modules: q/k/v into qkv_proj, gate/up into gate_up_proj (in that order), where
  // every part is a layer of the same K and scheme (not static asymmetric) whose scales (and
  // biases, all or none) have one dtype.
  int fused = 0;
  if (fuse) {
    const std::pair<std::vector<std::string>, std::string> kGroups[] = {
        {{".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj"}, ".self_attn.qkv_proj"},
        {{".mlp.gate_proj", ".mlp.up_proj"}, ".mlp.gate_up_proj"}};
    std::map<std::string, size_t> index;
    for (size_t i = 0; i < layers.size(); ++i) index[layers[i]["name"].get<std::string>()] = i;
    std::set<size_t> gone;
    Json added = Json::array();
    for (const auto& [name, i] : index) {
      for (const auto& [suffixes, fused_suffix] : kGroups) {
        if (!absl::EndsWith(name, suffixes[0])) continue;
        const std::string prefix = name.substr(0, name.size() - suffixes[0].size());
        std::vector<size_t> parts;
        for (const std::string& suffix : suffixes) {
          const auto it = index.find(prefix + suffix);
          if (it != index.end()) parts.push_back(it->second);
        }
        if (parts.size() != suffixes.size()) continue;
        auto dtype = [&](const Json& r) { return tensors[r["tensor"].get<std::string>()].t.dtype; };
        auto k = [&](size_t p) {
          return tensors[layers[p]["weights"]["tensor"].get<std::string>()].t.shape[1];
        };
        const Json& first = layers[parts[0]];
        // (A static asymmetric module is not fused: see layer_manifest.h.)
        if (first["scheme"] == "static_asymmetric") continue;
        const std::string fused_name = prefix + fused_suffix;
        auto per_tensor = [&](const Json& r) {
          return tensors[r["tensor"].get<std::string>()].t.elements() == 1;
        };
        bool ok = validate_layer_name(fused_name).ok() && !index.count(fused_name);
        for (size_t p : parts) {
          const Json& l = layers[p];
          ok = ok && l["scheme"] == first["scheme"] && k(p) == k(parts[0]) &&
               dtype(l["weight_scale"]) == dtype(first["weight_scale"]) &&
               per_tensor(l["weight_scale"]) == per_tensor(first["weight_scale"]) &&
               l.contains("bias") == first.contains("bias") &&
               (!l.contains("bias") || dtype(l["bias"]) == dtype(first["bias"]));
        }
        if (!ok) {
          std::printf(
              "not fused %s: its parts differ in K, scale kind or dtypes, or the name does not "
              "fit\n",
              fused_name.c_str());
          continue;
        }
        Json e = {{"name", prefix + fused_suffix}, {"scheme", first["scheme"]}};
        for (const char* key : {"weights", "weight_scale", "bias", "input_scale"}) {
          if (!first.contains(key)) continue;
          e[key] = Json::array();
          for (size_t p : parts) e[key].push_back(layers[p][key]);
        }
        added.push_back(std::move(e));
        gone.insert(parts.begin(), parts.end());
        ++fused;
      }
    }
    Json kept = Json::array();
    for (size_t i = 0; i < layers.size(); ++i) {
      if (!gone.count(i)) kept.push_back(layers[i]);
    }
    for (Json& e : added) kept.push_back(std::move(e));
    layers = std::move(kept);
  }
  if (layers.empty()) {
    return fail(absl::NotFoundError(absl::StrCat(
        "no W8A8 layer (an int8 NAME.weight with a NAME.weight_scale) in ", dir.string())));
  }
  {
    // Written whole to a file beside it, then renamed over it: never half a manifest.
    const std::string tmp = output + ".tmp";
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (out) out << Json{{"layers", layers}}.dump(2) << "\n";
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::remove(tmp.c_str());
      return fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", tmp, ": ", why)));
    }
    if (std::rename(tmp.c_str(), output.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      std::remove(tmp.c_str());
      return fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", output, ": ", why)));
    }
  }
  std::printf(
      "wrote %s: %zu layers (%s of int8 weights%s) from %zu safetensors file%s; %s (%s)\n",
      output.c_str(), layers.size(), human_bytes(bytes).c_str(),
      fused > 0 ? absl::StrCat("; ", fused, " fused module", fused == 1 ? "" : "s").c_str() : "",
      files.size(), files.size() == 1 ? "" : "s", absl::StrJoin(schemes, ", ").c_str(),
      config->has_value() ? "config.json" : "from the tensors, without a config.json");
  for (const std::string& t : no_scale) {
    std::printf("skipped %s: int8 without a weight_scale\n", t.c_str());
  }
  for (const std::string& t : not_2d) {
    std::printf("skipped %s: int8 but not [N, K] (stacked experts?)\n", t.c_str());
  }
  return kExitOk;
}

}  // namespace qlinear::cli
