// Moving matrices between the caller's buffers (fp32/bf16/fp16, either orientation) and the
// backend's fp32 working layout, and the Frobenius normalization of docs/numerics.md §2 step 2.
// Pure functions of their arguments; thread-safe for distinct outputs.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "common/ns_options.h"

namespace orthoserve {

// Writes the working matrix of a rows × cols input: `in` itself (rows × cols) when !transpose,
// its transpose (cols × rows) when transpose. `scratch` holds rows·cols floats (used when
// transposing); `x` receives rows·cols floats.
void LoadWorking(DType dtype, const void* in, int64_t rows, int64_t cols, bool transpose, float* scratch, float* x);

// Writes out = scale · (the working matrix `x` transposed back when `transpose`), rounded once
// to fp32 from the exact product (double) and then narrowed to `dtype`. `x` is rows × cols when
// !transpose, cols × rows when transpose; `scratch` holds rows·cols floats.
void StoreWorking(const float* x, int64_t rows, int64_t cols, bool transpose, double scale, float* scratch, DType dtype,
                  void* out);

// Σ x², accumulated in double (exact products, rounding only in the additions), in an order
// fixed by `count` alone: the elements are cut into blocks of kSquaresBlock (the last one
// shorter); within a block, element j is added to partial sum j % kSquareLanes, and the partial
// sums are added pairwise (lane k + 8 to lane k, then k + 4, k + 2, k + 1); the blocks' sums are
// then added in block order. Computing the blocks' sums on several threads (BlockSumOfSquares)
// and adding them in order gives the same bits.
inline constexpr int kSquareLanes = 16;
inline constexpr int64_t kSquaresBlock = 16384;
double SumOfSquares(const float* x, int64_t count);

// SumOfSquares of `count` elements of `dtype` at `in` (unaligned allowed) widened to fp32, bit
// for bit, without a widened copy: reads `in` once.
double SumOfSquaresOf(DType dtype, const void* in, int64_t count);

// The sum of one block of SumOfSquaresOf: `count` ≤ kSquaresBlock elements of `dtype` at `in`,
// which is a block's start (element i · kSquaresBlock of the whole).
double BlockSumOfSquares(DType dtype, const void* in, int64_t count);

// The fp32 divisor of the normalization for a squared norm `sum_squares`: max(‖X‖_F, eps) for
// kMax, ‖X‖_F + eps for kAdd, computed in double and rounded once to fp32.
float NormDivisor(double sum_squares, double eps, EpsMode mode);

// NormDivisor of Normalization::kBf16 (torch.optim.Muon's order): ‖X‖_F rounded to fp32 and then
// to bf16, eps rounded to bf16, then max(‖X‖, eps) for kMax, bf16(‖X‖ + eps) for kAdd.
float Bf16NormDivisor(double sum_squares, double eps, EpsMode mode);

// x /= divisor in fp32 (one rounding per element), then, when `round_bf16`, rounds to bf16. A
// zero divisor (an all-zero matrix with eps = 0) leaves the zeros as they are instead of making
// NaN.
void NormalizeInPlace(float* x, int64_t count, float divisor, bool round_bf16);

// NS with no steps, which is elementwise: out = scale · NormalizeInPlace(in widened to fp32),
// bit for bit what LoadWorking, NormalizeInPlace and StoreWorking (no transpose) give, in one
// pass from `in` to `out` without a working matrix. `in` holds `count` elements of `in_dtype`,
// `out` receives `count` elements of `out_dtype`; either may be unaligned.
void NormalizeScaleStore(DType in_dtype, const void* in, int64_t count, float divisor, bool round_bf16, double scale,
                         DType out_dtype, void* out);

}  // namespace orthoserve
