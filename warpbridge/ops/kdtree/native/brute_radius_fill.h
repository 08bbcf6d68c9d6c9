// Each query's row of the list, from ptr[i] on: its references within the radius (as counted),
// in index order, then sorted by distance (ties by index: insertion for short rows, a heap
// sort on (distance, index) for long ones). A row as long as the cap (limits[0]) keeps its cap
// nearest by insertion as it goes, as kNN does.
// @start
const Real r = radius;
const Real margin = sizeof(Real) == 4 ? (Real)1.9073486e-6 : (Real)3.5527137e-15;
const int cap = limits[0], skip = limits[1];
int found[8];
bool capped[8];
wp::int64 first[8];
Real kth[8];
for (int a = 0; a < 8; ++a) {
    const int q = i0 + (a < qb ? a : 0);
    first[a] = *wp::address(ptr, q);
    capped[a] = *wp::address(ptr, q + 1) - first[a] == cap;
    bound[a] = r * r * ((Real)1 + margin);
    kth[a] = (Real)INFINITY;
    found[a] = 0;
}
auto dist_at = [&](int a, int t) -> Real& { return *wp::address(distance, first[a] + t); };
auto index_at = [&](int a, int t) -> wp::int64& { return *wp::address(index, first[a] + t); };
// @visit
if (wp::sqrt(d) <= r && !(skip && j == i0 + a) && d < kth[a]) {
    int n = found[a];
    if (!capped[a]) {
        dist_at(a, n) = d;
        index_at(a, n) = j;
        ++n;
    } else {
        int pos = n < cap ? n : cap - 1;
        while (pos > 0 && dist_at(a, pos - 1) > d) { dist_at(a, pos) = dist_at(a, pos - 1); index_at(a, pos) = index_at(a, pos - 1); --pos; }
        dist_at(a, pos) = d;
        index_at(a, pos) = j;
        if (n < cap) ++n;
        if (n == cap) bound[a] = kth[a] = dist_at(a, cap - 1);
    }
    found[a] = n;
}
// @end
for (int a = 0; a < qb; ++a) {
    const int n = found[a];
    auto before = [&](int x, int y) { return dist_at(a, x) < dist_at(a, y) || (dist_at(a, x) == dist_at(a, y) && index_at(a, x) < index_at(a, y)); };
    auto swap = [&](int x, int y) {
        const Real dx = dist_at(a, x); dist_at(a, x) = dist_at(a, y); dist_at(a, y) = dx;
        const wp::int64 jx = index_at(a, x); index_at(a, x) = index_at(a, y); index_at(a, y) = jx;
    };
    if (capped[a] || n <= 32) {
        for (int t = 1; t < n; ++t) for (int p = t; p > 0 && before(p, p - 1); --p) swap(p, p - 1);  // sorted already where capped
    } else {
        auto sift = [&](int root, int end) {
            for (int c = 2 * root + 1; c < end; root = c, c = 2 * root + 1) {
                if (c + 1 < end && before(c, c + 1)) ++c;
                if (!before(root, c)) break;
                swap(root, c);
            }
        };
        for (int s = n / 2 - 1; s >= 0; --s) sift(s, n);
        for (int e = n - 1; e > 0; --e) { swap(0, e); sift(0, e); }
    }
    for (int t = 0; t < n; ++t) {
        dist_at(a, t) = wp::sqrt(dist_at(a, t));
        *wp::address(centre, first[a] + t) = i0 + a;
    }
}
