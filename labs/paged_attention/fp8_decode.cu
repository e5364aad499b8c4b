// Paged decode attention over a float8 e4m3 KV cache, in CUDA C++ with the matrix unit's
// register fragments written out by hand. fp8_decode.py compiles it with NVRTC and says
// why it exists beside the Triton kernel; kernel.py holds the maths and the split plan this
// file repeats.
//
// Defined by the compiler's command line: BLOCK_SIZE (tokens per KV block), STRIDE_CT (bytes
// between a block's tokens: num_kv_heads x 128 for a contiguous pool), SPLIT (0: one
// program per (sequence, group of KV heads); 1: the split plan), FLAT (with SPLIT: unequal
// lengths take the flat plan, not the chunked one), FOLD (with FLAT: a sequence of more than
// FOLD pieces is combined in groups as its pieces finish; 0: never), Q_BF16 (queries and output
// in bf16, else fp16), CHUNK (tokens a warp takes per step: 16 or 32), MIN_BLOCKS (programs
// per SM the register budget is cut for), TILE (the split plan's unit: every split starts on
// a multiple of TILE tokens; a multiple of 16), HEADS (KV heads a program serves), WPH (warps
// per KV head: 1 or 2), RANK_MAX (most sequences whose remainders the ragged plan ranks),
// HEAD_DIM and GROUP_MAX (most query heads per KV head). fp8_decode.py holds them all; the
// fragment layout below is written for HEAD_DIM 128 and GROUP_MAX 8, which the
// static_asserts hold it to.
//
// The idea. One warp computes S^T = K Q^T and O^T = V^T P^T with mma.m16n8k16 (fp16 in,
// fp32 out): the 16 rows of each product are tokens or head dimensions, and the 8 columns
// are the group's query heads. Each thread loads its own K and V bytes from global memory
// straight into registers and converts them there; no K or V byte goes through shared memory.
//
// Two warps per KV head. The warps of a program serve different heads of the same tokens
// (all 8 of an 8-head pool), so together they read whole KV blocks. With one head per program
// and its 4 warps sharing the tokens, each program read 128-byte pieces of every 1-KB token
// row, and the DRAM served those 10-15% slower than whole blocks (NOTES.md, v9). A head's two
// warps take alternate 16-token chunks of the split, and the second hands its softmax state
// to the first through shared memory at the end: one program of 16 warps per SM, half the
// splits of one warp per head, and no split at all for (128, 2,048) (NOTES.md, v10).
//
// Both products sum over an axis whose order is ours to choose, as long as both operands
// use the same order. That freedom is what lets every load be 16 contiguous bytes:
// * q.K^T sums over head dimensions. Thread (r = lane / 4, c = lane % 4) holds dimensions
//   16c..16c+15 and 64+16c..64+16c+15 of its tokens (rows r and r+8 of a 16-token tile),
//   and k-step ks of the product uses the 4 bytes at word ks of those 32. Q is loaded in the
//   same order, once.
// * P.V sums over tokens, and V is stored token by token, so the two tokens a register pairs
//   for one dimension sit a token stride apart. Thread (r, c) loads 16 bytes (dimensions 16r..16r+15) of
//   tokens 2c, 2c+1, 2c+8, 2c+9 and pairs the same byte of two tokens with one byte permute
//   (prmt) before converting: an in-register transpose. The 8 output tiles of O^T are
//   numbered so that row r of tile i is dimension 16r + 2i and row r+8 is 16r + 2i + 1.
// * P leaves the first product with tokens on rows and queries on columns; the second needs
//   it the other way round. movmatrix transposes each 8x8 fp16 block across the warp.
//
// Instructions per byte set the first version's speed, not the loads in flight (NOTES.md,
// v6): with the address of every load worked out per token, the loop took 535 instructions
// per 16 tokens and ran no faster than the Triton kernel. A 16-token tile lies in one KV block, so
// here each tile costs one block-table entry and one 64-bit product, and the 8 loads are
// fixed offsets (immediates) from two pointers: 273 instructions in the loop's code, the
// last-chunk masking and the rescale included (most chunks skip both), of which 66 convert
// e4m3 to fp16 and 16 are the products. Prefetching the next chunk into registers,
// a per-warp ring of asynchronous copies in shared memory, and a fifth program per SM
// (queries in shared memory to free registers) were each slower; a producer warp filling a
// ring of whole-block bulk copies for 8 consumer warps was at most 2% faster (NOTES.md,
// v17). With the loop this short, most of the maths hides behind the loads (the conversions
// cost nothing; without any maths the kernel is 3-4 us faster at (32, 4096); NOTES.md, v17
// and v18), and what set the speed next was the order of the reads, which serving every
// head of a token in one program fixed (NOTES.md, v9).

typedef unsigned int u32;
typedef unsigned short u16;
typedef long long i64;

#if !defined(HEADS) || !defined(WPH) || !defined(HEAD_DIM) || !defined(GROUP_MAX)
#error "HEADS, WPH, HEAD_DIM and GROUP_MAX come from fp8_decode.py (defines)"
#endif
#if !defined(FOLD)
#error "FOLD comes from fp8_decode.py (defines)"
#endif
static_assert(FOLD == 0 || FOLD >= 2, "a group of one piece per FOLD would fold nothing");
static_assert(WPH == 1 || WPH == 2, "a head's second warp hands its state to the first through shared memory");
#define WARPS (HEADS * WPH)
static_assert(HEAD_DIM == 128, "8 k-steps of 16 dimensions per product, 8 output tiles of 16 dimensions");
static_assert(GROUP_MAX == 8, "a group's query heads are the 8 columns of mma.m16n8k16");
#define THREADS (WARPS * 32)
#define MT (CHUNK / 16)  // 16-token tiles per warp step
#define NEG_INF __int_as_float(0xff800000u)

