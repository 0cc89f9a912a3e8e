// SPDX-License-Identifier: Apache-2.0
// The flykernels._C extension module: boxed overrides of aten ops (the table in overrides.hpp, one
// file per family) and Inductor GEMM entry points, each calling libflykernels only through its C ABI
// (include/flykernels/flykernels.h). Every override checks eligibility first and otherwise calls
// the kernel that was registered before it (captured at registration), so what we do not cover
// behaves exactly as stock.
#include <torch/extension.h>

#include <c10/core/DeviceGuard.h>

#include "common.hpp"
#include "decisions.hpp"
#include "families.hpp"
#include "overrides.hpp"

namespace {

using flyk::DecisionKey;

// A decision key as Python sees it: (op, dtype, layout, k0, k1, k2, k3), or None.
py::object key_tuple(const std::optional<DecisionKey>& key) {
  if (!key.has_value()) return py::none();
  return py::make_tuple(key->op, key->dtype, key->layout, key->k[0], key->k[1], key->k[2], key->k[3]);
}

py::dict counts() {
  py::dict d;
  for (int i = 0; i < flyk::kOpCount; ++i) {
    const auto op = static_cast<flyk::OpId>(i);
    d[flyk::kOpNames[i]] = py::make_tuple(flyk::count_ours(op), flyk::count_stock(op));
  }
  return d;
}

py::dict library_info() {
  py::dict d;
  d["version"] = std::string(fly_version_string());
  const int n = fly_variant_count();
  d["variant_count"] = n;
  py::dict families;
  for (int i = 0; i < n; ++i) {
    const char* fam = nullptr;
    const char* params = nullptr;
    const char* name = fly_variant_name(i);
    if (name && fly_variant_info(name, &fam, &params) == FLY_SUCCESS && fam) {
      py::str key(fam);
      families[key] = families.contains(key) ? py::int_(families[key].cast<int>() + 1) : py::int_(1);
    }
  }
  d["families"] = families;
  return d;
}

// (ok, arch-or-reason) for CUDA device `index`, or for "no device" when index < 0.
py::tuple device_status(int64_t index) {
  const char* arch = nullptr;
  fly_status st;
  if (index < 0) {
    st = fly_device_arch(nullptr, &arch);
  } else {
    c10::Device dev(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
    c10::DeviceGuard guard(dev);
    st = fly_device_arch(flyk::current_stream(dev), &arch);
  }
  if (st == FLY_SUCCESS) return py::make_tuple(true, std::string(arch ? arch : ""));
  return py::make_tuple(false, std::string(fly_status_string(st)) + ": " + fly_get_last_error());
}

std::string names_of_overrides() {
  std::string names;
  for (const auto& n : flyk::override_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "FlyKernels' PyTorch extension (calls libflykernels through its C ABI only)";
  static const std::string enable_doc = "install the override named op (" + names_of_overrides() + ")";
  m.def("enable_op", &flyk::enable_op, enable_doc.c_str());
  m.def("disable_op", &flyk::disable_op, "remove the override named op; the stock kernel is current again");
  m.def("op_enabled", &flyk::op_enabled);
  m.def("override_names", &flyk::override_names, "the names enable_op takes (the override table's rows)");
  m.def("explain_rms_norm", &flyk::explain_rms_norm, py::arg("x"), py::arg("normalized_shape"), py::arg("weight"),
        py::arg("eps"), py::arg("check_device") = true, "'' when our RMSNorm takes the call, else why not");
  m.def("explain_topk", &flyk::explain_topk, py::arg("x"), py::arg("k"), py::arg("dim") = -1,
        py::arg("check_device") = true, "'' when our TopK takes the call, else why not");
  m.def("explain_sdpa", &flyk::explain_sdpa, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dropout_p") = 0.0,
        py::arg("check_device") = true);
  m.def("explain_grouped_mm", &flyk::explain_grouped_mm, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("bias"),
        py::arg("check_device") = true);
  m.def("explain_scaled_mm", &flyk::explain_scaled_mm, py::arg("a"), py::arg("b"), py::arg("scale_a"),
        py::arg("scale_b"), py::arg("swizzle") = 0, py::arg("bias") = py::none(), py::arg("out_dtype") = py::none(),
        py::arg("check_device") = true);
  // Decision keys (decisions.hpp): the key the override builds for such a call, or None where the
  // call is not ours to take (the same eligibility and key functions as the override).
  m.def(
      "key_rms_norm",
      [](const at::Tensor& x, std::vector<int64_t> normalized_shape, std::optional<at::Tensor> weight,
         std::optional<double> eps, bool check_device) {
        return key_tuple(flyk::key_rms_norm(x, std::move(normalized_shape), std::move(weight), eps, check_device));
      },
      py::arg("x"), py::arg("normalized_shape"), py::arg("weight") = py::none(), py::arg("eps") = py::none(),
      py::arg("check_device") = true);
  m.def(
      "key_topk",
      [](const at::Tensor& x, int64_t k, int64_t dim, bool largest, bool check_device) {
        return key_tuple(flyk::key_topk(x, k, dim, largest, check_device));
      },
      py::arg("x"), py::arg("k"), py::arg("dim") = -1, py::arg("largest") = true, py::arg("check_device") = true);
  m.def(
      "key_sdpa",
      [](const std::string& op, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool is_causal,
         bool check_device) { return key_tuple(flyk::key_sdpa(op, q, k, v, is_causal, check_device)); },
      py::arg("op"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("is_causal") = false,
      py::arg("check_device") = true);
  m.def(
      "key_grouped_mm",
      [](const at::Tensor& a, const at::Tensor& b, std::optional<at::Tensor> offs, bool check_device) {
        return key_tuple(flyk::key_grouped_mm(a, b, std::move(offs), check_device));
      },
      py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("check_device") = true);
  m.def("mx_quantize", &flyk::mx_quantize, py::arg("x"), py::arg("format") = "e4m3", py::arg("rceil") = false,
        "(q, scales) of x [M, K]: float8_e4m3fn [M, K] or float4_e2m1fn_x2 [M, K/2], float8_e8m0fnu [M, K/32]");
  m.def("mx_linear_run", &flyk::mx_linear_run, py::arg("a"), py::arg("scale_a"), py::arg("wq"), py::arg("scales"),
        py::arg("format"), py::arg("bias") = py::none(), py::arg("out_dtype") = py::none(),
        "MXLinear's GEMM: fly_scaled_gemm on a [M, K] (bf16/fp16, scale_a None: weight-only; or MX codes with "
        "their E8M0 scales) and the layer's uint8 qweight / scales of `format` ('mxfp8' | 'mxfp4'); None when "
        "the library declines the call");
  m.def("mm_out", &flyk::mm_out, py::arg("a"), py::arg("b"), py::arg("out"), py::arg("workspace") = py::none());
  m.def("addmm_out", &flyk::addmm_out, py::arg("bias"), py::arg("a"), py::arg("b"), py::arg("out"),
        py::arg("beta") = 1.0, py::arg("alpha") = 1.0, py::arg("workspace") = py::none());
  m.def("grouped_mm_out", &flyk::grouped_mm_out, py::arg("a"), py::arg("b"), py::arg("offs"), py::arg("out"));
  m.def("gemm_workspace_size", &flyk::gemm_workspace_size, py::arg("a"), py::arg("b"), py::arg("out"));
  m.def(
      "row_view",
      [](const at::Tensor& t) -> py::object {
        int64_t M = 0, ld = 0;
        if (!flyk::row_view(t, &M, &ld)) return py::none();
        return py::make_tuple(M, ld);
      },
      "(rows, row stride) the row-wise ops (glu, add_rms_norm) hand the library for t, or None when "
      "t's leading dimensions do not collapse into rows of one stride (they copy it then)");
  m.def("counts", &counts, "{op: (ours, stock)} dispatch counts since the last reset");
  m.def("reset_counts", &flyk::reset_counts);
  m.def("set_log", &flyk::set_log, "print each fallback reason once (FLYKERNELS_LOG=info)");
  m.def("library_info", &library_info);
  m.def("device_status", &device_status);
  flyk::register_decision_bindings(m);
}
