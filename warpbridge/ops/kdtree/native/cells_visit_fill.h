{
    if (local) {
        row_d[n] = d2; row_j[n] = j; row_s[n][0] = sx; row_s[n][1] = sy; row_s[n][2] = sz;
        if (with_vectors) { row_v[n][0] = D[0]; row_v[n][1] = D[1]; row_v[n][2] = D[2]; }
    } else {
        const vec3l wj = *wp::address(grid.wrap, j);
        out_d[n] = d2;
        out_j[n] = j;
        out_s[n] = vec3l((wp::int64)sx + wi[0] - wj[0], (wp::int64)sy + wi[1] - wj[1], (wp::int64)sz + wi[2] - wj[2]);
        if (with_vectors) out_v[n] = D;
    }
    ++n;
}