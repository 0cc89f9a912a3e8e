// SPDX-License-Identifier: Apache-2.0
#include "archive.hpp"

#include <zstd.h>

#include <cstring>
#include <map>
#include <stdexcept>

namespace fly {

namespace {
constexpr char kMagic[8] = {'F', 'L', 'Y', 'A', 'R', 'C', '0', '1'};
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8 + 8 + 8;

void put_u16(std::vector<uint8_t>& b, uint16_t v) { for (int i = 0; i < 2; ++i) b.push_back(uint8_t(v >> (8 * i))); }
void put_u32(std::vector<uint8_t>& b, uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back(uint8_t(v >> (8 * i))); }
void put_u64(std::vector<uint8_t>& b, uint64_t v) { for (int i = 0; i < 8; ++i) b.push_back(uint8_t(v >> (8 * i))); }
void put_str(std::vector<uint8_t>& b, const std::string& s) {
  if (s.size() > 0xffff) throw std::runtime_error("archive: string too long: " + s.substr(0, 40));
  put_u16(b, uint16_t(s.size()));
  b.insert(b.end(), s.begin(), s.end());
}

// Bounds-checked little-endian reader.
struct Reader {
  const uint8_t* p;
  size_t n, pos = 0;
  bool ok = true;
  uint64_t get(int bytes) {
    if (!ok || n - pos < size_t(bytes)) { ok = false; return 0; }
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= uint64_t(p[pos + i]) << (8 * i);
    pos += bytes;
    return v;
  }
  std::string str() {
    size_t len = size_t(get(2));
    if (!ok || n - pos < len) { ok = false; return {}; }
    std::string s(reinterpret_cast<const char*>(p + pos), len);
    pos += len;
    return s;
  }
};
}  // namespace

uint64_t fnv1a64(const void* data, size_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) { h ^= p[i]; h *= 0x100000001b3ull; }
  return h;
}

std::vector<uint8_t> build_archive(const std::vector<ArchiveInput>& inputs, int level) {
  std::vector<uint8_t> out(kHeaderSize, 0);
  std::vector<uint8_t> dir;
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  if (!cctx) throw std::runtime_error("archive: ZSTD_createCCtx failed");
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  // Identical images (variants that differ only in launch parameters) share one payload.
  struct Stored { uint64_t offset, compressed; const std::vector<uint8_t>* image; };
  std::map<std::pair<uint64_t, size_t>, std::vector<Stored>> stored;
  for (auto& in : inputs) {
    const uint64_t sum = fnv1a64(in.image.data(), in.image.size());
    std::vector<Stored>& twins = stored[{sum, in.image.size()}];
    const Stored* same = nullptr;
    for (auto& st : twins)
      if (*st.image == in.image) same = &st;
    if (!same) {  // a new image: compress it and append its frame
      std::vector<uint8_t> buf(ZSTD_compressBound(in.image.size()));
      size_t c = ZSTD_compress2(cctx, buf.data(), buf.size(), in.image.data(), in.image.size());
      if (ZSTD_isError(c)) {
        ZSTD_freeCCtx(cctx);
        throw std::runtime_error("archive: zstd: " + std::string(ZSTD_getErrorName(c)));
      }
      twins.push_back({out.size(), c, &in.image});
      same = &twins.back();
      out.insert(out.end(), buf.begin(), buf.begin() + c);
    }
    put_str(dir, in.name);
    put_str(dir, in.family);
    put_str(dir, in.params);
    put_u64(dir, same->offset);
    put_u64(dir, same->compressed);
    put_u64(dir, in.image.size());
    put_u64(dir, sum);
  }
  ZSTD_freeCCtx(cctx);
  uint64_t dir_off = out.size();
  out.insert(out.end(), dir.begin(), dir.end());
  std::vector<uint8_t> hdr;
  hdr.insert(hdr.end(), kMagic, kMagic + 8);
  put_u32(hdr, 1);
  put_u32(hdr, uint32_t(inputs.size()));
  put_u64(hdr, dir_off);
  put_u64(hdr, dir.size());
  put_u64(hdr, fnv1a64(dir.data(), dir.size()));
  std::memcpy(out.data(), hdr.data(), kHeaderSize);
  return out;
}

bool Archive::open(const uint8_t* data, size_t size, std::string* err) {
  entries_.clear();
  data_ = data;
  size_ = size;
  if (!data || size < kHeaderSize || std::memcmp(data, kMagic, 8) != 0) {
    *err = "kernel archive: bad magic or truncated header (" + std::to_string(size) + " bytes)";
    return false;
  }
  Reader h{data + 8, kHeaderSize - 8};
  uint32_t version = uint32_t(h.get(4));
  uint32_t count = uint32_t(h.get(4));
  uint64_t dir_off = h.get(8), dir_size = h.get(8), dir_sum = h.get(8);
  if (version != 1) { *err = "kernel archive: unsupported version " + std::to_string(version); return false; }
  if (dir_off > size || dir_size > size - dir_off) { *err = "kernel archive: directory out of bounds"; return false; }
  if (fnv1a64(data + dir_off, dir_size) != dir_sum) { *err = "kernel archive: directory checksum mismatch"; return false; }
  Reader r{data + dir_off, size_t(dir_size)};
  for (uint32_t i = 0; i < count; ++i) {
    ArchiveEntry e;
    e.name = r.str();
    e.family = r.str();
    e.params = r.str();
    e.offset = r.get(8);
    e.compressed_size = r.get(8);
    e.raw_size = r.get(8);
    e.checksum = r.get(8);
    if (!r.ok) { *err = "kernel archive: truncated directory"; entries_.clear(); return false; }
    if (e.offset > dir_off || e.compressed_size > dir_off - e.offset) {
      *err = "kernel archive: entry " + e.name + " out of bounds";
      entries_.clear();
      return false;
    }
    entries_.push_back(std::move(e));
  }
  return true;
}

bool Archive::extract(size_t i, std::vector<uint8_t>* out, std::string* err) const {
  if (i >= entries_.size()) { *err = "kernel archive: no entry " + std::to_string(i); return false; }
  const ArchiveEntry& e = entries_[i];
  if (e.raw_size > (uint64_t(1) << 32)) { *err = "kernel archive: entry " + e.name + " implausibly large"; return false; }
  out->assign(size_t(e.raw_size), 0);
  size_t got = ZSTD_decompress(out->data(), out->size(), data_ + e.offset, size_t(e.compressed_size));
  if (ZSTD_isError(got) || got != e.raw_size) {
    *err = "kernel archive: entry " + e.name + " is corrupt (" +
           (ZSTD_isError(got) ? std::string(ZSTD_getErrorName(got)) : std::string("size mismatch")) + ")";
    return false;
  }
  if (fnv1a64(out->data(), out->size()) != e.checksum) {
    *err = "kernel archive: entry " + e.name + " checksum mismatch";
    return false;
  }
  return true;
}

}  // namespace fly
