// SPDX-License-Identifier: Apache-2.0
// The wgmma MX GEMM's split-K source at BN = 128 (kernels/mx/mxfp_wgmma.cu, fold = 0, FLY_PIPE = 2,
// FLY_SPLIT: the `n128_f0_p2_s{2,4,8}` variants) and mxfp_splitk_reduce on host threads against
// the FP64 reference, the short case list (MXW_SPLIT_SHORT; BN 64 runs the full one):
// harness in mx_wgmma_emu.hpp, cases in mx_wgmma_emu_cases.hpp.
#include "mx_wgmma_emu.hpp"
#define FLY_BN 128
#define FLY_FOLD 0
#define FLY_PIPE 2
#define FLY_SPLIT 4
#define MXW_SPLIT_SHORT 1
#define fly_mxw_emu_and128 fly_mxw_emu_and128_n128s
#define mxfp_wgmma mxfp_wgmma_emu_n128s
#define mxfp_splitk_reduce mxfp_splitk_reduce_emu_n128s
#define fly_mxw_emu_smem fly_mxw_emu_smem_n128s
#include "mx/mxfp_wgmma.cu"
uint8_t* fly_mxw_emu_smem() { return emu::smem_base; }
bool fly_mxw_emu_and128(bool v) { return emu::producer_and->reduce(v); }
#include "mx_wgmma_emu_cases.hpp"
