// Implementation of server/engine/cuda/kernels.h.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "server/engine/cuda/kernels.h"

namespace orthoserve::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ void Store(DType t, void* p, int64_t i, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DType::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
  }
}

// Block-wide sum in shared memory, fixed tree order. Every thread gets the sum back.
__device__ double BlockSum(double v) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  double total = shared[0];
  __syncthreads();
  return total;
}

// Block (x, j) sums its part of matrix j into partial[j·gridDim.x + x].
__device__ __forceinline__ float RoundBf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__global__ void SumSquaresPartial(DType t, const void* x, int64_t n, bool bf16_input, double* partial) {
  const int64_t base = blockIdx.y * n;
  double acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float loaded = Load(t, x, base + i);
    const double v = bf16_input ? RoundBf16(loaded) : loaded;
    acc += v * v;
  }
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) partial[blockIdx.y * gridDim.x + blockIdx.x] = total;
}

// Block j sums the `count` partials of matrix j.
__global__ void SumPartials(const double* partial, int count, double* result) {
  const double* mine = partial + static_cast<int64_t>(blockIdx.x) * count;
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += kThreads) acc += mine[i];
  const double total = BlockSum(acc);
  if (threadIdx.x == 0) result[blockIdx.x] = total;
}

// The divisor is formed in double and rounded once to fp32, as the CPU backend does; a zero
// divisor (an all-zero matrix with eps = 0) leaves the values as they are (zeros).
// With `bf16`, Normalization::kBf16: the divisor and every input rounded to bf16 first.
__global__ void NormalizeKernel(DType in_t, const void* in, int64_t n, const double* sumsq, double eps, bool add_eps,
                                bool bf16, DType work, void* out) {
  const int64_t base = blockIdx.y * n;
  const double norm = sqrt(sumsq[blockIdx.y]);
  float d;
  if (bf16) {
    const float norm_b = RoundBf16(static_cast<float>(norm));
    const float eps_b = RoundBf16(static_cast<float>(eps));
    d = add_eps ? RoundBf16(norm_b + eps_b) : fmaxf(norm_b, eps_b);
  } else {
    d = static_cast<float>(add_eps ? norm + eps : fmax(norm, eps));
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float loaded = Load(in_t, in, base + i);
    const float v = bf16 ? RoundBf16(loaded) : loaded;
    Store(work, out, base + i, d != 0.0f ? v / d : v);
  }
}

__global__ void ScaleConvertKernel(DType x_t, const void* x, int64_t n, float scale, DType out_t, void* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    Store(out_t, out, i, Load(x_t, x, i) * scale);
  }
}

constexpr int kTile = 32;

// Block (bx, by, j) writes the kTile × kTile tile at rows [bx·kTile, +kTile), cols [by·kTile,
// +kTile) of matrix j's lower triangle from the transposed upper tile, through shared memory so
// that both the reads and the writes walk columns (coalesced).
template <typename T>
__global__ void MirrorKernel(T* base, int64_t m, int64_t ld, int64_t stride) {
  if (blockIdx.x < blockIdx.y) return;  // Upper tiles are sources only.
  __shared__ T tile[kTile][kTile + 1];
  T* c = base + blockIdx.z * stride;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  // tile[j][x] = C(c0 + x, r0 + j): rows [c0, +kTile) of columns [r0, +kTile), upper (or diagonal).
  for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
    const int64_t row = c0 + threadIdx.x, col = r0 + j;
    if (row < m && col < m) tile[j][threadIdx.x] = c[row + col * ld];
  }
  __syncthreads();
  // C(r0 + x, c0 + j) = C(c0 + j, r0 + x) = tile[x][j], strictly below the diagonal only.
  for (int j = threadIdx.y; j < kTile; j += blockDim.y) {
    const int64_t row = r0 + threadIdx.x, col = c0 + j;
    if (row < m && col < m && row > col) c[row + col * ld] = tile[threadIdx.x][j];
  }
}

__global__ void AccumulateKernel(DType src_t, const void* src, int64_t n, float* dst, bool first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const float v = Load(src_t, src, i);
    dst[i] = first ? v : dst[i] + v;
  }
}

// One thread: the order of the additions is the contract.
__global__ void SumInOrderKernel(const double* v, int64_t n, double* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += v[i];
  *out = sum;
}