struct alignas(16) Vec16 {
  u32 w[4];
};

__device__ __forceinline__ u32 e4m3x2_to_f16x2(u32 pair) {
  u32 out;
  u16 in = (u16)pair;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(out) : "h"(in));
  return out;
}

// The same for the high 16 bits of the word, taken as a half-register (no shift).
__device__ __forceinline__ u32 e4m3x2_hi_to_f16x2(u32 pair) {
  u32 out;
  asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.rn.f16x2.e4m3x2 %0, hi; }" : "=r"(out) : "r"(pair));
  return out;
}

__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 selector) {
  u32 out;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(out) : "r"(a), "r"(b), "r"(selector));
  return out;
}

__device__ __forceinline__ u32 pack_f16x2(float lo, float hi) {
  u32 out;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(hi), "f"(lo));
  return out;
}

__device__ __forceinline__ u32 transpose_8x8(u32 x) {
  u32 out;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(out) : "r"(x));
  return out;
}

__device__ __forceinline__ float exp2_approx(float x) {
  float out;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(out) : "f"(x));
  return out;
}

// d += a (16x16, row-major fragment) * b (16x8, column-major fragment), fp16 in, fp32 out.
__device__ __forceinline__ void mma_16816(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A pair of 16-bit queries, as fp16 whatever they are stored as.
__device__ __forceinline__ u32 q_pair_f16(u32 w) {
#if Q_BF16
  return pack_f16x2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
#else
  return w;
#endif
}

__device__ __forceinline__ u16 to_output(float x) {
  u16 out;
#if Q_BF16
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(x));
#else
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(out) : "f"(x));
#endif
  return out;
}

__device__ __forceinline__ float warp_max_over_rows(float x) {
  // Lanes 4r + c for r = 0..7 hold the same query column c: reduce across r.
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 8));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 16));
}

__device__ __forceinline__ float warp_sum_over_rows(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 4);
  x += __shfl_xor_sync(0xffffffffu, x, 8);
  return x + __shfl_xor_sync(0xffffffffu, x, 16);
}

#if SPLIT
// kernel.py's _split_plan, the same integer arithmetic: both kernels and the Triton
// reduction must agree on every sequence's split count without storing it.
__device__ __forceinline__ int splits_of(i64 len, i64 target, i64 total, int split_cap) {
  i64 tiles = (len + TILE - 1) / TILE;
  i64 n = (len * target + total - 1) / total;
  n = n < tiles ? n : tiles;
  n = n < split_cap ? n : split_cap;
  return (int)(n > 1 ? n : 1);
}

// Tokens [start, end) of split `split` of n in a sequence of len tokens: kernel.py's split
// bounds, whole TILEs but the last.
__device__ __forceinline__ void split_range(int len, int n, int split, int& start, int& end) {
  const i64 tiles = (len + TILE - 1) / TILE;
  const i64 lo = (split * tiles / n) * TILE, hi = ((split + 1) * tiles / n) * TILE;
  start = (int)lo;
  end = (int)(hi < len ? hi : len);
}

// The chunked plan (lengths differ and the caller forced a split count; else FLAT's plan below),
// kernel.py's chunked_plan: every sequence is cut into chunks
// of one size, `chunk` tokens (a multiple of TILE, about total / target), and a remainder.
// Items are all the full chunks first, in sequence order, then the remainders from longest
// to shortest (sequence order among equals; plain sequence order above RANK_MAX sequences).
// A slot that frees up late then takes the shortest work left, where a proportional split
// left the last wave 0.5-1 chunk uneven (NOTES.md, v10). A sequence too long for split_cap
// chunks gets longer ones.
__device__ __forceinline__ int chunk_of(int len, int chunk, int split_cap) {
  const int tiles = (len + TILE - 1) / TILE;
  const int least = TILE * ((tiles + split_cap - 1) / split_cap);
  return chunk > least ? chunk : least;
}

// Tokens left after the full chunks, or -1 when the sequence has no remainder item. A
// length-0 sequence has one, of 0 tokens: its item writes the zero row.
__device__ __forceinline__ int remainder_of(int len, int chunk, int split_cap) {
  const int rest = len % chunk_of(len, chunk, split_cap);
  return rest > 0 || len == 0 ? rest : -1;
}

// What every item lookup needs, computed once per program: the plan's target, total and
// chunk, and this thread's contiguous run of sequences with the items before it.
struct Plan {
  i64 target, total;
  int b0, b1;    // this thread's sequences
  int excl;      // full chunks of all sequences before b0 (equal lengths: unused)
  int count;     // full chunks of b0..b1-1
  int rexcl;     // remainder items of all sequences before b0
  int rcount;    // remainder items of b0..b1-1
  int full;      // full chunks in the whole plan: the remainder items start here
  int items;     // items in the whole plan: items at or past this have no work
  int chunk;     // the ragged plan's chunk
  int len;       // every sequence's length when they are all equal, else -1
  int each;      // ... and every sequence's split count then
};

