
NORM_OF
constexpr int MOST = BRUTE_REFS;  // the most references of a cloud searched this way
KNN_ROW
int c = 0;
for (int a = 0; a < NDIM; ++a) if (!(wp::abs(q[a]) < inf)) return c;
const int n = ref.shape[0];
const char* const base = (const char*)ref.data;
auto diff_to = [&](int t) -> Vec { return q - *(const Vec*)(base + (size_t)t * (size_t)ref.strides[0]); };
// Each reference nearer than the k-th found so far goes into a local row, sorted by insertion
// (in index order: a tie never moves ahead); `bound` is the k-th's square as knn_query's
// sq_bound, a first cut before the square root.
Real rd[MOST];
int rj[MOST];
Real kd = inf, bound = inf;
for (int t = 0; t < n; ++t) {
    const Real d2 = square(diff_to(t));
    if (!(d2 <= bound)) continue;
    const Real d = d2 < inf && d2 >= (Real)1e-30 ? wp::sqrt(d2) : norm_of(diff_to(t));  // as knn_query
    if (!(d < kd)) continue;
    int pos = c < k ? c : k - 1;
    for (; pos > 0 && rd[pos - 1] > d; --pos) {
        rd[pos] = rd[pos - 1];
        rj[pos] = rj[pos - 1];
    }
    rd[pos] = d;
    rj[pos] = t;
    if (c < k) ++c;
    if (c == k) {
        kd = rd[k - 1];
        bound = kd * kd * (Real)1.0001 + (Real)1e-30;
    }
}
for (int m = 0; m < c; ++m) {
    D(m) = rd[m];
    J(m) = rj[m];
}
return c;
