// CPU Adam front-ends: ISA detection and dispatch (Note [Adam ISA dispatch]), argument checks,
// the scalar reference kernel, and the oneTBB parallel split. The math is Note [Adam math].
#include "optim/adam_cpu.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/cpu_features.h"
#include "core/error.h"
#include "optim/cpu/adam_kernels.h"

namespace mw::optim {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::AVX2: return "avx2";
    case Isa::AVX512: return "avx512";
  }
  return "?";
}

Isa parse_isa(std::string_view name) {
  if (name == "scalar") return Isa::Scalar;
  if (name == "avx2") return Isa::AVX2;
  if (name == "avx512") return Isa::AVX512;
  throw InvalidArgument(str("unknown Adam ISA '", name, "'; expected scalar, avx2 or avx512"));
}

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::AVX2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::AVX512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  }
  return false;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::Scalar, Isa::AVX2, Isa::AVX512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

Isa best_isa() {
  if (const char* env = std::getenv("MW_ADAM_ISA"); env != nullptr && env[0] != '\0') {
    Isa isa;
    try {
      isa = parse_isa(env);
    } catch (const InvalidArgument&) {
      throw InvalidArgument(
          str("MW_ADAM_ISA='", env,
              "' is not an Adam ISA; set it to scalar, avx2 or avx512, or unset it"));
    }
    MW_CHECK_T(InvalidArgument, isa_supported(isa), "MW_ADAM_ISA=", env,
               " but this CPU lacks that instruction set; unset MW_ADAM_ISA or choose one of the "
               "supported ones (scalar",
               isa_supported(Isa::AVX2) ? ", avx2" : "", ")");
    return isa;
  }
  if (isa_supported(Isa::AVX512)) return Isa::AVX512;
  if (isa_supported(Isa::AVX2)) return Isa::AVX2;
  return Isa::Scalar;
}

namespace detail {

namespace {

// The gradient dtype is a template parameter so the per-element loop has no dtype switch.
template <DType kGrad>
void adam_scalar_impl(const AdamStepScalars& s, float* param, const void* grad, float* exp_avg,
                      float* exp_avg_sq, int64_t numel) {
  for (int64_t i = 0; i < numel; ++i) {
    adam_element(s, load_grad_element(grad, kGrad, i), param[i], exp_avg[i], exp_avg_sq[i]);
  }
}

}  // namespace

void adam_kernel_scalar(const AdamStepScalars& s, float* param, const void* grad, DType grad_dtype,
                        float* exp_avg, float* exp_avg_sq, int64_t numel) {
  switch (grad_dtype) {
    case DType::F16:
      return adam_scalar_impl<DType::F16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    case DType::BF16:
      return adam_scalar_impl<DType::BF16>(s, param, grad, exp_avg, exp_avg_sq, numel);
    default: return adam_scalar_impl<DType::F32>(s, param, grad, exp_avg, exp_avg_sq, numel);
  }
}

}  // namespace detail

namespace {

using KernelFn = void (*)(const AdamStepScalars&, float*, const void*, DType, float*, float*,
                          int64_t);

// Checks the arguments once and returns the kernel of `isa`.
KernelFn checked_kernel(Isa isa, const float* param, const void* grad, DType grad_dtype,
                        const float* exp_avg, const float* exp_avg_sq, int64_t numel) {
  MW_CHECK_T(InvalidArgument, isa_supported(isa), "Adam ISA ", isa_name(isa),
             " is not supported by this CPU; use best_isa() or MW_ADAM_ISA=scalar");
  MW_CHECK_T(InvalidArgument,
             grad_dtype == DType::F32 || grad_dtype == DType::F16 || grad_dtype == DType::BF16,
             "Adam gradients must be f32, f16 or bf16; got ", dtype_name(grad_dtype),
             ". Cast the gradient first.");
  MW_CHECK_T(InvalidArgument, numel >= 0, "Adam numel must be >= 0; got ", numel);
  MW_CHECK_T(InvalidArgument,
             numel == 0 || (param != nullptr && grad != nullptr && exp_avg != nullptr &&
                            exp_avg_sq != nullptr),
             "Adam got a null param/grad/exp_avg/exp_avg_sq pointer for ", numel,
             " elements; allocate the optimizer states before the step");
  switch (isa) {
    case Isa::AVX2: return &detail::adam_kernel_avx2;
    case Isa::AVX512: return &detail::adam_kernel_avx512;
    case Isa::Scalar: break;
  }
  return &detail::adam_kernel_scalar;
}

}  // namespace