__device__ Plan make_plan(const int* __restrict__ seq_lens, int batch, int target_uniform, int target_ragged,
                          int split_cap, int* __restrict__ rem_of) {
  __shared__ i64 warp_sum[WARPS];
  __shared__ int warp_max[WARPS], warp_min[WARPS], warp_count[WARPS], warp_rcount[WARPS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  Plan plan;

  i64 sum = 0;
  int longest = 0, shortest = 0x7fffffff;
  for (int b = tid; b < batch; b += THREADS) {
    int len = seq_lens[b];
    sum += len;
    longest = max(longest, len);
    shortest = min(shortest, len);
  }
  for (int o = 16; o > 0; o >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
    longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, o));
    shortest = min(shortest, __shfl_xor_sync(0xffffffffu, shortest, o));
  }
  if (lane == 0) {
    warp_sum[warp] = sum;
    warp_max[warp] = longest;
    warp_min[warp] = shortest;
  }
  __syncthreads();
  sum = 0;
  longest = 0;
  shortest = 0x7fffffff;
  for (int w = 0; w < WARPS; ++w) {
    sum += warp_sum[w];
    longest = max(longest, warp_max[w]);
    shortest = min(shortest, warp_min[w]);
  }
  plan.total = sum > 1 ? sum : 1;
  plan.target = longest == shortest ? target_uniform : target_ragged;
  if (longest == shortest) {
    // Equal lengths: every sequence has the same split count, so item i is split i % n of
    // sequence i / n, with no scan and no second barrier, and the items past the plan (the
    // grid is sized for a ragged one) exit after one barrier (NOTES.md, v7).
    plan.len = longest;
    plan.each = splits_of(longest, plan.target, plan.total, split_cap);
    plan.items = batch * plan.each;
    return plan;
  }
  plan.len = -1;
  plan.chunk = TILE * (int)max((i64)1, (plan.total + plan.target * TILE - 1) / (plan.target * TILE));

  // Each thread owns a contiguous run of sequences; exclusive scans of the runs' full chunks
  // and remainder items tell which thread's run holds an item.
  const int per = (batch + THREADS - 1) / THREADS;
  plan.b0 = min(tid * per, batch);
  plan.b1 = min(plan.b0 + per, batch);
  plan.count = plan.rcount = 0;
  for (int b = plan.b0; b < plan.b1; ++b) {
    const int len = seq_lens[b], rest = remainder_of(len, plan.chunk, split_cap);
    plan.count += len / chunk_of(len, plan.chunk, split_cap);
    plan.rcount += rest >= 0;
    if (batch <= RANK_MAX) rem_of[b] = rest;
  }
  int incl = plan.count, rincl = plan.rcount;
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, incl, o), rup = __shfl_up_sync(0xffffffffu, rincl, o);
    if (lane >= o) {
      incl += up;
      rincl += rup;
    }
  }
  if (lane == 31) {
    warp_count[warp] = incl;
    warp_rcount[warp] = rincl;
  }
  __syncthreads();  // also publishes rem_of
  plan.excl = incl - plan.count;
  plan.rexcl = rincl - plan.rcount;
  plan.full = 0;
  int rems = 0;
  for (int w = 0; w < WARPS; ++w) {
    if (w < warp) {
      plan.excl += warp_count[w];
      plan.rexcl += warp_rcount[w];
    }
    plan.full += warp_count[w];
    rems += warp_rcount[w];
  }
  plan.items = plan.full + rems;
  return plan;
}

// The (sequence, token range) of work item `item` < plan.items; direct when it is the
// sequence's only item.
__device__ void find_split(const Plan& plan, int item, const int* __restrict__ seq_lens, int split_cap,
                           const int* __restrict__ rem_of, int batch, int& seq, int& start, int& end, bool& direct) {
  if (plan.len >= 0) {
    seq = item / plan.each;
    split_range(plan.len, plan.each, item % plan.each, start, end);
    direct = plan.each == 1;
    return;
  }
  __shared__ int found[4];
  if (item < plan.full) {
    if (item >= plan.excl && item < plan.excl + plan.count) {
      int first = plan.excl;
      for (int b = plan.b0; b < plan.b1; ++b) {
        const int len = seq_lens[b], size = chunk_of(len, plan.chunk, split_cap), full = len / size;
        if (item < first + full) {
          found[0] = b;
          found[1] = (item - first) * size;
          found[2] = found[1] + size;
          found[3] = full == 1 && remainder_of(len, plan.chunk, split_cap) < 0;
          break;
        }
        first += full;
      }
    }
  } else {
    // The remainder of rank `rank`: the rank-th longest, ties in sequence order.
    const int rank = item - plan.full;
    int before = plan.rexcl;
    for (int b = plan.b0; b < plan.b1; ++b) {
      const int len = seq_lens[b], rest = remainder_of(len, plan.chunk, split_cap);
      if (rest < 0) continue;
      int mine = before++;
      if (batch <= RANK_MAX) {
        mine = 0;
        for (int other = 0; other < batch; ++other) {
          const int r = rem_of[other];
          mine += r > rest || (r == rest && other < b);
        }
      }
      if (mine == rank) {
        const int size = chunk_of(len, plan.chunk, split_cap);
        found[0] = b;
        found[1] = len - rest;
        found[2] = len;
        found[3] = len < size;
        break;
      }
    }
  }
  __syncthreads();
  seq = found[0];
  start = found[1];
  end = found[2];
  direct = found[3];
}

