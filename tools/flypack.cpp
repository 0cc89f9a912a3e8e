// SPDX-License-Identifier: Apache-2.0
// flypack: packs the cubins listed in a flygen manifest into one zstd kernel archive.
//   flypack --manifest gen/manifest.tsv --cubins DIR --out kernels.flyar
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "archive.hpp"

int main(int argc, char** argv) try {
  const char* usage = "usage: flypack --manifest FILE --cubins DIR --out FILE\n"
                      "Packs the cubins the manifest names into one zstd-compressed archive (build step).\n";
  std::string manifest, cubins, out;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") { std::printf("%s", usage); return 0; }
    std::string* slot = a == "--manifest" ? &manifest : a == "--cubins" ? &cubins : a == "--out" ? &out : nullptr;
    if (!slot || i + 1 >= argc) {
      std::fprintf(stderr, "flypack: %s %s\n%s", slot ? "no value after" : "unknown argument", a.c_str(), usage);
      return 2;
    }
    *slot = argv[++i];
  }
  if (manifest.empty() || cubins.empty() || out.empty()) { std::fprintf(stderr, "%s", usage); return 2; }
  std::ifstream mf(manifest);
  if (!mf) throw std::runtime_error("cannot read " + manifest);
  std::vector<fly::ArchiveInput> inputs;
  size_t raw = 0;
  for (std::string line; std::getline(mf, line);) {
    if (line.empty()) continue;
    std::stringstream ss(line);
    fly::ArchiveInput in;
    std::string source, image;
    std::getline(ss, in.name, '\t');
    std::getline(ss, in.family, '\t');
    std::getline(ss, source, '\t');
    std::getline(ss, image, '\t');
    std::getline(ss, in.params, '\t');
    if (image.empty()) throw std::runtime_error("manifest line without an image: " + line);
    std::string path = cubins + "/" + image + ".cubin";
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("missing cubin " + path);
    in.image.assign(std::istreambuf_iterator<char>(f), {});
    if (in.image.empty()) throw std::runtime_error("empty cubin " + path);
    raw += in.image.size();
    inputs.push_back(std::move(in));
  }
  std::vector<uint8_t> ar = fly::build_archive(inputs);
  std::ofstream o(out, std::ios::binary);
  o.write(reinterpret_cast<const char*>(ar.data()), std::streamsize(ar.size()));
  if (!o) throw std::runtime_error("cannot write " + out);
  std::printf("flypack: %zu variants, %zu KiB of images -> %zu KiB archive (identical images stored once)\n", inputs.size(),
              raw / 1024, ar.size() / 1024);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "flypack: error: %s\n", e.what());
  return 1;
}
