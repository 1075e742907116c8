// A loop over the elements of a matrix that compilers vectorize at -O2 as well as at -O3.
#pragma once

#include <cstdint>

namespace orthoserve {

// Calls f(i) for every i in [0, count), in order. The body runs in groups of a constant 16
// iterations and then a tail: GCC's -O2 cost model vectorizes only loops that need no scalar
// remainder, which the constant groups satisfy. `f` must not depend on earlier iterations'
// results (it may read and write element i) and pointers it writes through must be __restrict
// or the ones it reads, for the groups to vectorize; the results are the same either way.
template <typename F>
inline void ForEachElement(int64_t count, F f) {
  constexpr int64_t kLanes = 16;
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int64_t k = 0; k < kLanes; ++k) f(i + k);
  }
  for (; i < count; ++i) f(i);
}

}  // namespace orthoserve