#if FLAT
// The flat plan (kernel.flat_plan is the same plan in Python). Unequal lengths: every
// sequence is `weight` units plus one per tile of its tokens (a length-0 sequence: one unit),
// the batch's units are laid end to end, U in all, and program p of p_eff takes units
// [p U / p_eff, (p + 1) U / p_eff): every program the same work to a unit, whatever the
// lengths, with sequence boundaries inside a program's range. A sequence's weight units stand
// for what each piece of work costs at its two ends (the queries' load, the warps' merge and
// the stores) and hold no tokens. Equal lengths keep the proportional closed form, where one
// item per split and no boundary inside a program was faster.
struct FlatRange {
  int each;      // equal lengths: splits per sequence, and len their length; else 0
  int len;
  i64 t0, t1;    // unequal: this program's units
  i64 first;     // ... the first unit of sequence next_seq, the one holding t0
  int next_seq;
  int programs;  // ... the plan's programs (the grid may have more, for equal lengths)
  int p_eff;     // ... programs with work: at most `programs`, at least min_units units each
};

// The batch's units, U: flat_range writes it once per program, and the fold (below) reads it
// after the loop, so no register holds it through the loop.
__shared__ i64 flat_total;

__device__ __forceinline__ i64 flat_units(int len, int weight) {
  return len > 0 ? (len + TILE - 1) / TILE + weight : 1;
}

__device__ FlatRange flat_range(const int* __restrict__ seq_lens, int batch, int target_uniform, int split_cap,
                                int programs, int min_units, int weight) {
  __shared__ i64 warp_units[WARPS];
  __shared__ int warp_max[WARPS], warp_min[WARPS];
  __shared__ i64 found_first;
  __shared__ int found_seq;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (batch + THREADS - 1) / THREADS;
  const int b0 = min(tid * per, batch), b1 = min(b0 + per, batch);
  i64 mine = 0;
  int longest = 0, shortest = 0x7fffffff;
  for (int b = b0; b < b1; ++b) {
    const int len = seq_lens[b];
    mine += flat_units(len, weight);
    longest = max(longest, len);
    shortest = min(shortest, len);
  }
  i64 incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const i64 up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
    longest = max(longest, __shfl_xor_sync(0xffffffffu, longest, o));
    shortest = min(shortest, __shfl_xor_sync(0xffffffffu, shortest, o));
  }
  if (lane == 31) warp_units[warp] = incl;
  if (lane == 0) {
    warp_max[warp] = longest;
    warp_min[warp] = shortest;
  }
  __syncthreads();
  FlatRange fr;
  i64 excl = incl - mine, total = 0;
  for (int w = 0; w < WARPS; ++w) {
    if (w < warp) excl += warp_units[w];
    total += warp_units[w];
    longest = max(longest, warp_max[w]);
    shortest = min(shortest, warp_min[w]);
  }
  if (longest == shortest) {
    fr.len = longest;
    fr.each = splits_of(longest, target_uniform, (i64)longest * batch > 1 ? (i64)longest * batch : 1, split_cap);
    return fr;
  }
  fr.each = 0;
  if (tid == 0) flat_total = total;  // read after the __syncthreads below
  const i64 wanted = (total + min_units - 1) / min_units;
  fr.programs = programs;
  fr.p_eff = (int)(wanted < programs ? wanted : programs);
  const i64 p = blockIdx.y;
  fr.t0 = p * total / fr.p_eff;
  fr.t1 = (p + 1) * total / fr.p_eff;
  if (p < fr.p_eff && fr.t0 >= excl && fr.t0 < excl + mine) {
    i64 at = excl;
    for (int b = b0; b < b1; ++b) {
      const i64 n = flat_units(seq_lens[b], weight);
      if (fr.t0 < at + n) {
        found_seq = b;
        found_first = at;
        break;
      }
      at += n;
    }
  }
  __syncthreads();
  fr.next_seq = found_seq;
  fr.first = found_first;
  return fr;
}

// The k-th piece of this program's work, false past the last. Equal lengths: item
// blockIdx.y + k gridDim.y, stored at row item. Unequal: the program's sequences in order;
// the first may have begun in an earlier program (its row is blockIdx.y), the last may go on
// in a later one (row programs + blockIdx.y), and those between are whole.
__device__ __forceinline__ bool next_piece(FlatRange& fr, int k, const int* __restrict__ seq_lens, int batch,
                                           int weight, int& seq, int& start, int& end, bool& direct, int& row) {
  if (fr.each > 0) {
    const int item = blockIdx.y + k * gridDim.y;
    if (item >= batch * fr.each) return false;
    seq = item / fr.each;
    split_range(fr.len, fr.each, item % fr.each, start, end);
    direct = fr.each == 1;
    row = item;
    return true;
  }
  if ((int)blockIdx.y >= fr.p_eff || fr.first >= fr.t1) return false;
  seq = fr.next_seq++;
  const int len = seq_lens[seq];
  const i64 first = fr.first, last = first + flat_units(len, weight);
  const i64 a = first > fr.t0 ? first : fr.t0, b = last < fr.t1 ? last : fr.t1;
  const i64 skip = len > 0 ? weight : 0;  // the weight units come first and hold no tokens
  const i64 lo = a - first - skip, hi = b - first - skip;
  start = lo > 0 ? (int)(lo * TILE) : 0;
  end = hi > 0 ? (int)(hi * TILE < len ? hi * TILE : len) : 0;
  if (start > end) start = end;
  direct = a == first && b == last;
  row = a == fr.t0 ? (int)blockIdx.y : fr.programs + (int)blockIdx.y;
  fr.first = last;
  return true;
}

