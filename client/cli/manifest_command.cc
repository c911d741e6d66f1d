// manifest: writes the layer manifest of a safetensors checkpoint of W8A8 int8 layers (the
// compressed-tensors format that vLLM loads), so that a server serves its layers as they are
// stored (qlinear-server --layer-manifest, qlinear-cli load --manifest).
#include <algorithm>
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

// The activation scheme config.json's quantization_config gives, if it is there; an error where
// it names one qlinear does not serve.
absl::StatusOr<std::optional<ActivationScheme>> config_scheme(const fs::path& dir) {
  const fs::path config = dir / "config.json";
  std::error_code ec;
  if (!fs::exists(config, ec)) return std::optional<ActivationScheme>();
  absl::StatusOr<std::string> text = read_file(config.string());
  if (!text.ok()) return text.status();
  Json doc;
  try {
    doc = Json::parse(*text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(config.string(), ": not valid JSON: ", e.what()));
  }
  const auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(config.string(), ": ", what));
  };
  if (!doc.is_object() || !doc.contains("quantization_config")) {
    return bad("has no quantization_config; not a quantized checkpoint");
  }
  const Json& q = doc["quantization_config"];
  if (!q.is_object() || q.value("quant_method", "") != "compressed-tensors" ||
      !q.contains("config_groups") || !q["config_groups"].is_object()) {
    return bad(
        "quantization_config is not compressed-tensors with config_groups (the W8A8 int8 "
        "format vLLM loads)");
  }
  std::optional<ActivationScheme> scheme;
  for (const auto& [group, g] : q["config_groups"].items()) {
    const Json* w = g.is_object() && g.contains("weights") ? &g["weights"] : nullptr;
    const Json* a =
        g.is_object() && g.contains("input_activations") ? &g["input_activations"] : nullptr;
    if (w == nullptr || !w->is_object() || w->value("type", "") != "int" ||
        w->value("num_bits", 0) != 8) {
      return bad(absl::StrCat("config group '", group, "' does not quantize weights to int8"));
    }
    if (a == nullptr || !a->is_object()) {
      return bad(absl::StrCat("config group '", group,
                              "' leaves the activations unquantized (W8A16); qlinear serves "
                              "W8A8"));
    }
    if (a->value("type", "") != "int" || a->value("num_bits", 0) != 8) {
      return bad(absl::StrCat("config group '", group, "' does not quantize activations to int8"));
    }
    ActivationScheme s;
    s.dynamic = a->value("dynamic", false);
    s.symmetric = a->value("symmetric", true);
    if (scheme && (scheme->dynamic != s.dynamic || scheme->symmetric != s.symmetric)) {
      return bad("config groups quantize activations in different ways; not supported");
    }
    scheme = s;
  }
  if (!scheme) return bad("config_groups is empty");
  return scheme;
}

}  // namespace

int cmd_manifest(const CommandArgs& args) {
  std::string checkpoint, output;
  ArgParser p(
      "qlinear-cli manifest --checkpoint DIR --output FILE",
      "Writes a layer manifest for a safetensors checkpoint of W8A8 int8 layers (the\n"
      "compressed-tensors format vLLM loads). Every int8 2-D tensor NAME.weight with a\n"
      "NAME.weight_scale becomes layer NAME, its tensors taken from the checkpoint's files as\n"
      "they are (with NAME.bias, NAME.input_scale and NAME.input_zero_point where there).\n"
      "The scheme comes from config.json's quantization_config (config_groups'\n"
      "input_activations: dynamic or static, symmetric or not); without a config.json, from the\n"
      "tensors (static where an input_scale is stored, asymmetric where an input_zero_point is).\n"
      "Files are named by their names where FILE is written into DIR, by absolute paths\n"
      "otherwise. Nothing is sent to a server: give FILE to qlinear-server --layer-manifest or\n"
      "to qlinear-cli load --manifest.");
  p.add("checkpoint", &checkpoint, "Folder of the checkpoint: *.safetensors and config.json");
  p.add("output", &output, "The manifest to write (JSON)");
  if (int rc = parse_command_line(p, args); rc >= 0) return rc;
  if (checkpoint.empty() || output.empty()) {
    return usage_error("--checkpoint DIR and --output FILE are required");
  }
  std::error_code ec;
  const fs::path dir = fs::canonical(checkpoint, ec);
  if (ec || !fs::is_directory(dir)) {
    return fail(absl::NotFoundError(absl::StrCat(checkpoint, " is not a folder")));
  }
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file() && e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    return fail(absl::NotFoundError(absl::StrCat("no *.safetensors files in ", dir.string())));
  }
  absl::StatusOr<std::optional<ActivationScheme>> config = config_scheme(dir);
  if (!config.ok()) return fail(config.status());

  // Where the manifest names the files from: their names where it lies in the checkpoint's folder.
  const fs::path out_dir = fs::weakly_canonical(fs::absolute(output)).parent_path();
  const bool beside = out_dir == dir;
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
  std::vector<std::string> no_scale;
  for (const auto& [t, where] : tensors) {
    if (!absl::EndsWith(t, ".weight") || where.t.dtype != "I8" || where.t.shape.size() != 2) {
      continue;
    }
    const std::string name = t.substr(0, t.size() - std::string(".weight").size());
    if (!tensors.count(name + ".weight_scale")) {
      no_scale.push_back(t);
      continue;
    }
    const bool has_scale = tensors.count(name + ".input_scale") > 0;
    const bool has_zp = tensors.count(name + ".input_zero_point") > 0;
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
  if (layers.empty()) {
    return fail(absl::NotFoundError(absl::StrCat(
        "no W8A8 layer (an int8 NAME.weight with a NAME.weight_scale) in ", dir.string())));
  }
  {
    std::ofstream out(output, std::ios::binary | std::ios::trunc);
    out << Json{{"layers", layers}}.dump(2) << "\n";
    if (!out) {
      return fail(absl::PermissionDeniedError(absl::StrCat("cannot write ", output)));
    }
  }
  std::printf("wrote %s: %zu layers (%s of int8 weights) from %zu safetensors file%s; %s (%s)\n",
              output.c_str(), layers.size(), human_bytes(bytes).c_str(), files.size(),
              files.size() == 1 ? "" : "s", absl::StrJoin(schemes, ", ").c_str(),
              config->has_value() ? "config.json" : "from the tensors, without a config.json");
  for (const std::string& t : no_scale) {
    std::printf("skipped %s: int8 without a weight_scale\n", t.c_str());
  }
  return kExitOk;
}

}  // namespace qlinear::cli
