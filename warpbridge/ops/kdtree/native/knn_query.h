
NORM_OF
KNN_ROW
for (int a = 0; a < NDIM; ++a) if (!(wp::abs(q[a]) < inf)) return;
const int n = cloud[1];  // the cloud's points, from place cloud[0]; its nodes from cloud[2]
if (n == 0) return;
const Vec* __restrict__ P = (const Vec*)tree.points.data + cloud[0];  // the tree's arrays are packed
const wp::int32* __restrict__ O = (const wp::int32*)tree.order.data + cloud[0];
const Vec* __restrict__ LO = (const Vec*)tree.lo.data + cloud[2];
const Vec* __restrict__ HI = (const Vec*)tree.hi.data + cloud[2];
const wp::int32* __restrict__ MI = (const wp::int32*)tree.min_index.data + cloud[2];
const int depth = cloud[3];
const int leaves = 1 << depth;
auto gap = [&](int node) -> Vec {
    const Vec l = LO[node], h = HI[node];
    Vec g;
    for (int a = 0; a < NDIM; ++a) g[a] = wp::max(wp::max(l[a] - q[a], q[a] - h[a]), (Real)0);
    return g;
};
auto gap2 = [&](int node) -> Real { return square(gap(node)); };
int stack[STACK];
Real gaps[STACK];
int sp = 0, node = 1, c = 0;
// With a finite limit the list starts as if full at it: nothing farther enters or is walked
// (a radius list's closest k, d <= limit as its walk compares), and no tie at it is refused.
const bool bounded = limit < inf;
Real g2 = (Real)0, kd = bounded ? limit : inf, b = bounded ? limit * limit * (Real)1.0001 + (Real)1e-30 : inf;
wp::int64 kj = bounded ? (wp::int64)0x7fffffffffffffffLL : -1;
while (node > 0 || sp > 0) {
    if (node == 0) {
        --sp;
        node = stack[sp];
        g2 = gaps[sp];
    }
    if (c == k || bounded) {
        bool skip = g2 > b;
        if (!skip) {
            if (b < inf) {
                // sqrt(g2) is a lower bound of every point's distance in the normal range,
                // exact enough to settle a tie by index; so is a gap of 0 when the k-th
                // distance is 0 (copies of a query point: without it, 20,000 queries on
                // 200,000 copies of one point scanned every copy for each query).
                const bool tie = g2 >= (Real)1e-30 || (g2 == (Real)0 && kd == (Real)0);
                skip = tie && (wp::int64)MI[node] > kj && wp::sqrt(g2) >= kd;
            } else {  // a k-th distance whose square overflows: compare with a margin
                skip = norm_of(gap(node)) > kd * (Real)1.00001;
            }
        }
        if (skip) {
            node = 0;
            continue;
        }
    }
    if (node < leaves) {
        const int a = 2 * node;
        const Real da = gap2(a), db = gap2(a + 1);
        if (db < da || (db == da && MI[a + 1] < MI[a])) {
            stack[sp] = a; gaps[sp] = da; node = a + 1; g2 = db;
        } else {
            stack[sp] = a + 1; gaps[sp] = db; node = a; g2 = da;
        }
        ++sp;
        continue;
    }
    const int s = (int)(((wp::int64)(node - leaves) * n) >> depth);
    const int e = (int)(((wp::int64)(node - leaves + 1) * n) >> depth);
    for (int t = s; t < e; ++t) {
        const Vec diff = q - P[t];
        const Real d2 = square(diff);
        // b and kd are inf until the list is full: every finite point enters until then
        if (d2 <= b) {
            const Real d = d2 < inf && d2 >= (Real)1e-30 ? wp::sqrt(d2) : norm_of(diff);
            const wp::int64 j = (wp::int64)O[t];
            if ((d < kd || (d == kd && j < kj)) && j != skip) {
                KNN_INSERT
#if !defined(__CUDA_ARCH__)
                // knn_aggregate reads the neighbours' feature rows next (aggregate_row)
                if (features.shape[0]) __builtin_prefetch((const char*)features.data + j * features.strides[0]);
#endif
                if (c == k) b = kd * kd * (Real)1.0001 + (Real)1e-30;  // the bound of the k-th distance, as sq_bound
            }
        }
    }
    node = 0;
}
