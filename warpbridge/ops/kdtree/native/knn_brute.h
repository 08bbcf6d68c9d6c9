
NORM_OF
constexpr int MOST = BRUTE_REFS;  // the most references of a cloud searched this way
KNN_ROW
int c = 0;
for (int a = 0; a < NDIM; ++a) if (!(wp::abs(q[a]) < inf)) return c;
const int n = ref.shape[0];
const char* const base = (const char*)ref.data;
auto diff_to = [&](int t) -> Vec { return q - *(const Vec*)(base + (size_t)t * (size_t)ref.strides[0]); };
// Every squared distance, then the k-th smallest (a quickselect on a copy): only the
// references within its bound (as knn_query's sq_bound) are ranked, so the row takes about k
// insertions instead of one for each reference nearer than the k-th found so far.
Real d2s[MOST], sel[MOST];
for (int t = 0; t < n; ++t) {
    const Real d2 = square(diff_to(t));
    d2s[t] = sel[t] = d2 == d2 ? d2 : inf;  // NaN: no neighbour (as inf)
}
Real b = inf;
if (k < n) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const Real pivot = sel[(lo + hi) >> 1];
        int x = lo, y = hi;
        while (x <= y) {
            while (sel[x] < pivot) ++x;
            while (sel[y] > pivot) --y;
            if (x <= y) { const Real s = sel[x]; sel[x] = sel[y]; sel[y] = s; ++x; --y; }
        }
        if (k - 1 <= y) hi = y;
        else if (k - 1 >= x) lo = x;
        else break;
    }
    b = sel[k - 1] * (Real)1.0001 + (Real)1e-30;
}
Real kd = inf;
wp::int64 kj = -1;
for (int t = 0; t < n; ++t) {  // in index order: a tie never moves ahead
    if (!(d2s[t] <= b)) continue;
    const Vec diff = diff_to(t);
    const Real d2 = d2s[t];
    const Real d = d2 < inf && d2 >= (Real)1e-30 ? wp::sqrt(d2) : norm_of(diff);  // as knn_query
    const wp::int64 j = t;
    if (d < kd || (d == kd && j < kj)) KNN_INSERT
}
return c;
