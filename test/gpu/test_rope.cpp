// SPDX-License-Identifier: Apache-2.0
// Rotary embeddings on the GPU against an FP64 reference: every dtype, forward and backward, q and
// k together and q alone, Hugging Face's transposed layout and a contiguous one, GQA, partial
// rotary, tables of width R and R/2, one table for every batch, misaligned rows (the scalar path),
// in place, outputs poisoned (every element outside the views must stay untouched), NaN and
// infinity propagation as the unfused composition.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "catch_compat.hpp"
#include "host_elems.hpp"
#include "flykernels/flykernels.h"
#include "flykernels/flykernels.hpp"

namespace {

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)

using fly_test::esize;
using fly_test::load;
using fly_test::store;
bool is_nan_bits(const std::vector<uint8_t>& h, size_t i, fly_dtype dt) { return std::isnan(load(h, i, dt)); }

struct Case {
  fly_dtype dt = FLY_BF16;
  bool bwd = false;
  int64_t B = 2, Hq = 4, Hk = 2, S = 33, D = 128;  // Hk 0: q alone
  int rot = 0;                                      // 0: D
  bool half_tables = false;                         // tables of width R/2
  bool one_table = false;                           // tables [1, S, W] for every batch
  bool hf_layout = true;                            // [B, S, H, D] buffers seen as [B, H, S, D]
  int64_t off = 0;                                  // element offset of every buffer's first element
  bool in_place = false;
  bool specials = false;                            // NaN and infinity in q
};

// One [B, H, S, D] operand in a buffer of its own (NaN-filled outside the view when an output).
struct Op {
  std::vector<uint8_t> h;
  void* d = nullptr;
  int64_t H = 0;
  int64_t sb = 0, sh = 0, ss = 0;
  size_t idx(int64_t off, int64_t b, int64_t hh, int64_t s, int64_t c) const {
    return size_t(off + b * sb + hh * sh + s * ss + c);
  }
};