#if FOLD
// The fold (kernel.fold_groups is the same grouping in Python). A sequence cut into n > FOLD
// pieces left the reduction n rows to combine, FOLD at a time, one dependent step of about
// 1 us each after the decode grid has ended: 4 steps for the one-long batch's 104 pieces
// (NOTES.md, v15 and v16). Here its pieces are taken in groups of g = ceil(n / FOLD)
// consecutive pieces, and the program that finishes a group's last piece combines the
// group's rows into the row of its first piece, while the other programs still run. The
// reduction then reads ceil(n / g) <= FOLD rows, in one step. Nothing waits: each program
// counts itself in, and only the last of a group reads the others' rows.
//
// Piece j of the sequence is program p0 + j's; its row is p0 + j for j > 0 (the piece starts
// that program's range) and the program's own row for j = 0 (p0, or programs + p0 if the
// sequence began inside p0's range), as next_piece gives them. Rows are unique to a piece,
// so a group's count is indexed by its first row.
struct Fold {
  int members;    // pieces in this piece's group; 0: the sequence is not folded
  int first_row;  // the row the group's combination goes to: its first piece's
  int base;       // the program holding that piece; member i > 0 is row base + i
};

// The fold of the piece this program has just finished: `last` is the sequence's end unit
// (fr.first after next_piece), len its length; p_eff and programs are fr's.
__device__ __forceinline__ Fold fold_of(i64 last, int p_eff, int programs, int len, int weight) {
  const i64 total = flat_total, units = flat_units(len, weight), first = last - units;
  Fold f{0, 0, 0};
  // A sequence of U units spans n < (U - 1) p_eff / total + 2 programs (each holds at least
  // total / p_eff units), so where (U - 1) p_eff <= (FOLD - 1) total it has at most FOLD
  // pieces: most pieces return here, before the 64-bit divisions.
  if ((units - 1) * p_eff <= (i64)(FOLD - 1) * total) return f;
  const int p0 = (int)(((first + 1) * p_eff + total - 1) / total - 1);  // as kernel._flat_rows
  const int n = (int)((last * p_eff + total - 1) / total - 1) - p0 + 1;
  if (n <= FOLD) return f;
  const int g = (n + FOLD - 1) / FOLD, k = ((int)blockIdx.y - p0) / g;
  f.members = min(g, n - k * g);
  f.base = p0 + k * g;
  f.first_row = k > 0 ? f.base : (p0 * total / p_eff == first ? p0 : programs + p0);
  return f;
}

// Run by the program whose piece completed its group, after the counter's fence: for each of
// the program's query heads, one warp combines the group's rows (w_i = exp2(lse_i - max lse),
// as the reduction weighs them; an empty piece, lse = -inf, weighs 0 and its row is not read)
// into the first row. The members' rows were written by other SMs, so they are read from L2
// (ld.cg).
__device__ __forceinline__ void combine_group(float* __restrict__ part_out, float* __restrict__ part_lse,
                                              Fold f, int group_size) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_q_heads = gridDim.x * HEADS * group_size;
  for (int h = warp; h < HEADS * group_size; h += WARPS) {
    const int head = blockIdx.x * HEADS * group_size + h;  // the program's query heads
    float m = NEG_INF;
    for (int i = 0; i < f.members; ++i) {
      m = fmaxf(m, __ldcg(part_lse + (i64)(i ? f.base + i : f.first_row) * num_q_heads + head));
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float w_sum = 0.f;
    for (int i = 0; m != NEG_INF && i < f.members; ++i) {
      const i64 row = (i64)(i ? f.base + i : f.first_row) * num_q_heads + head;
      const float lse = __ldcg(part_lse + row);
      if (lse == NEG_INF) continue;
      const float w = exp2f(lse - m);
      const float4 x = __ldcg(reinterpret_cast<const float4*>(part_out + row * HEAD_DIM) + lane);
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
      w_sum += w;
    }
    const i64 row = (i64)f.first_row * num_q_heads + head;
    const float inv = w_sum > 0.f ? 1.f / w_sum : 0.f;
    reinterpret_cast<float4*>(part_out + row * HEAD_DIM)[lane] =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    __syncwarp();  // every lane has read the first row's lse before lane 0 replaces it
    if (lane == 0) part_lse[row] = w_sum > 0.f ? m + __log2f(w_sum) : NEG_INF;
  }
}

// After a split piece of an unequal-length batch is stored: count it into its group, and
// combine the group if it was the last in. Called by the whole program (it holds barriers).
// A call, not inlined: inlined, every flat variant spilled 12 bytes under the 128-register
// budget, and calling the combine alone from the loop still spilled 4 (the CPU tests compile
// every specialisation and refuse spills).
__device__ __noinline__ void fold_piece(float* __restrict__ part_out, float* __restrict__ part_lse,
                                        int* __restrict__ fold_counts, i64 last, int p_eff, int programs, int len,
                                        int weight, int group_size) {
  const Fold f = fold_of(last, p_eff, programs, len, weight);
  if (f.members < 2) return;
  __shared__ int completes;
  __syncthreads();  // the program's rows are stored ...
  if (threadIdx.x == 0) {
    __threadfence();  // ... and visible to the GPU before it counts itself in
    int* count = fold_counts + (i64)blockIdx.x * 2 * programs + f.first_row;
    completes = atomicAdd(count, 1) == f.members - 1;
    if (completes) {
      *count = 0;  // every member has counted: ready for the next launch
      __threadfence();  // the other members' rows are read after their counts
    }
  }
  __syncthreads();
  if (completes) combine_group(part_out, part_lse, f, group_size);
}
#endif
#endif
#endif

