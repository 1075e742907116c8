// The products of one Newton–Schulz step on dense row-major fp32 matrices, each split into
// parts that run single-threaded OpenBLAS calls (sgemm, ssyrk) on a ParallelFor, with a fused
// elementwise epilogue on each part's output (the addmm term and the bf16 rounding of MEDIUM).
//
// Why epilogues rather than BLAS's beta: `sgemm(..., beta = a, Y)` needs Y preloaded with X (a
// copy pass) and OpenBLAS then scales Y by beta in a pass of its own before accumulating; adding
// a·X to the slice just written reads X once and leaves the fp32 product untouched until the
// single fused rounding, which is the addmm form of the contract.
//
// Determinism: the split depends only on the shapes and ParallelFor::threads(), and every part
// writes only its own rows or columns, so for a fixed thread count the results are bit-identical
// whatever the scheduling, the batch or the concurrent callers. All functions are thread-safe
// for distinct outputs.
#pragma once

#include <cstdint>

#include "server/engine/cpu/parallel_for.h"

namespace orthoserve {

// Lower triangle (diagonal included) of C = alpha·X·Xᵀ, X m×k with leading dimension k, C m×m.
// The strict upper triangle of C is left as it was. When `round_bf16`, each written entry is
// rounded to bf16 once, after the fp32 accumulation. OpenBLAS ssyrk on the diagonal blocks and
// sgemm on the blocks below them.
void SyrkLower(ParallelFor& pool, int64_t m, int64_t k, float alpha, const float* x, float* c, bool round_bf16);

// Lower triangle of C = alpha·S·S + beta·S for a symmetric m×m matrix S (full storage), one
// fused output: the product accumulates in fp32 (S·S = S·Sᵀ through ssyrk), beta·S is added and,
// when `round_bf16`, the sum is rounded to bf16 once.
void SymmetricPolyLower(ParallelFor& pool, int64_t m, float alpha, float beta, const float* s, float* c,
                        bool round_bf16);

// Copies the strict lower triangle of the m×m matrix C onto its upper triangle.
void MirrorLower(int64_t m, float* c);

// Y = alpha·(B·X) + beta·X for B m×m (full storage) and X m×n, one fused output: the product
// accumulates in fp32 (sgemm), alpha·acc + beta·x is formed in fp32 and, when `round_bf16`,
// rounded to bf16 once. Y must not overlap X or B.
void GemmAddmm(ParallelFor& pool, int64_t m, int64_t n, float alpha, const float* b, const float* x, float beta,
               float* y, bool round_bf16);

}  // namespace orthoserve