void adam_update(Isa isa, const AdamStepScalars& scalars, float* param, const void* grad,
                 DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel) {
  KernelFn kernel = checked_kernel(isa, param, grad, grad_dtype, exp_avg, exp_avg_sq, numel);
  kernel(scalars, param, grad, grad_dtype, exp_avg, exp_avg_sq, numel);
}

void adam_update(Isa isa, const AdamHyper& hyper, int64_t step, float div_scale, float* param,
                 const void* grad, DType grad_dtype, float* exp_avg, float* exp_avg_sq,
                 int64_t numel) {
  adam_update(isa, make_adam_step_scalars(hyper, step, div_scale), param, grad, grad_dtype, exp_avg,
              exp_avg_sq, numel);
}

bool all_finite(const float* x, int64_t n) {
  uint32_t bad = 0;  // an exponent of all ones: Inf or NaN (a branch-free loop vectorises)
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, sizeof u);
    bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

void adam_update_parallel(Isa isa, const AdamStepScalars& scalars, float* param, const void* grad,
                          DType grad_dtype, float* exp_avg, float* exp_avg_sq, int64_t numel,
                          std::atomic<bool>* non_finite) {
  KernelFn kernel = checked_kernel(isa, param, grad, grad_dtype, exp_avg, exp_avg_sq, numel);
  const int64_t grad_elem_bytes = dtype_size(grad_dtype);
  const int64_t num_tasks = (numel + kAdamGrainNumel - 1) / kAdamGrainNumel;
  // Elements are independent, so any split gives the serial result bit for bit.
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, num_tasks), [&](const tbb::blocked_range<int64_t>& r) {
        const int64_t begin = r.begin() * kAdamGrainNumel;
        const int64_t end = std::min(numel, r.end() * kAdamGrainNumel);
        kernel(scalars, param + begin, static_cast<const char*>(grad) + begin * grad_elem_bytes,
               grad_dtype, exp_avg + begin, exp_avg_sq + begin, end - begin);
        if (non_finite && !all_finite(param + begin, end - begin))
          non_finite->store(true, std::memory_order_relaxed);
      });
}

void adam_update_ranged(Isa isa, const AdamStepScalars& scalars, const NoDecayRanges& no_decay,
                        float* param, const void* grad, DType grad_dtype, float* exp_avg,
                        float* exp_avg_sq, int64_t numel, std::atomic<bool>* non_finite) {
  const int64_t esize = dtype_size(grad_dtype);
  for_each_decay_segment(
      no_decay, 0, numel, scalars, [&](int64_t lo, int64_t hi, const AdamStepScalars& s) {
        adam_update_parallel(isa, s, param + lo, static_cast<const char*>(grad) + lo * esize,
                             grad_dtype, exp_avg + lo, exp_avg_sq + lo, hi - lo, non_finite);
      });
}

void adam_update_parallel(Isa isa, const AdamHyper& hyper, int64_t step, float div_scale,
                          float* param, const void* grad, DType grad_dtype, float* exp_avg,
                          float* exp_avg_sq, int64_t numel) {
  adam_update_parallel(isa, make_adam_step_scalars(hyper, step, div_scale), param, grad, grad_dtype,
                       exp_avg, exp_avg_sq, numel);
}

}  // namespace mw::optim