// A warp's running softmax over its tokens: O^T tiles, and the max and sum per query column.
struct Softmax {
  float acc[8][4];  // O^T tile i: rows 16r+2i (regs 0, 1) and 16r+2i+1 (2, 3); columns 2c, 2c+1
  float m0, m1;     // running max of queries 2c and 2c+1 (the same in every lane of a column)
  float l0, l1;     // this thread's share of the running sums
};

// A thread's 8 loads per 16-token tile: K of tile rows r and r+8, dimensions 16c.. and 64+16c..
// (slots 0-3), and V of tile rows 2c, 2c+1, 2c+8, 2c+9, dimensions 16r.. (slots 4-7).
__device__ __forceinline__ int slot_token(int j, int r, int c) {
  return j < 4 ? r + 8 * (j >> 1) : 2 * c + (j & 1) + 8 * ((j - 4) >> 1);
}

__device__ __forceinline__ int slot_dim(int j, int r, int c) {
  return j < 4 ? ((j & 1) ? 64 + 16 * c : 16 * c) : 16 * r;
}

// Where one KV head's rows are, and where a thread's first K and V bytes sit in a tile.
struct Rows {
  const unsigned char* k_head;
  const unsigned char* v_head;
  const int* table_row;
  int end;
  i64 stride_cb;
  int k_off, v_off;  // row r, dimension 16c; row 2c, dimension 16r
};

__device__ __forceinline__ Vec16 load16(const unsigned char* p) { return *reinterpret_cast<const Vec16*>(p); }

// The 16-token tile at tok0 (a multiple of 16) into kv (slots 0-3) and vv (4-7); rows at
// or past `end` read as zeros and are never loaded (they may hold another sequence's data).
__device__ __forceinline__ void fetch_tile(Vec16 (&kv)[2][2], Vec16 (&vv)[4], const Rows& rows, int tok0, int r,
                                           int c) {
  Vec16 got[8];
#if BLOCK_SIZE >= 16
  // A tile never crosses a block: one table entry and one 64-bit product per tile. The
  // thread's K rows r, r+8 and V rows 2c, 2c+1, 2c+8, 2c+9 are then fixed distances from
  // two pointers, and with the token stride known when compiling they are immediates.
  const i64 base = (i64)rows.table_row[tok0 / BLOCK_SIZE] * rows.stride_cb + (tok0 % BLOCK_SIZE) * STRIDE_CT;
  const unsigned char* kp = rows.k_head + base + rows.k_off;
  const unsigned char* vp = rows.v_head + base + rows.v_off;
  const int at[8] = {0, 64, 8 * STRIDE_CT, 8 * STRIDE_CT + 64, 0, STRIDE_CT, 8 * STRIDE_CT, 9 * STRIDE_CT};
  if (tok0 + 16 <= rows.end) {
#pragma unroll
    for (int j = 0; j < 8; ++j) got[j] = load16((j < 4 ? kp : vp) + at[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      got[j] = Vec16{{0u, 0u, 0u, 0u}};
      if (tok0 + slot_token(j, r, c) < rows.end) got[j] = load16((j < 4 ? kp : vp) + at[j]);
    }
  }
#else
  // Blocks of 1 or 8 tokens: a table entry per token.
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int tok = tok0 + slot_token(j, r, c);
    got[j] = Vec16{{0u, 0u, 0u, 0u}};
    if (tok < rows.end) {
      const i64 off = (i64)rows.table_row[tok / BLOCK_SIZE] * rows.stride_cb + (i64)(tok % BLOCK_SIZE) * STRIDE_CT;
      got[j] = load16((j < 4 ? rows.k_head : rows.v_head) + off + slot_dim(j, r, c));
    }
  }
#endif
#pragma unroll
  for (int j = 0; j < 4; ++j) kv[j >> 1][j & 1] = got[j];
#pragma unroll
  for (int j = 0; j < 4; ++j) vv[j] = got[4 + j];
}

