// HF folder I/O for GPT-2 (hf_io.h), driven by the tensor table.
#include "models/gpt2/hf_io.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "data/safetensors.h"

namespace mw::gpt2 {

namespace fs = std::filesystem;

Config load_hf_config(const std::string& dir) {
  MW_CHECK_T(IoError, fs::is_directory(dir), "--init-from '", dir,
             "' is not a directory; expected a HuggingFace GPT-2 folder with config.json and "
             "model.safetensors");
  return Config::from_json_file((fs::path(dir) / "config.json").string());
}

void load_hf_weights(GPT2& model, const std::string& dir) {
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  data::SafeTensorsReader reader(path);
  // HF checkpoints name tensors "transformer.h.0..." (GPT2LMHeadModel) or "h.0..." (GPT2Model).
  const bool bare = !reader.find("transformer.wte.weight") && reader.find("wte.weight");
  auto file_name = [&](const std::string& hf_name) {
    return bare ? hf_name.substr(std::strlen("transformer.")) : hf_name;
  };
  // Validate everything before touching any parameter, so a bad file changes nothing.
  std::vector<std::pair<const TensorSpec*, const data::TensorRecord*>> plan;
  for (const auto& spec : model.specs()) {
    const data::TensorRecord* rec = reader.find(file_name(spec.name));
    MW_CHECK_T(FormatError, rec, path, ": tensor '", file_name(spec.name),
               "' is missing; expected a GPT-2 checkpoint with n_layer ", model.config().n_layer,
               " and HF parameter names");
    MW_CHECK_T(FormatError, rec->shape == spec.shape, path, ": tensor '", rec->name, "' has shape ",
               shape_str(rec->shape), ", expected ", shape_str(spec.shape),
               " (does config.json match the weights?)");
    MW_CHECK_T(FormatError,
               rec->dtype == DType::F32 || rec->dtype == DType::F16 || rec->dtype == DType::BF16 ||
                   rec->dtype == DType::F64,
               path, ": tensor '", rec->name, "' has dtype ", dtype_name(rec->dtype),
               ", expected a floating type (F32, F16, BF16 or F64)");
    plan.emplace_back(&spec, rec);
  }
  if (const data::TensorRecord* head = reader.find("lm_head.weight")) {
    const data::TensorRecord& wte = reader.at(file_name("transformer.wte.weight"));
    MW_CHECK_T(FormatError, head->shape == wte.shape, path, ": lm_head.weight has shape ",
               shape_str(head->shape), " but the head must be tied to wte ", shape_str(wte.shape));
    MW_CHECK_T(FormatError, reader.read_as_f32(*head) == reader.read_as_f32(wte), path,
               ": lm_head.weight differs from transformer.wte.weight; memwall's GPT-2 ties them");
  }
  std::vector<Tensor> staged;
  for (auto [spec, rec] : plan) {
    Tensor raw = Tensor::empty(rec->shape, rec->dtype);
    reader.read(*rec, raw.raw_data());
    staged.push_back(raw);
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < plan.size(); ++i) {
    Tensor p = model.parameter(plan[i].first->name);
    Tensor converted = staged[i].to(p.dtype()).to(p.device());
    p.copy_(converted);
  }
}

void save_hf(const GPT2& model, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  MW_CHECK_T(IoError, !ec && fs::is_directory(dir), "--save '", dir,
             "' cannot be created: ", ec.message(), "; pass a writable directory");
  model.config().to_json_file((fs::path(dir) / "config.json").string());
  data::SafeTensorsWriter writer;
  std::vector<Tensor> keep;  // the writer borrows buffers until write()
  for (const auto& spec : model.specs()) {
    Tensor t = model.parameter(spec.name).to(Device::cpu()).contiguous().to(DType::F32);
    keep.push_back(t);
    writer.add(spec.name, DType::F32, spec.shape, t.raw_data());
  }
  writer.set_metadata("format", "pt");
  writer.write((fs::path(dir) / "model.safetensors").string());
}

}  // namespace mw::gpt2