// Each thread walks its indices in increasing order, so the first non-finite one it meets is its
// smallest; the atomic minimum over the threads is then the first of all, whatever their order.
__global__ void FirstNonFiniteKernel(DType t, const void* x, int64_t n, unsigned long long* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    if (!isfinite(Load(t, x, i))) {
      atomicMin(first, static_cast<unsigned long long>(i));
      return;
    }
  }
}

__global__ void NeverRuns(int* p) {
  if (p != nullptr) *p = 1;
}

// The launchers return cudaGetLastError() after their launch, which also reports an error that
// an earlier runtime call on this thread left behind (a failed copy, a cudaStreamQuery's
// cudaErrorNotReady in a collective, ...). They clear it first, so a launch reports only its own
// error; sticky device errors fail the launch itself and are reported anyway.
void ClearStaleError() { cudaGetLastError(); }

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535 * 8)));
}

// Partial sums per matrix: depends only on n, so the summation order is fixed for a given size.
int SumSquaresBlocks(int64_t n) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(kSumSquaresMaxScratch, (n + kThreads * 8 - 1) / (kThreads * 8))));
}

}  // namespace

int64_t SumSquaresScratch(int64_t n, int64_t batch) { return SumSquaresBlocks(n) * batch; }

cudaError_t SumSquares(DType dtype, const void* x, int64_t n, int64_t batch, bool bf16_input, double* scratch,
                       double* result, cudaStream_t stream) {
  const int blocks = SumSquaresBlocks(n);
  ClearStaleError();
  SumSquaresPartial<<<dim3(blocks, static_cast<unsigned>(batch)), kThreads, 0, stream>>>(dtype, x, n, bf16_input,
                                                                                         scratch);
  SumPartials<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(scratch, blocks, result);
  return cudaGetLastError();
}

cudaError_t Normalize(DType in_dtype, const void* in, int64_t n, int64_t batch, const double* sumsq, double eps,
                      bool add_eps, bool bf16, DType work, void* out, cudaStream_t stream) {
  ClearStaleError();
  NormalizeKernel<<<dim3(GridFor(n), static_cast<unsigned>(batch)), kThreads, 0, stream>>>(in_dtype, in, n, sumsq,
                                                                                          eps, add_eps, bf16, work,
                                                                                          out);
  return cudaGetLastError();
}

cudaError_t ScaleConvert(DType x_dtype, const void* x, int64_t n, float scale, DType out_dtype, void* out,
                         cudaStream_t stream) {
  ClearStaleError();
  ScaleConvertKernel<<<GridFor(n), kThreads, 0, stream>>>(x_dtype, x, n, scale, out_dtype, out);
  return cudaGetLastError();
}

cudaError_t MirrorUpper(DType dtype, void* c, int64_t m, int64_t ld, int64_t batch, int64_t stride,
                        cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((m + kTile - 1) / kTile);
  const dim3 block(kTile, 8);
  const dim3 grid(tiles, tiles, static_cast<unsigned>(batch));
  ClearStaleError();
  if (dtype == DType::kF32) {
    MirrorKernel<float><<<grid, block, 0, stream>>>(static_cast<float*>(c), m, ld, stride);
  } else {
    MirrorKernel<uint16_t><<<grid, block, 0, stream>>>(static_cast<uint16_t*>(c), m, ld, stride);
  }
  return cudaGetLastError();
}

cudaError_t AccumulateF32(DType src_dtype, const void* src, int64_t n, float* dst, bool first, cudaStream_t stream) {
  ClearStaleError();
  AccumulateKernel<<<GridFor(n), kThreads, 0, stream>>>(src_dtype, src, n, dst, first);
  return cudaGetLastError();
}

cudaError_t SumInOrder(const double* v, int64_t n, double* out, cudaStream_t stream) {
  ClearStaleError();
  SumInOrderKernel<<<1, 1, 0, stream>>>(v, n, out);
  return cudaGetLastError();
}

cudaError_t FirstNonFinite(DType dtype, const void* x, int64_t n, unsigned long long* first, cudaStream_t stream) {
  ClearStaleError();
  FirstNonFiniteKernel<<<GridFor(n), kThreads, 0, stream>>>(dtype, x, n, first);
  return cudaGetLastError();
}

cudaError_t LaunchInvalidConfigForTest(cudaStream_t stream) {
  // 4096 threads per block exceeds the 1024 every CUDA device allows: cudaErrorInvalidConfiguration.
  ClearStaleError();
  NeverRuns<<<1, 4096, 0, stream>>>(nullptr);
  return cudaGetLastError();
}

}  // namespace orthoserve::cuda
