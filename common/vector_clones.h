// ORTHOSERVE_VECTOR_CLONES: on x86-64, compiles the function it marks three times — for the
// baseline (SSE2), AVX2 and AVX-512F — and picks one when the program loads, by what the CPU
// supports (GCC's and Clang's target_clones). For loops over whole matrices that compilers
// vectorize: the clones do the same IEEE operations on each element, so they give the same bits,
// only with wider vectors. A marked loop must not rely on a multiply-add staying unfused (AVX-512F
// has FMA instructions; the project builds in ISO C++ mode, where GCC does not contract, and the
// loops marked today have no multiply-add). Elsewhere it marks nothing.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ORTHOSERVE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTHOSERVE_VECTOR_CLONES
#endif