void run_case(const Case& c) {
  const size_t es = esize(c.dt);
  const int R = c.rot ? c.rot : int(c.D);
  const int half = R / 2;
  const int64_t W = c.half_tables ? half : R;
  const int64_t TB = c.one_table ? 1 : c.B;
  std::mt19937 rng(uint32_t(c.B * 131 + c.Hq * 17 + c.S * 7 + c.D + R + c.dt + c.bwd + c.off * 3));
  std::uniform_real_distribution<float> uni(-3.f, 3.f);
  auto make_op = [&](int64_t H, bool input) {
    Op o;
    o.H = H;
    if (c.hf_layout) o.sb = c.S * H * c.D, o.ss = H * c.D, o.sh = c.D;
    else o.sb = H * c.S * c.D, o.sh = c.S * c.D, o.ss = c.D;
    const size_t n = size_t(c.off + c.B * H * c.S * c.D + 16);  // 16 elements of slack past the view
    o.h.resize(n * es);
    for (size_t i = 0; i < n; ++i) store(o.h, i, c.dt, input ? uni(rng) : NAN);
    CUDA_OK(cudaMalloc(&o.d, o.h.size()));
    CUDA_OK(cudaMemcpy(o.d, o.h.data(), o.h.size(), cudaMemcpyHostToDevice));
    return o;
  };
  auto desc = [&](const Op& o) {
    return flykernels::tensor(static_cast<char*>(o.d) + c.off * es, c.dt, {c.B, o.H, c.S, c.D}, {o.sb, o.sh, o.ss, 1});
  };
  // Tables of real angles: theta = s * base^(-2i/R), as Hugging Face builds them.
  std::vector<uint8_t> hc(size_t(c.off + TB * c.S * W) * es), hs(hc.size());
  for (int64_t b = 0; b < TB; ++b)
    for (int64_t s = 0; s < c.S; ++s)
      for (int64_t j = 0; j < W; ++j) {
        const double th = double(s + 3 * b) * std::pow(10000.0, -2.0 * double(j % half) / R);
        const size_t i = size_t(c.off + (b * c.S + s) * W + j);
        store(hc, i, c.dt, float(std::cos(th)));
        store(hs, i, c.dt, float(std::sin(th)));
      }
  void *dc = nullptr, *ds = nullptr;
  CUDA_OK(cudaMalloc(&dc, hc.size()));
  CUDA_OK(cudaMalloc(&ds, hs.size()));
  CUDA_OK(cudaMemcpy(dc, hc.data(), hc.size(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(ds, hs.data(), hs.size(), cudaMemcpyHostToDevice));
  const fly_tensor tc = flykernels::tensor(static_cast<char*>(dc) + c.off * es, c.dt, {TB, c.S, W}, {c.S * W, W, 1});
  const fly_tensor ts = flykernels::tensor(static_cast<char*>(ds) + c.off * es, c.dt, {TB, c.S, W}, {c.S * W, W, 1});

  Op q = make_op(c.Hq, true), k = c.Hk ? make_op(c.Hk, true) : Op{};
  if (c.specials) {
    store(q.h, q.idx(c.off, 0, 0, 0, 1), c.dt, NAN);
    store(q.h, q.idx(c.off, 0, 0, 1, half + 2), c.dt, INFINITY);
    store(q.h, q.idx(c.off, 0, 0, 0, half + 3), c.dt, INFINITY);  // at s = 0: sin 0, so inf * 0 = NaN
    CUDA_OK(cudaMemcpy(q.d, q.h.data(), q.h.size(), cudaMemcpyHostToDevice));
  }
  const std::vector<uint8_t> q_in = q.h, k_in = k.h;
  Op qo = c.in_place ? q : make_op(c.Hq, false), ko = c.in_place || !c.Hk ? k : make_op(c.Hk, false);
  const fly_tensor tq = desc(q), tqo = desc(qo);
  fly_tensor tk{}, tko{};
  if (c.Hk) tk = desc(k), tko = desc(ko);
  const fly_status st = c.bwd ? fly_rope_bwd(&tq, c.Hk ? &tk : nullptr, &tc, &ts, R, &tqo, c.Hk ? &tko : nullptr, nullptr)
                              : fly_rope_fwd(&tq, c.Hk ? &tk : nullptr, &tc, &ts, R, &tqo, c.Hk ? &tko : nullptr, nullptr);
  INFO("dtype " << c.dt << (c.bwd ? " bwd" : " fwd") << " B " << c.B << " Hq " << c.Hq << " Hk " << c.Hk << " S "
                << c.S << " D " << c.D << " R " << R << (c.half_tables ? " half tables" : "")
                << (c.one_table ? " one table" : "") << (c.hf_layout ? " hf layout" : " bhsd") << " off " << c.off
                << (c.in_place ? " in place" : "") << " variant " << fly_last_variant() << " msg "
                << fly_get_last_error());
  REQUIRE(st == FLY_SUCCESS);
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> hq(qo.h.size()), hk(ko.h.size());
  CUDA_OK(cudaMemcpy(hq.data(), qo.d, hq.size(), cudaMemcpyDeviceToHost));
  if (c.Hk) CUDA_OK(cudaMemcpy(hk.data(), ko.d, hk.size(), cudaMemcpyDeviceToHost));
  const double rel = c.dt == FLY_BF16 ? 1.0 / 128 : c.dt == FLY_F16 ? 1.0 / 1024 : 4e-7;
  int64_t bad = 0, checked = 0;
  auto check_op = [&](const Op& o, const std::vector<uint8_t>& in, const std::vector<uint8_t>& got) {
    std::vector<char> inside(got.size() / es, 0);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t hh = 0; hh < o.H; ++hh)
        for (int64_t s = 0; s < c.S; ++s)
          for (int64_t j = 0; j < c.D; ++j) {
            const size_t i = o.idx(c.off, b, hh, s, j);
            inside[i] = 1;
            const double x = load(in, i, c.dt);
            double want, mag;
            if (j >= R) {
              want = x, mag = std::fabs(x);
            } else {
              const bool lo = j < half;
              const int64_t jp = lo ? j + half : j - half;  // the partner column
              const double xp = load(in, o.idx(c.off, b, hh, s, jp), c.dt);
              const int64_t tb = c.one_table ? 0 : b;
              auto tab = [&](const std::vector<uint8_t>& t, int64_t col) {
                return load(t, size_t(c.off + (tb * c.S + s) * W + (c.half_tables ? col % half : col)), c.dt);
              };
              const double cj = tab(hc, j);
              if (!c.bwd) {  // out[j] = x[j] cos[j] -+ x[partner] sin[j]
                want = x * cj + (lo ? -xp : xp) * tab(hs, j);
                mag = std::fabs(x * cj) + std::fabs(xp * tab(hs, j));
              } else {       // dx[j] = dy[j] cos[j] +- dy[partner] sin[partner]
                want = x * cj + (lo ? xp : -xp) * tab(hs, jp);
                mag = std::fabs(x * cj) + std::fabs(xp * tab(hs, jp));
              }
            }
            const double v = load(got, i, c.dt);
            ++checked;
            const bool ok = std::isnan(want) ? std::isnan(v)
                            : std::isinf(want) ? v == want
                                               : std::fabs(v - want) <= rel * mag + 1e-30;
            if (!ok && bad++ < 6)
              UNSCOPED_INFO("b " << b << " h " << hh << " s " << s << " col " << j << " got " << v << " want " << want);
          }
    if (!c.in_place)  // nothing outside the view written
      for (size_t i = 0; i < inside.size(); ++i)
        if (!inside[i] && !is_nan_bits(got, i, c.dt) && bad++ < 6) UNSCOPED_INFO("element " << i << " outside written");
  };
  check_op(qo, q_in, hq);
  if (c.Hk) check_op(ko, k_in, hk);
  CHECK(checked > 0);
  CHECK(bad == 0);
  for (void* p : {q.d, k.d, dc, ds}) cudaFree(p);
  if (!c.in_place) {
    cudaFree(qo.d);
    if (c.Hk) cudaFree(ko.d);
  }
}

}  // namespace

