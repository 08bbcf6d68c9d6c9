
if (local) {
    const int padded = (n + 7) & ~7;  // whole vectors: the padding is inf, never before anything
    for (int t = n; t < padded; ++t) row_d[t] = (double)INFINITY;
    for (int t = 0; t < n; ++t) {
        const double dt = row_d[t];
        int r = 0;
        for (int u = 0; u < padded; ++u) r += (row_d[u] < dt) | ((row_d[u] == dt) & (u < t));  // ties: earlier first
        const int j = row_j[t];
        const vec3l wj = *wp::address(grid.wrap, j);
        out_d[r] = wp::sqrt(dt);
        out_j[r] = j;
        out_s[r] = vec3l((wp::int64)row_s[t][0] + wi[0] - wj[0], (wp::int64)row_s[t][1] + wi[1] - wj[1], (wp::int64)row_s[t][2] + wi[2] - wj[2]);
        if (with_vectors) out_v[r] = wp::vec3d(row_v[t][0], row_v[t][1], row_v[t][2]);
    }
} else {
    for (int t = 1; t < n; ++t) {
        const double d = out_d[t];
        const wp::int64 j = out_j[t];
        const vec3l sh = out_s[t];
        const wp::vec3d v = with_vectors ? out_v[t] : wp::vec3d();
        int p = t;
        for (; p > 0 && out_d[p - 1] > d; --p) {
            out_d[p] = out_d[p - 1]; out_j[p] = out_j[p - 1]; out_s[p] = out_s[p - 1];
            if (with_vectors) out_v[p] = out_v[p - 1];
        }
        out_d[p] = d; out_j[p] = j; out_s[p] = sh;
        if (with_vectors) out_v[p] = v;
    }
    for (int t = 0; t < n; ++t) out_d[t] = wp::sqrt(out_d[t]);
}
return n;
