// SPDX-License-Identifier: Apache-2.0
// flyinfo: what this build of libflykernels bundles, and what the current machine offers.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "flykernels/flykernels.h"

int main(int argc, char** argv) {
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--verbose" || a == "-v") {
      verbose = true;
    } else if (a == "--version") {
      std::printf("flyinfo %s\n", fly_version_string());
      return 0;
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: flyinfo [--verbose] [--version]\n"
                  "Prints the library version, the kernel variants bundled in it (per family; --verbose\n"
                  "lists each with its parameters), the device it would run on, and the environment\n"
                  "variables it reads (FLYKERNELS_LOG, FLYKERNELS_TUNING_DB, ...). --version prints the\n"
                  "library version alone. Exit status: 0 (also without a GPU: the device line says why),\n"
                  "2 a usage error.\n");
      return 0;
    } else {
      std::fprintf(stderr, "flyinfo: unknown option '%s' (try flyinfo --help)\n", a.c_str());
      return 2;
    }
  }
  std::printf("libflykernels %s\n", fly_version_string());
  std::map<std::string, std::vector<std::string>> by_family;
  for (int i = 0; i < fly_variant_count(); ++i) {
    const char* fam = "?";
    const char* params = "";
    fly_variant_info(fly_variant_name(i), &fam, &params);
    by_family[fam].push_back(std::string(fly_variant_name(i)) + (verbose ? std::string("  [") + params + "]" : ""));
  }
  std::printf("bundled kernel variants: %d (sm_90a cubins, zstd-compressed, loaded on first use)\n",
              fly_variant_count());
  // Columns sized to the longest family name ("grouped_gemm", "attention_bwd", ...) and count.
  int name_w = 0, count_w = 0;
  for (auto& [fam, names] : by_family) {
    name_w = std::max(name_w, int(fam.size()));
    count_w = std::max(count_w, int(std::to_string(names.size()).size()));
  }
  for (auto& [fam, names] : by_family) {
    std::printf("  %-*s  %*zu variants\n", name_w, fam.c_str(), count_w, names.size());
    if (verbose)
      for (auto& n : names) std::printf("      %s\n", n.c_str());
  }
  const char* arch = nullptr;
  fly_status s = fly_device_arch(nullptr, &arch);
  if (s == FLY_SUCCESS) std::printf("device: %s (kernels available)\n", arch);
  else std::printf("device: none usable: %s: %s\n", fly_status_string(s), fly_get_last_error());
  const char* env[] = {"FLYKERNELS_LOG", "FLYKERNELS_TUNING_DB", "FLYKERNELS_CHECK_POINTERS", "FLYKERNELS_LIBCUDA"};
  for (const char* e : env) std::printf("%-26s %s\n", e, std::getenv(e) ? std::getenv(e) : "(unset)");
  if (!verbose) std::printf("(flyinfo --verbose lists every variant with its parameters)\n");
  return 0;
}
