{
    const vec3l wj = wrapped ? *wp::address(grid.wrap, t) : vec3l();
    const vec3l s(sx + wi[0] - wj[0], sy + wi[1] - wj[1], sz + wi[2] - wj[2]);
    if (n < ROW) {
        row_d[n] = d2; row_j[n] = j; row_s[n][0] = (int)s[0]; row_s[n][1] = (int)s[1]; row_s[n][2] = (int)s[2];
        if (with_vectors) { row_v[n][0] = D[0]; row_v[n][1] = D[1]; row_v[n][2] = D[2]; }
    } else if (n < room) {  // a long row: the local one goes first, then each pair straight to its place
        if (n == ROW) {
            for (int t = 0; t < ROW; ++t) {
                out_d[t] = row_d[t]; out_j[t] = row_j[t]; out_s[t] = vec3l(row_s[t][0], row_s[t][1], row_s[t][2]);
                if (with_vectors) out_v[t] = wp::vec3d(row_v[t][0], row_v[t][1], row_v[t][2]);
            }
        }
        out_d[n] = d2;
        out_j[n] = j;
        out_s[n] = s;
        if (with_vectors) out_v[n] = D;
    }
    ++n;
}
