// SPDX-License-Identifier: Apache-2.0
// The extension is compiled as this one translation unit. Each file below parses torch's headers
// again (20-55 s apiece on one core); as one unit the package compiles in about a quarter of the
// CPU time, which is most of the Python side's build in CI. The files stay separate for reading
// and review, so their file-local (anonymous-namespace) names must not collide.
#include "common.cpp"
#include "rmsnorm.cpp"
#include "topk.cpp"
#include "attention.cpp"
#include "grouped_mm.cpp"
#include "scaled_mm.cpp"
#include "mx_linear.cpp"
#include "gemm.cpp"
#include "glu.cpp"
#include "rope.cpp"
#include "add_rmsnorm.cpp"
#include "moe_route.cpp"
#include "cross_entropy.cpp"
#include "decisions.cpp"
#include "module.cpp"
