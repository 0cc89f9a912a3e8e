// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry over the C ABI (clang -fsanitize=fuzzer; .ci/sanitize.sh runs it when clang++ exists).
#include <cstddef>
#include <cstdint>

int fly_fuzz_one(const uint8_t* data, size_t size);

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) { return fly_fuzz_one(data, size); }
