
if (n > room) return -1;  // no room for the row: nothing written past the place
for (int t = 0; t < n; ++t) out_i[t] = i;
if (n <= ROW) {  // bucketed (stable), then insertion-sorted: the buckets leave few moves
    constexpr int NB = 128;
    const double scale = NB / (cut2 * wp::sqrt(cut2));  // by d^3: about as many pairs in each bucket
    int start[NB + 1] = {0}, perm[ROW];
    unsigned char key[ROW];
    for (int t = 0; t < n; ++t) {
        row_r[t] = wp::sqrt(row_d[t]);
        const int kt = (int)(row_d[t] * row_r[t] * scale);
        key[t] = (unsigned char)(kt < NB - 1 ? kt : NB - 1);
    }
    for (int t = 0; t < n; ++t) ++start[key[t] + 1];
    for (int c = 0; c < NB; ++c) start[c + 1] += start[c];
    double sorted_d[ROW];  // the squares in perm's order: the insertion compares without an indirection
    for (int t = 0; t < n; ++t) {
        const int p = start[key[t]]++;
        perm[p] = t;
        sorted_d[p] = row_d[t];
    }
    for (int p = 1; p < n; ++p) {
        const int v = perm[p];
        const double dv = sorted_d[p];
        int q = p;
        for (; q > 0 && sorted_d[q - 1] > dv; --q) {  // ties keep the walk's order
            perm[q] = perm[q - 1];
            sorted_d[q] = sorted_d[q - 1];
        }
        perm[q] = v;
        sorted_d[q] = dv;
    }
    for (int r = 0; r < n; ++r) {
        const int t = perm[r];
        out_d[r] = row_r[t];
        out_j[r] = row_j[t];
        out_s[r] = vec3l(row_s[t][0], row_s[t][1], row_s[t][2]);
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
