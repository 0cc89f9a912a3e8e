// SPDX-License-Identifier: Apache-2.0
// The wgmma MX GEMM's split-K source (kernels/mx/mxfp_wgmma.cu, BN = 64, fold = 0, FLY_PIPE = 2,
// FLY_SPLIT: the `_p2_s{2,4,8}` variants, whose kernel code is one: the split count is the launch's
// `splits`) and the module's mxfp_splitk_reduce, run on host threads against the FP64 reference:
// harness in mx_wgmma_emu.hpp, cases in mx_wgmma_emu_cases.hpp.
#include "mx_wgmma_emu.hpp"
#define FLY_BN 64
#define FLY_FOLD 0
#define FLY_PIPE 2
#define FLY_SPLIT 4
#define fly_mxw_emu_and128 fly_mxw_emu_and128_n64s
#define mxfp_wgmma mxfp_wgmma_emu_n64s
#define mxfp_splitk_reduce mxfp_splitk_reduce_emu_n64s
#define fly_mxw_emu_smem fly_mxw_emu_smem_n64s
#include "mx/mxfp_wgmma.cu"
uint8_t* fly_mxw_emu_smem() { return emu::smem_base; }
bool fly_mxw_emu_and128(bool v) { return emu::producer_and->reduce(v); }
#include "mx_wgmma_emu_cases.hpp"
