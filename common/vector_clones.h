// ORTHOSERVE_VECTOR_CLONES: on x86-64, compiles the function it marks three times — for the
// baseline (SSE2), AVX2 and AVX-512F — and picks one when the program loads, by what the CPU
// supports (GCC's and Clang's target_clones). For loops over whole matrices that compilers
// vectorize: the clones do the same IEEE operations on each element, so they give the same bits,
// only with wider vectors. A marked loop must not rely on a multiply-add staying unfused (AVX-512F
// has FMA instructions; the project builds in ISO C++ mode, where GCC does not contract, and the
// loops marked today have no multiply-add). Elsewhere it marks nothing, and so it does where
// ORTHOSERVE_NO_VECTOR_CLONES is defined: scripts/check_thread_safety.sh defines it, since Clang 14
// (Debian 12's) rejects target_clones on function templates, which dtype.cc and working_matrix.cc mark.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(ORTHOSERVE_NO_VECTOR_CLONES)
#define ORTHOSERVE_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTHOSERVE_VECTOR_CLONES
#endif
