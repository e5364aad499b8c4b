// Kernels of the memory lab: access patterns, a transpose through shared memory, bank conflicts.
// CUDA runtime only: this file compiles with a bare `nvcc -c -arch=sm_90`. Every launcher
// takes device pointers as int64 (torch's data_ptr()) and returns the launch's cudaError_t.
#include <cstdint>
#include <cuda_runtime.h>

#define NEVER -1.2345e-30f  // the inputs never produce it: storing only then keeps the loads alive

// ---------------------------------------------------------------------------
// Reads. Thread i of the grid-stride loop reads element idx(i), a bijection on [0, n):
//   PATTERN 0: idx = i (a warp reads 32 consecutive floats: 128 bytes, four 32-byte sectors)
//   PATTERN 1: the array seen as (n / stride) rows of `stride` floats, read column by column:
//              neighbouring lanes are `stride` floats apart
//   PATTERN 2: a bit-mixing bijection on log2(n) bits: neighbouring lanes land anywhere
// n is a power of two; so is stride.
// ---------------------------------------------------------------------------
__device__ __forceinline__ unsigned scatter(unsigned i, unsigned log2n) {
  unsigned mask = (log2n >= 32) ? 0xffffffffu : ((1u << log2n) - 1u);
  unsigned half = log2n / 2;
  unsigned x = (i * 2654435761u) & mask;  // odd multiplier: a bijection mod 2^log2n
  x ^= x >> half;                         // xor with a right shift: a bijection too
  x = (x * 2246822519u) & mask;
  x ^= x >> half;
  return x;
}

template <int PATTERN>
__global__ void read_kernel(const float* __restrict__ in, float* __restrict__ out, unsigned n,
                            unsigned log2n, unsigned log2stride) {
  unsigned log2rows = log2n - log2stride;
  unsigned rows_mask = (1u << log2rows) - 1u;
  float acc = 0.f;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    unsigned idx;
    if (PATTERN == 0) idx = i;
    else if (PATTERN == 1) idx = ((i & rows_mask) << log2stride) | (i >> log2rows);
    else idx = scatter(i, log2n);
    acc += in[idx];
  }
  if (acc == NEVER) out[0] = acc;
}

int launch_read(int pattern, int64_t in, int64_t out, unsigned n, unsigned log2n, unsigned log2stride,
                int grid, int block) {
  const float* src = reinterpret_cast<const float*>(in);
  float* dst = reinterpret_cast<float*>(out);
  if (pattern == 0) read_kernel<0><<<grid, block>>>(src, dst, n, log2n, log2stride);
  else if (pattern == 1) read_kernel<1><<<grid, block>>>(src, dst, n, log2n, log2stride);
  else if (pattern == 2) read_kernel<2><<<grid, block>>>(src, dst, n, log2n, log2stride);
  else return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

// Writes idx(i) for every i, so the host can check that each pattern is a bijection.
template <int PATTERN>
__global__ void index_kernel(unsigned* __restrict__ out, unsigned n, unsigned log2n, unsigned log2stride) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned log2rows = log2n - log2stride;
  unsigned idx;
  if (PATTERN == 0) idx = i;
  else if (PATTERN == 1) idx = ((i & ((1u << log2rows) - 1u)) << log2stride) | (i >> log2rows);
  else idx = scatter(i, log2n);
  out[i] = idx;
}

int launch_index(int pattern, int64_t out, unsigned n, unsigned log2n, unsigned log2stride) {
  unsigned* dst = reinterpret_cast<unsigned*>(out);
  int grid = (int)((n + 255) / 256);
  if (pattern == 0) index_kernel<0><<<grid, 256>>>(dst, n, log2n, log2stride);
  else if (pattern == 1) index_kernel<1><<<grid, 256>>>(dst, n, log2n, log2stride);
  else if (pattern == 2) index_kernel<2><<<grid, 256>>>(dst, n, log2n, log2stride);
  else return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

// ---------------------------------------------------------------------------
// Transpose of an n x n float matrix (n a multiple of 32) by 32 x 32 tiles, with
// 32 x 8 threads per tile: each thread moves 4 elements.
// ---------------------------------------------------------------------------
#define TILE 32
#define TILE_ROWS 8

// Same tiles, no transpose: reads and writes both coalesced. The ceiling for the others.
__global__ void copy_tiles_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  int col = blockIdx.x * TILE + threadIdx.x;
  int row = blockIdx.y * TILE + threadIdx.y;
  for (int r = 0; r < TILE; r += TILE_ROWS) out[(size_t)(row + r) * n + col] = in[(size_t)(row + r) * n + col];
}

