// e4m3 bytes (torch.float8_e4m3fn: sign, 4 exponent bits of bias 7, 3 mantissa bits) next to
// fp32: widening in registers (an FP8 checkpoint's weights, fp8_weights.h; an fp8 KV cache's
// values, kv_head.h) and torch's narrowing (the fp8 KV cache's writes).
//
// Widening: e4m3 byte s.eeee.mmm placed in an fp16 as s.0eeee.mmm0000000 is the same value
// times 2^-8 (fp16's exponent bias is 15, e4m3's 7; a subnormal's mantissa lands on fp16's
// subnormal mantissa, so subnormals too), and F16C widens that exactly whatever MXCSR's
// denormal flags say. Callers carry the 2^8 in their scales (exact: a power of two). The two
// NaN codes (0x7F, 0xFF) read as +-480: FP8 weights are refused with them (packed_linear.py),
// and a cache holds them only where a NaN was written (the row that computed it is NaN already).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tnd {

// A widened e4m3 value (the byte's value times 2^-8) times this is the byte's value.
constexpr float E4M3_UNWIDEN = 256.f;

// 16 e4m3 bytes as the fp16 codes of their values times 2^-8 (16 lanes of 16 bits).
inline __m256i e4m3_to_f16_bits(__m128i bytes) {
  const __m256i t = _mm256_slli_epi16(_mm256_cvtepu8_epi16(bytes), 7);  // sign now at bit 14
  return _mm256_add_epi16(t, _mm256_and_si256(t, _mm256_set1_epi16(0x4000)));  // ... at 15
}

// One e4m3 byte's value times 2^-8, as fp16 bits (the scalar form of e4m3_to_f16_bits).
inline uint16_t e4m3_to_f16_bits(uint8_t b) {
  const uint16_t t = static_cast<uint16_t>(b << 7);
  return static_cast<uint16_t>(t + (t & 0x4000));
}

// x as torch.float8_e4m3fn bits, as torch converts (c10's fp8e4m3fn_from_fp32_value, and its
// AVX-512 twin cvtfp32_fp8e4m3): round to nearest even; what rounds past 448 (inf too)
// saturates to 448 (0x7E), NaN is the NaN code 0x7F, each with x's sign; below 2^-6 the float
// addition of 2^14 rounds the mantissa onto e4m3's subnormal grid.
inline uint8_t f32_to_e4m3(float x) {
  constexpr uint32_t past_max = UINT32_C(1087) << 20;  // 480.0f, the first value past e4m3's
  constexpr uint32_t denorm_mask = UINT32_C(141) << 23;  // 2^14
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  const uint32_t sign = bits & UINT32_C(0x80000000);
  bits ^= sign;
  uint8_t out;
  if (bits >= past_max) {
    out = bits > UINT32_C(0x7F800000) ? 0x7F : 0x7E;  // NaN; finite overflow or inf
  } else if (bits < (UINT32_C(121) << 23)) {  // under 2^-6, e4m3's smallest normal
    float mag, bias;
    std::memcpy(&mag, &bits, sizeof(mag));
    std::memcpy(&bias, &denorm_mask, sizeof(bias));
    const float sum = mag + bias;
    uint32_t s;
    std::memcpy(&s, &sum, sizeof(s));
    out = static_cast<uint8_t>(s - denorm_mask);
  } else {
    const uint32_t odd = (bits >> 20) & 1;  // the kept mantissa's last bit: ties to even
    bits += (static_cast<uint32_t>(7 - 127) << 23) + UINT32_C(0x7FFFF) + odd;
    out = static_cast<uint8_t>(bits >> 20);
    if (out == 0x7F) out = 0x7E;  // rounded up past 448: saturate
  }
  return static_cast<uint8_t>(out | (sign >> 24));
}

// An fp8 KV cache element: one e4m3 byte, widened to its value times 2^-8 (E4M3_UNWIDEN).
struct e4m3 {
  uint8_t bits;
  operator float() const { return _cvtsh_ss(e4m3_to_f16_bits(bits)); }
};

// 8 elements widened to fp32 (values times 2^-8).
inline __m256 load8(const e4m3* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i t = _mm_slli_epi16(_mm_cvtepu8_epi16(b), 7);
  return _mm256_cvtph_ps(_mm_add_epi16(t, _mm_and_si128(t, _mm_set1_epi16(0x4000))));
}

#if defined(__AVX512F__) && defined(__AVX512BW__)
// 16 elements widened to fp32 (values times 2^-8): the AVX-512 build's attention loops.
inline __m512 load16(const e4m3* p) {
  return _mm512_cvtph_ps(e4m3_to_f16_bits(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
#endif

}  // namespace tnd
