// SPDX-License-Identifier: Apache-2.0
// The kernel archive: zstd-compressed cubins with a directory and per-entry checksums.
//
// Layout (little-endian):
//   header   "FLYARC01" | u32 version (1) | u32 entry count | u64 directory offset
//            | u64 directory size | u64 FNV-1a-64 of the directory bytes
//   data     one zstd frame per distinct image (with zstd's own content checksum); entries whose
//            images are identical (launch-axis variants of one cubin) point at the same frame
//   directory, per entry: u16 len + name | u16 len + family | u16 len + params
//            | u64 offset | u64 compressed size | u64 raw size | u64 FNV-1a-64 of the raw image
// Everything is bounds-checked on read: a truncated or corrupt archive is an error, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fly {

uint64_t fnv1a64(const void* data, size_t n);

struct ArchiveEntry {
  std::string name, family, params;
  uint64_t offset = 0, compressed_size = 0, raw_size = 0, checksum = 0;
};

struct ArchiveInput {
  std::string name, family, params;
  std::vector<uint8_t> image;
};

// Builds an archive image (packer and tests). Throws std::runtime_error on failure.
std::vector<uint8_t> build_archive(const std::vector<ArchiveInput>& inputs, int zstd_level = 19);

class Archive {
 public:
  // Parses the header and directory of `data` (not copied: must outlive the Archive).
  // Returns false with a message in `err` when the archive is malformed.
  bool open(const uint8_t* data, size_t size, std::string* err);
  const std::vector<ArchiveEntry>& entries() const { return entries_; }
  // Decompresses entry i and verifies size and checksum. False with a message on corruption.
  bool extract(size_t i, std::vector<uint8_t>* out, std::string* err) const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::vector<ArchiveEntry> entries_;
};

}  // namespace fly