// --8<-- [start:step]
// One chunk of CHUNK tokens starting at t: scores, the online softmax, and P.V.
__device__ __forceinline__ void step(Softmax& st, const Vec16 (&kv)[MT][2][2], const Vec16 (&vv)[MT][4],
                                     const u32 (&qf)[16], int t, int end, float score_scale, int r, int c) {
  // S^T = K Q^T: rows are tokens t + 16mt + r (regs 0, 1) and + 8 (2, 3). Two accumulators
  // per tile halve the chain of dependent products.
  float s[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float odd[4] = {0.f, 0.f, 0.f, 0.f};
    s[mt][0] = s[mt][1] = s[mt][2] = s[mt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 8; ++ks) {
      const u32 wa = kv[mt][0][ks / 4].w[ks % 4], wb = kv[mt][1][ks / 4].w[ks % 4];
      mma_16816((ks & 1) ? odd : s[mt], e4m3x2_to_f16x2(wa), e4m3x2_to_f16x2(wb), e4m3x2_hi_to_f16x2(wa),
                e4m3x2_hi_to_f16x2(wb), qf[2 * ks], qf[2 * ks + 1]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) s[mt][j] = (s[mt][j] + odd[j]) * score_scale;
  }
  if (t + CHUNK > end) {  // the sequence's last chunk: a masked token weighs exactly 0
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (t + 16 * mt + r + 8 * (j >> 1) >= end) s[mt][j] = NEG_INF;
      }
    }
  }
  float tile_m0 = NEG_INF, tile_m1 = NEG_INF;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    tile_m0 = fmaxf(tile_m0, fmaxf(s[mt][0], s[mt][2]));
    tile_m1 = fmaxf(tile_m1, fmaxf(s[mt][1], s[mt][3]));
  }
  // Finite: token t is in range, and every lane of a column sees its row through the max.
  const float new_m0 = fmaxf(st.m0, warp_max_over_rows(tile_m0));
  const float new_m1 = fmaxf(st.m1, warp_max_over_rows(tile_m1));
  // After the first chunks the running max rarely moves: rescale only when it did.
  if (__any_sync(0xffffffffu, new_m0 > st.m0 || new_m1 > st.m1)) {
    const float alpha0 = exp2_approx(st.m0 - new_m0), alpha1 = exp2_approx(st.m1 - new_m1);  // 0 at first
    st.l0 *= alpha0;
    st.l1 *= alpha1;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      st.acc[i][0] *= alpha0;
      st.acc[i][1] *= alpha1;
      st.acc[i][2] *= alpha0;
      st.acc[i][3] *= alpha1;
    }
    st.m0 = new_m0;
    st.m1 = new_m1;
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const float p0 = exp2_approx(s[mt][0] - st.m0), p1 = exp2_approx(s[mt][1] - st.m1);
    const float p2 = exp2_approx(s[mt][2] - st.m0), p3 = exp2_approx(s[mt][3] - st.m1);
    st.l0 += p0 + p2;
    st.l1 += p1 + p3;
    // P^T for O^T = V^T P^T: tokens 2c, 2c+1 (b0) and 2c+8, 2c+9 (b1) of query r.
    const u32 b0 = transpose_8x8(pack_f16x2(p0, p1)), b1 = transpose_8x8(pack_f16x2(p2, p3));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      // Bytes 2i, 2i+1 (mod 4) of word i / 2: dimension 16r + 2i (low half) and 16r + 2i + 1 (high).
      const u32 sel = (i & 1) ? 0x7362u : 0x5140u;
      const u32 x01 = byte_perm(vv[mt][0].w[i / 2], vv[mt][1].w[i / 2], sel);
      const u32 x23 = byte_perm(vv[mt][2].w[i / 2], vv[mt][3].w[i / 2], sel);
      mma_16816(st.acc[i], e4m3x2_to_f16x2(x01), e4m3x2_hi_to_f16x2(x01), e4m3x2_to_f16x2(x23),
                e4m3x2_hi_to_f16x2(x23), b0, b1);
    }
  }
}
// --8<-- [end:step]

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) paged_decode_fp8(
    const u16* __restrict__ q,               // (B, Hq, 128) fp16 or bf16
    const unsigned char* __restrict__ k_cache,  // (num_blocks, BLOCK_SIZE, Hkv, 128) e4m3
    const unsigned char* __restrict__ v_cache,  // the same shape and strides
    const int* __restrict__ block_tables,    // (B, max_blocks)
    const int* __restrict__ seq_lens,        // (B,)
    const float* __restrict__ k_scale, const float* __restrict__ v_scale,
    u16* __restrict__ out,                   // (B, Hq, 128), q's dtype
    float* __restrict__ part_out,            // (max_items, Hq, 128) fp32, as kernel.py's
    float* __restrict__ part_lse,            // (max_items, Hq) fp32, log2 units
    int* __restrict__ fold_counts,           // FOLD: (head groups, 2 x flat_programs) int32, zero between launches
    int batch, int group_size, int target_uniform, int target_ragged, int split_cap, int flat_programs,
    int min_units, int unit_weight, float qk_scale,
    i64 stride_qb, i64 stride_qh, i64 stride_cb, i64 stride_ch, i64 stride_tb, i64 stride_ob,
    i64 stride_oh) {
  // Warp w of the program serves KV head blockIdx.x * HEADS + w % HEADS: the program reads every
  // head of its tokens, whole 16-KB blocks of an 8-head pool (NOTES.md, v9). With WPH = 2 the
  // head's second warp (part 1) takes every other chunk of the split.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int part = warp / HEADS;
  const int kv_head = blockIdx.x * HEADS + warp % HEADS;
  const int num_q_heads = gridDim.x * HEADS * group_size;
  const int r = lane >> 2, c = lane & 3;

#if SPLIT
#if __CUDA_ARCH__ >= 900
  // The reduction kernel may be launched now; its griddepcontrol.wait still waits for this grid.
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  // One item per program, as in kernel.py: the grid is sized for the worst plan and the
  // items past this plan's end exit here. (A grid of one program per slot, each looping
  // over items blockIdx.y + k * gridDim.y, skipped those launches but balanced ragged
  // batches worse: 274.1 against 254.5 us on the lognormal batch; NOTES.md, v6.)
#if FLAT
  FlatRange fr = flat_range(seq_lens, batch, target_uniform, split_cap, flat_programs, min_units, unit_weight);
  for (int k = 0;; ++k) {
    int seq, start, end, item;
    bool direct;
    if (!next_piece(fr, k, seq_lens, batch, unit_weight, seq, start, end, direct, item)) break;
#else
  __shared__ int rem_of[RANK_MAX];  // each sequence's remainder (-1: none), to rank them
  const Plan plan = make_plan(seq_lens, batch, target_uniform, target_ragged, split_cap, rem_of);
  for (int item = blockIdx.y; item < plan.items; item += gridDim.y) {
    int seq, start, end;
    bool direct;
    find_split(plan, item, seq_lens, split_cap, rem_of, batch, seq, start, end, direct);
#endif
#else
  {
    const int item = blockIdx.y, seq = item, start = 0, end = seq_lens[seq];
    const bool direct = true;
#endif
    // Query r of the group (zero past the group), dimensions 16c..16c+15 and 64+16c..64+16c+15.
    u32 qf[16];
    {
      Vec16 parts[4] = {};
      if (r < group_size) {
        const u16* row = q + seq * stride_qb + (i64)(kv_head * group_size + r) * stride_qh;
        const int dims[4] = {16 * c, 16 * c + 8, 64 + 16 * c, 64 + 16 * c + 8};
#pragma unroll
        for (int j = 0; j < 4; ++j) parts[j] = *reinterpret_cast<const Vec16*>(row + dims[j]);
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) qf[j] = q_pair_f16(parts[j / 4].w[j % 4]);
    }

    const float score_scale = qk_scale * *k_scale;  // softmax scale x log2(e) x K's scale
    Softmax state;
#pragma unroll
    for (int i = 0; i < 8; ++i) state.acc[i][0] = state.acc[i][1] = state.acc[i][2] = state.acc[i][3] = 0.f;
    state.m0 = state.m1 = NEG_INF;
    state.l0 = state.l1 = 0.f;
    const Rows rows{k_cache + kv_head * stride_ch, v_cache + kv_head * stride_ch, block_tables + seq * stride_tb,
                    end, stride_cb, r * STRIDE_CT + 16 * c, 2 * c * STRIDE_CT + 16 * r};

    for (int t = start + part * CHUNK; t < end; t += WPH * CHUNK) {
      Vec16 kv[MT][2][2], vv[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) fetch_tile(kv[mt], vv[mt], rows, t + 16 * mt, r, c);
      step(state, kv, vv, qf, t, end, score_scale, r, c);
    }

    // The warp's result is its head's: thread (r, c) holds dimensions 16r..16r+15 of queries
    // 2c and 2c+1 (O^T tile i, rows 16r+2i and 16r+2i+1), and the column's sum after the
    // reduction over r. A length-0 sequence has l = 0: it stores 0 and lse = -inf.
    float l0 = warp_sum_over_rows(state.l0), l1 = warp_sum_over_rows(state.l1);
#if WPH == 2
    // The head's part-1 warp hands its state to the part-0 warp, which merges and stores.
    // [head][value][lane]: conflict-free. A part that saw no token has m = -inf, l = 0.
    __shared__ float peer[HEADS][36][32];
    float* mine = &peer[warp % HEADS][0][lane];
    if (part == 1) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j) mine[(4 * i + j) * 32] = state.acc[i][j];
      }
      mine[32 * 32] = state.m0;
      mine[33 * 32] = state.m1;
      mine[34 * 32] = l0;
      mine[35 * 32] = l1;
    }
    __syncthreads();
    if (part == 0) {
      const float m0 = fmaxf(state.m0, mine[32 * 32]), m1 = fmaxf(state.m1, mine[33 * 32]);
      // exp2(-inf - m) = 0 for a finite m; both -inf leaves the zeros as they are.
      const float a0 = m0 == NEG_INF ? 0.f : exp2_approx(state.m0 - m0);
      const float a1 = m1 == NEG_INF ? 0.f : exp2_approx(state.m1 - m1);
      const float b0 = m0 == NEG_INF ? 0.f : exp2_approx(mine[32 * 32] - m0);
      const float b1 = m1 == NEG_INF ? 0.f : exp2_approx(mine[33 * 32] - m1);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        state.acc[i][0] = state.acc[i][0] * a0 + mine[(4 * i) * 32] * b0;
        state.acc[i][1] = state.acc[i][1] * a1 + mine[(4 * i + 1) * 32] * b1;
        state.acc[i][2] = state.acc[i][2] * a0 + mine[(4 * i + 2) * 32] * b0;
        state.acc[i][3] = state.acc[i][3] * a1 + mine[(4 * i + 3) * 32] * b1;
      }
      l0 = l0 * a0 + mine[34 * 32] * b0;
      l1 = l1 * a1 + mine[35 * 32] * b1;
      state.m0 = m0;
      state.m1 = m1;
    }
