// SPDX-License-Identifier: Apache-2.0
// The wgmma MX GEMM's source (kernels/mx/mxfp_wgmma.cu, BN = 128, fold = 0) run on host threads against
// the FP64 reference: harness in mx_wgmma_emu.hpp, cases in mx_wgmma_emu_cases.hpp.
#include "mx_wgmma_emu.hpp"
#define FLY_BN 128
#define FLY_FOLD 0
#define fly_mxw_emu_and128 fly_mxw_emu_and128_n128
#define mxfp_wgmma mxfp_wgmma_emu_n128
#define fly_mxw_emu_smem fly_mxw_emu_smem_n128
#include "mx/mxfp_wgmma.cu"
uint8_t* fly_mxw_emu_smem() { return emu::smem_base; }
bool fly_mxw_emu_and128(bool v) {
  const bool r = emu::producer_and->reduce(v);
  if (r && emu::thread_idx.x == 0) {
    std::lock_guard<std::mutex> l(emu::mu);
    ++emu::folded_stages;
  }
  return r;
}
#include "mx_wgmma_emu_cases.hpp"