TEST_CASE("rope forward and backward against FP64: dtypes, layouts, GQA, partial rotary, tables", "[rope][gpu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F16, FLY_F32})
    for (bool bwd : {false, true}) {
      Case c;
      c.dt = dt, c.bwd = bwd;
      run_case(c);                                           // Llama: [B, S, H, D] transposed, GQA
      Case q_only = c;
      q_only.Hk = 0, q_only.hf_layout = false;
      run_case(q_only);
      Case partial = c;
      partial.rot = 64, partial.D = 128;                      // columns [64, 128) pass through
      run_case(partial);
      Case halves = c;
      halves.half_tables = true, halves.one_table = true;     // gpt-oss: an angle per pair
      run_case(halves);
      Case odd = c;
      odd.D = 72, odd.rot = 72, odd.off = 1, odd.S = 5;       // misaligned: the element path
      run_case(odd);
      Case wide = c;
      wide.D = 256, wide.B = 1, wide.Hq = 8, wide.Hk = 1, wide.S = 300;  // Gemma's head dim
      run_case(wide);
    }
}

TEST_CASE("rope in place, decode, and NaN / infinity as the composition", "[rope][gpu]") {
  for (fly_dtype dt : {FLY_BF16, FLY_F32}) {
    Case ip;
    ip.dt = dt, ip.in_place = true;
    run_case(ip);
    Case decode;
    decode.dt = dt, decode.S = 1, decode.B = 64, decode.Hq = 32, decode.Hk = 8;
    run_case(decode);
    Case sp;
    sp.dt = dt, sp.specials = true;
    run_case(sp);
    sp.bwd = true;
    run_case(sp);
  }
}
