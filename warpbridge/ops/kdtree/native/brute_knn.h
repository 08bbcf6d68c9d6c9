// The k nearest of each query, sorted by insertion (ties to the smaller index: references come
// in index order and a tie never moves ahead): in a local array where k <= KMAX on the CPU,
// else in the output row.
// @start
const int k = dist.shape[1];
#if defined(__CUDA_ARCH__)
constexpr int KMAX = 1;
const bool local = false;
#else
constexpr int KMAX = 64;
const bool local = k <= KMAX;
#endif
Real near_d[8][KMAX];
wp::int64 near_j[8][KMAX];
Real* sd[8];
wp::int64* sj[8];
int found[8];
for (int a = 0; a < 8; ++a) {
    sd[a] = local ? near_d[a] : (Real*)((char*)dist.data + (size_t)(i0 + (a < qb ? a : 0)) * dist.strides[0]);
    sj[a] = local ? near_j[a] : (wp::int64*)((char*)idx.data + (size_t)(i0 + (a < qb ? a : 0)) * idx.strides[0]);
    bound[a] = (Real)INFINITY;
    found[a] = 0;
}
// @visit
if (d < bound[a]) {  // the bound may have come down since this block's compare
    int n = found[a], pos = n < k ? n : k - 1;
    while (pos > 0 && sd[a][pos - 1] > d) { sd[a][pos] = sd[a][pos - 1]; sj[a][pos] = sj[a][pos - 1]; --pos; }
    sd[a][pos] = d;
    sj[a][pos] = j;
    if (n < k) ++n;
    if (n == k) bound[a] = sd[a][k - 1];
    found[a] = n;
}
// @end
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
