
NORM_OF
constexpr int MOST = BRUTE_REFS;  // the most references of a cloud listed this way
const int m = query.shape[0], n = ref.shape[0], cap = limits[0], skip = limits[1];
const Real reach = radius * radius * (Real)1.0001 + (Real)1e-30;  // as sq_bound
WITHIN
auto point = [](const wp::array_t<Vec>& a, int t) -> Vec { return *(const Vec*)((const char*)a.data + (size_t)t * (size_t)a.strides[0]); };
Real dd[MOST];
wp::int64 jj[MOST];
Real cols[NDIM][MOST], d2s[MOST];  // the references a row per axis, so that each query's squares vectorise
int near[MOST];
for (int t = 0; t < n; ++t) {
    const Vec r = point(ref, t);
    for (int a = 0; a < NDIM; ++a) cols[a][t] = r[a];
}
wp::int64 p = 0;
for (int i = 0; i < m; ++i) {
    *wp::address(ptr, i) = p;
    const Vec q = point(query, i);
    bool finite = true;
    for (int a = 0; a < NDIM; ++a) finite = finite && wp::abs(q[a]) < inf;
    for (int t = 0; t < n; ++t) {  // a first cut, `within` decides
        Real s = (q[0] - cols[0][t]) * (q[0] - cols[0][t]);
        for (int a = 1; a < NDIM; ++a) s += (q[a] - cols[a][t]) * (q[a] - cols[a][t]);
        d2s[t] = s;
    }
    int candidates = 0;
    for (int t = 0; finite && t < n; ++t) {  // in index order, without a branch
        near[candidates] = t;
        candidates += d2s[t] <= reach;
    }
    int c = 0;
    for (int u = 0; u < candidates; ++u) {
        const int t = near[u];
        const Vec diff = q - point(ref, t);
        if ((skip && t == i) || !within(diff)) continue;
        const Real d = norm_of(diff);
        int at = c++;
        for (; at > 0 && dd[at - 1] > d; --at) { dd[at] = dd[at - 1]; jj[at] = jj[at - 1]; }  // ties keep index order
        dd[at] = d;
        jj[at] = t;
    }
    *wp::address(counts, i) = c;
    const int kept = c < cap ? c : cap;
    for (int t = 0; t < kept; ++t) {
        *wp::address(distance, p + t) = dd[t];
        *wp::address(edges, p + t) = jj[t];
    }
    p += kept;
}
*wp::address(ptr, m) = p;
for (int i = 0; i < m; ++i)  // the centres right after the neighbours, once their number is known
    for (wp::int64 t = *wp::address(ptr, i), e = *wp::address(ptr, i + 1); t < e; ++t) *wp::address(edges, p + t) = i;
