
typedef REAL Real;
const wp::vec3i blk = *wp::address(blocks, b);
const int i0 = blk[0], qb = blk[1], cloud = blk[2];
const int D = query.shape[1], k = dist.shape[1];
const int j0 = (int)*wp::address(ref_ptr, cloud), j1 = (int)*wp::address(ref_ptr, cloud + 1);
#if defined(__CUDA_ARCH__)
constexpr int W = 32;
Real kth[8];
int found[8];
for (int a = 0; a < qb; ++a) {
    kth[a] = (Real)INFINITY;
    found[a] = 0;
    for (int t = 0; t < k; ++t) { *wp::address(dist, i0 + a, t) = (Real)INFINITY; *wp::address(idx, i0 + a, t) = -1; }
}
for (int jb = j0; jb < j1; jb += W) {
    const int nb = (j1 - jb) < W ? (j1 - jb) : W;
    Real acc[8][W];
    for (int a = 0; a < 8; ++a) for (int c = 0; c < W; ++c) acc[a][c] = (Real)0;
    for (int c = 0; c < D; ++c) {
        const Real* rc = (const Real*)((const char*)rt.data + (size_t)c * rt.strides[0]) + jb;
        for (int a = 0; a < qb; ++a) {
            const Real qa = *wp::address(query, i0 + a, c);
            for (int t = 0; t < W; ++t) { const Real d = qa - rc[t]; acc[a][t] += d * d; }
        }
    }
    for (int a = 0; a < qb; ++a) {
        for (int t = 0; t < nb; ++t) {
            const Real d = acc[a][t];
            if (!(d < kth[a])) continue;  // NaN and inf too
            int pos = found[a] < k ? found[a] : k - 1;
            while (pos > 0 && *wp::address(dist, i0 + a, pos - 1) > d) {
                *wp::address(dist, i0 + a, pos) = *wp::address(dist, i0 + a, pos - 1);
                *wp::address(idx, i0 + a, pos) = *wp::address(idx, i0 + a, pos - 1);
                --pos;
            }
            *wp::address(dist, i0 + a, pos) = d;
            *wp::address(idx, i0 + a, pos) = (wp::int64)(jb + t);
            if (found[a] < k) ++found[a];
            if (found[a] == k) kth[a] = *wp::address(dist, i0 + a, k - 1);
        }
    }
}
for (int a = 0; a < qb; ++a) {
    for (int t = 0; t < found[a]; ++t) *wp::address(dist, i0 + a, t) = wp::sqrt(*wp::address(dist, i0 + a, t));
    if (count.shape[0] > 0) *wp::address(count, i0 + a) = found[a];
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
constexpr int L = VB / (int)sizeof(Real), W = NV * L, KMAX = 64;
static_assert(W <= 32, "a block's candidates are the bits of one 32-bit word");
const bool local = k <= KMAX;
Real kth[8], near_d[8][KMAX];
int found[8];
wp::int64 near_j[8][KMAX];
Real* sd[8];
wp::int64* sj[8];
const Real* qrow[8];
for (int a = 0; a < 8; ++a) {  // rows past the block's last query repeat it (computed, not kept)
    qrow[a] = (const Real*)((const char*)query.data + (size_t)(i0 + (a < qb ? a : qb - 1)) * query.strides[0]);
    sd[a] = local ? near_d[a] : (Real*)((char*)dist.data + (size_t)(i0 + (a < qb ? a : 0)) * dist.strides[0]);
    sj[a] = local ? near_j[a] : (wp::int64*)((char*)idx.data + (size_t)(i0 + (a < qb ? a : 0)) * idx.strides[0]);
    kth[a] = (Real)INFINITY;
    found[a] = 0;
}
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
        for (int t = 0; t < W; ++t) bits |= (unsigned)(row[t] < kth[a]) << t;  // NaN and inf never
        bits &= nb < 32 ? (1u << nb) - 1u : ~0u;
        int n = found[a];
        while (bits) {
            const int t = __builtin_ctz(bits);
            bits &= bits - 1u;
            const Real d = row[t];
            if (!(d < kth[a])) continue;
            int pos = n < k ? n : k - 1;
            while (pos > 0 && sd[a][pos - 1] > d) { sd[a][pos] = sd[a][pos - 1]; sj[a][pos] = sj[a][pos - 1]; --pos; }
            sd[a][pos] = d;
            sj[a][pos] = jb + t;
            if (n < k) ++n;
            if (n == k) kth[a] = sd[a][k - 1];
        }
        found[a] = n;
    }
}
for (int a = 0; a < qb; ++a) {
    const int n = found[a];
    Real* drow = (Real*)((char*)dist.data + (size_t)(i0 + a) * dist.strides[0]);
    wp::int64* jrow = (wp::int64*)((char*)idx.data + (size_t)(i0 + a) * idx.strides[0]);
    for (int t = 0; t < k; ++t) {
        drow[t] = t < n ? wp::sqrt(sd[a][t]) : (Real)INFINITY;
        jrow[t] = t < n ? sj[a][t] : (wp::int64)-1;
    }
    if (count.shape[0] > 0) *wp::address(count, i0 + a) = n;
}
#endif