// Reads rows (coalesced), writes columns: neighbouring lanes write n floats apart.
__global__ void transpose_naive_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  int col = blockIdx.x * TILE + threadIdx.x;
  int row = blockIdx.y * TILE + threadIdx.y;
  for (int r = 0; r < TILE; r += TILE_ROWS) out[(size_t)col * n + row + r] = in[(size_t)(row + r) * n + col];
}

// Stages the tile in shared memory, so both the global read and the global write are
// along rows. PAD = 0: the tile's column reads hit one bank 32 times (a 32-way
// conflict); PAD = 1: a 33-float row stride spreads a column over all 32 banks.
// --8<-- [start:tiled]
template <int PAD>
__global__ void transpose_tiled_kernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  __shared__ float tile[TILE][TILE + PAD];
  int col = blockIdx.x * TILE + threadIdx.x;
  int row = blockIdx.y * TILE + threadIdx.y;
  for (int r = 0; r < TILE; r += TILE_ROWS) tile[threadIdx.y + r][threadIdx.x] = in[(size_t)(row + r) * n + col];
  __syncthreads();
  col = blockIdx.y * TILE + threadIdx.x;  // the output tile sits at the mirrored position
  row = blockIdx.x * TILE + threadIdx.y;
  for (int r = 0; r < TILE; r += TILE_ROWS) out[(size_t)(row + r) * n + col] = tile[threadIdx.x][threadIdx.y + r];
}
// --8<-- [end:tiled]

int launch_transpose(int variant, int64_t in, int64_t out, int n) {
  const float* src = reinterpret_cast<const float*>(in);
  float* dst = reinterpret_cast<float*>(out);
  dim3 grid(n / TILE, n / TILE), block(TILE, TILE_ROWS);
  if (variant == 0) copy_tiles_kernel<<<grid, block>>>(src, dst, n);
  else if (variant == 1) transpose_naive_kernel<<<grid, block>>>(src, dst, n);
  else if (variant == 2) transpose_tiled_kernel<0><<<grid, block>>>(src, dst, n);
  else if (variant == 3) transpose_tiled_kernel<1><<<grid, block>>>(src, dst, n);
  else return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

// ---------------------------------------------------------------------------
// Bank conflicts in isolation: lane l of every warp reads word (l * stride + it) mod
// SMEM_WORDS of a shared array, `iters` times. Word w sits in bank w mod 32, so the
// lanes of a warp share gcd(stride, 32)-way banks; a uniform offset (it) moves every
// lane by the same amount and keeps the pattern.
// ---------------------------------------------------------------------------
#define SMEM_WORDS 8192

__global__ void smem_stride_kernel(float* __restrict__ out, int stride, int iters) {
  __shared__ float buf[SMEM_WORDS];
  for (int w = threadIdx.x; w < SMEM_WORDS; w += blockDim.x) buf[w] = w * 1e-3f;
  __syncthreads();
  int lane = threadIdx.x & 31;
  unsigned base = (unsigned)(lane * stride);
  float acc = 0.f;
  for (int it = 0; it < iters; ++it) acc += buf[(base + it) & (SMEM_WORDS - 1)];
  if (acc == NEVER) out[0] = acc;
}

int launch_smem_stride(int64_t out, int stride, int iters, int grid, int block) {
  smem_stride_kernel<<<grid, block>>>(reinterpret_cast<float*>(out), stride, iters);
  return (int)cudaGetLastError();
}