#endif
    const float out_scale = *v_scale;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int g = 2 * c + half;
      if (g >= group_size || part != 0) continue;
      const float l = half ? l1 : l0, m = half ? state.m1 : state.m0;
      const float inv = l > 0.f ? out_scale / l : 0.f;
      float v[16];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[2 * i] = state.acc[i][half] * inv;
        v[2 * i + 1] = state.acc[i][2 + half] * inv;
      }
      const int head = kv_head * group_size + g;
      if (direct) {
        Vec16 packed[2];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          packed[j / 4].w[j % 4] = (u32)to_output(v[2 * j]) | ((u32)to_output(v[2 * j + 1]) << 16);
        }
        Vec16* dst = reinterpret_cast<Vec16*>(out + seq * stride_ob + head * stride_oh + 16 * r);
        dst[0] = packed[0];
        dst[1] = packed[1];
      } else {
        const i64 row = (i64)item * num_q_heads + head;
        float4* dst = reinterpret_cast<float4*>(part_out + row * HEAD_DIM + 16 * r);
#pragma unroll
        for (int j = 0; j < 4; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
        if (r == 0) part_lse[row] = l > 0.f ? m + __log2f(l) : NEG_INF;
      }
    }
#if FLAT && FOLD
    // Uniform over the program: every warp has the same piece.
    if (fr.each == 0 && !direct) {
      fold_piece(part_out, part_lse, fold_counts, fr.first, fr.p_eff, fr.programs, seq_lens[seq], unit_weight,
                 group_size);
    }
#endif
#if SPLIT
    __syncthreads();  // the next item's lookup reuses find_split's shared slots
#endif
  }
}
