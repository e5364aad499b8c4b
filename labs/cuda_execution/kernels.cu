// Kernels of the execution-model lab: SIMT divergence and occupancy.
// CUDA runtime only: this file compiles with a bare `nvcc -c -arch=sm_90`. Every launcher
// takes device pointers as int64 (torch's data_ptr()) and returns the launch's cudaError_t.
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>

// A value the inputs never produce: storing only when it appears keeps every load and
// FMA alive without writing one result per thread.
#define NEVER -1.2345e-30f

// ---------------------------------------------------------------------------
// Divergence. Both paths run k dependent FMAs with different constants, so neither
// can be merged into the other. MODE 0: every lane takes path A. MODE 1: even warps
// take A, odd warps B (each warp agrees with itself). MODE 2: even lanes A, odd lanes B
// (every warp disagrees with itself and runs both paths, one after the other).
// ---------------------------------------------------------------------------
template <int MODE>
__global__ void divergence_kernel(const float* __restrict__ in, float* __restrict__ out, int n, int k) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float x = in[i];
  bool take_a;
  if (MODE == 0) {
    take_a = true;
  } else if (MODE == 1) {
    take_a = ((threadIdx.x >> 5) & 1) == 0;
  } else {
    take_a = (threadIdx.x & 1) == 0;
  }
  if (take_a) {
    for (int j = 0; j < k; ++j) x = fmaf(x, 1.0000001f, 0.5f);
  } else {
    for (int j = 0; j < k; ++j) x = fmaf(x, 0.9999999f, -0.25f);
  }
  out[i] = x;
}

int launch_divergence(int64_t in, int64_t out, int n, int k, int mode, int block) {
  int grid = (n + block - 1) / block;
  const float* src = reinterpret_cast<const float*>(in);
  float* dst = reinterpret_cast<float*>(out);
  if (mode == 0) divergence_kernel<0><<<grid, block>>>(src, dst, n, k);
  else if (mode == 1) divergence_kernel<1><<<grid, block>>>(src, dst, n, k);
  else if (mode == 2) divergence_kernel<2><<<grid, block>>>(src, dst, n, k);
  else return (int)cudaErrorInvalidValue;
  return (int)cudaGetLastError();
}

// ---------------------------------------------------------------------------
// Memory-bound: read n4 float4s, grid-stride, ILP independent loads in flight per
// thread. Dynamic shared memory is requested but never touched: it only limits how
// many blocks fit on an SM, so occupancy changes while the code stays the same.
// Measured note (H200, CUDA 13.0, 2026-12-01): nvcc unrolls the ILP = 1 loop too; its SASS
// has 10 LDG.E.128 against 9 for ILP = 4, both use 32 registers, and both timed the same.
// ---------------------------------------------------------------------------
template <int ILP>
__global__ void stream_read_kernel(const float4* __restrict__ in, float* __restrict__ out, long long n4) {
  long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float acc = 0.f;
  for (; i + (ILP - 1) * stride < n4; i += ILP * stride) {
    float4 v[ILP];
#pragma unroll
    for (int j = 0; j < ILP; ++j) v[j] = in[i + j * stride];
#pragma unroll
    for (int j = 0; j < ILP; ++j) acc += (v[j].x + v[j].y) + (v[j].z + v[j].w);
  }
  for (; i < n4; i += stride) {
    float4 v = in[i];
    acc += (v.x + v.y) + (v.z + v.w);
  }
  if (acc == NEVER) out[0] = acc;
}

// ---------------------------------------------------------------------------
// Latency-bound: ILP independent chains of dependent FMAs per thread. With ILP = 1 a
// warp waits out each FMA's latency, so only more resident warps raise throughput;
// more chains per thread do the same job with fewer warps and more registers.
// ---------------------------------------------------------------------------
template <int ILP>
__global__ void fma_chain_kernel(float* __restrict__ out, int iters) {
  float x[ILP];
#pragma unroll
  for (int j = 0; j < ILP; ++j) x[j] = threadIdx.x * 1e-3f + j;
  for (int it = 0; it < iters; ++it) {
#pragma unroll
    for (int j = 0; j < ILP; ++j) x[j] = fmaf(x[j], 0.9999f, 1e-4f);
  }
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < ILP; ++j) s += x[j];
  if (s == NEVER) out[0] = s;
}

// Kernel ids shared with Python (labs/cuda_execution/lab.py KERNELS).
static const void* kernel_ptr(int id) {
  switch (id) {
    case 0: return (const void*)stream_read_kernel<1>;
    case 1: return (const void*)stream_read_kernel<4>;
    case 2: return (const void*)fma_chain_kernel<1>;
    case 3: return (const void*)fma_chain_kernel<4>;
    case 4: return (const void*)fma_chain_kernel<16>;
    case 5: return (const void*)fma_chain_kernel<64>;
    case 6: return (const void*)fma_chain_kernel<128>;
    default: return nullptr;
  }
}

// [registers per thread, resident blocks per SM] for a kernel at a block size and
// dynamic shared memory, from the CUDA occupancy API. Negative values: a CUDA error.
std::vector<int64_t> occupancy(int id, int block, int smem) {
  const void* k = kernel_ptr(id);
  if (!k) return {-1, -1};
  cudaError_t err = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return {-(int64_t)err, -(int64_t)err};
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, k);
  if (err != cudaSuccess) return {-(int64_t)err, -(int64_t)err};
  int blocks = 0;
  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k, block, smem);
  if (err != cudaSuccess) return {-(int64_t)err, -(int64_t)err};
  return {attr.numRegs, blocks};
}

// The SM's limits that decide occupancy, as the device reports them.
std::vector<int64_t> device_limits() {
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p;
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) return {};
  return {p.multiProcessorCount, p.regsPerMultiprocessor, p.maxThreadsPerMultiProcessor,
          p.maxBlocksPerMultiProcessor, (int64_t)p.sharedMemPerMultiprocessor,
          (int64_t)p.reservedSharedMemPerBlock, (int64_t)p.sharedMemPerBlockOptin, p.warpSize};
}

int launch_occupancy_kernel(int id, int64_t in, int64_t out, long long n4, int iters, int grid, int block, int smem) {
  const float4* src = reinterpret_cast<const float4*>(in);
  float* dst = reinterpret_cast<float*>(out);
  switch (id) {
    case 0: stream_read_kernel<1><<<grid, block, smem>>>(src, dst, n4); break;
    case 1: stream_read_kernel<4><<<grid, block, smem>>>(src, dst, n4); break;
    case 2: fma_chain_kernel<1><<<grid, block, smem>>>(dst, iters); break;
    case 3: fma_chain_kernel<4><<<grid, block, smem>>>(dst, iters); break;
    case 4: fma_chain_kernel<16><<<grid, block, smem>>>(dst, iters); break;
    case 5: fma_chain_kernel<64><<<grid, block, smem>>>(dst, iters); break;
    case 6: fma_chain_kernel<128><<<grid, block, smem>>>(dst, iters); break;
    default: return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}
