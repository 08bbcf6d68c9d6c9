
typedef REAL Real;
const wp::vec3i blk = *wp::address(blocks, b);
const int i0 = blk[0], qb = blk[1], cloud = blk[2];
const int D = query.shape[1];
const int j0 = (int)*wp::address(ref_ptr, cloud), j1 = (int)*wp::address(ref_ptr, cloud + 1);
Real bound[8];  // a query's candidates: the references closer than its bound (BOUND_CMP)
BLOCK_START
#if defined(__CUDA_ARCH__)
constexpr int W = 32;  // a thread's block is one query (see _row_launches): W accumulators in registers
for (int a = 0; a < qb; ++a) {
    const Real* qrow = (const Real*)((const char*)query.data + (size_t)(i0 + a) * query.strides[0]);
    for (int jb = j0; jb < j1; jb += W) {
        const int nb = (j1 - jb) < W ? (j1 - jb) : W;
        Real acc[W];
        #pragma unroll
        for (int t = 0; t < W; ++t) acc[t] = (Real)0;
        for (int c = 0; c < D; ++c) {
            const Real* rc = (const Real*)((const char*)rt.data + (size_t)c * rt.strides[0]) + jb;
            const Real qc = qrow[c];
            #pragma unroll
            for (int t = 0; t < W; ++t) { const Real d = qc - rc[t]; acc[t] += d * d; }
        }
        #pragma unroll
        for (int t = 0; t < W; ++t) {
            const Real d = acc[t];
            if (t >= nb || !(d BOUND_CMP bound[a])) continue;  // NaN and inf too
            const int j = jb + t;
            BLOCK_VISIT
        }
    }
}
#else
#if defined(__AVX512F__)
constexpr int VB = 64, NV = 2;
#elif defined(__AVX__)
constexpr int VB = 32, NV = 1;
#else
constexpr int VB = 16, NV = 2;
#endif
typedef Real Vec __attribute__((vector_size(VB)));
constexpr int L = VB / (int)sizeof(Real), W = NV * L;
static_assert(W <= 32, "a block's candidates are the bits of one 32-bit word");
const Real* qrow[8];
for (int a = 0; a < 8; ++a)  // rows past the block's last query repeat it (computed, not kept)
    qrow[a] = (const Real*)((const char*)query.data + (size_t)(i0 + (a < qb ? a : qb - 1)) * query.strides[0]);
for (int jb = j0; jb < j1; jb += W) {
    const int nb = (j1 - jb) < W ? (j1 - jb) : W;
    Vec acc[8][NV];
    for (int a = 0; a < 8; ++a) for (int v = 0; v < NV; ++v) acc[a][v] = (Vec){};
    for (int c = 0; c < D; ++c) {
        #pragma clang fp contract(fast)
        const Real* rc = (const Real*)((const char*)rt.data + (size_t)c * rt.strides[0]) + jb;
        Vec r[NV];
        for (int v = 0; v < NV; ++v) __builtin_memcpy(&r[v], rc + v * L, sizeof(Vec));
        for (int a = 0; a < 8; ++a) {
            const Real qa = qrow[a][c];
            for (int v = 0; v < NV; ++v) { const Vec d = qa - r[v]; acc[a][v] += d * d; }
        }
    }
    for (int a = 0; a < qb; ++a) {
        Real row[W];
        __builtin_memcpy(row, acc[a], sizeof(row));
        unsigned bits = 0;
        for (int t = 0; t < W; ++t) bits |= (unsigned)(row[t] BOUND_CMP bound[a]) << t;  // NaN and inf never
        bits &= nb < 32 ? (1u << nb) - 1u : ~0u;
        while (bits) {
            const int t = __builtin_ctz(bits);
            bits &= bits - 1u;
            const Real d = row[t];
            const int j = jb + t;
            BLOCK_VISIT
        }
    }
}
#endif
BLOCK_END
