// 16-bit floats next to fp32 (AVX2 + F16C): bf16 (the top half of an fp32: widening is a
// 16-bit shift) and IEEE fp16 (F16C's vcvtph2ps). Weights of a bf16/fp16 model are read in
// these formats and widened in registers (kinds 5 and 6 of quant_linear.h); a bf16/fp16 KV
// cache is written with torch's rounding (round to nearest even) and read the same way.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tnd {

inline float bf16_to_f32(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// As torch rounds (c10::round_to_nearest_even): NaN -> 0x7FC0, else half to even.
inline uint16_t f32_to_bf16(float x) {
  if (std::isnan(x)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

inline uint16_t f32_to_f16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// Element types of a 16-bit cache or weight row (distinct types, so overloads pick the
// conversion).
struct bf16 {
  uint16_t bits;
  operator float() const { return bf16_to_f32(bits); }
};
struct f16 {
  uint16_t bits;
  operator float() const { return _cvtsh_ss(bits); }
};

// 8 values widened to fp32.
inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const bf16* p) { return load8_bf16(reinterpret_cast<const uint16_t*>(p)); }
inline __m256 load8(const f16* p) { return load8_f16(reinterpret_cast<const uint16_t*>(p)); }

}  // namespace tnd
