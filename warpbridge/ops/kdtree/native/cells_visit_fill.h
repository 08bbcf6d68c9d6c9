{
    const vec3l wj = wrapped ? *wp::address(grid.wrap, t) : vec3l();
    const vec3l s(sx + wi[0] - wj[0], sy + wi[1] - wj[1], sz + wi[2] - wj[2]);
    if (n < expected && local) {  // (n < expected always: the count shares the walk; a row never runs past its place)
        row_d[n] = d2; row_j[n] = j; row_s[n][0] = (int)s[0]; row_s[n][1] = (int)s[1]; row_s[n][2] = (int)s[2];
        if (with_vectors) { row_v[n][0] = D[0]; row_v[n][1] = D[1]; row_v[n][2] = D[2]; }
    } else if (n < expected) {
        out_d[n] = d2;
        out_j[n] = j;
        out_s[n] = s;
        if (with_vectors) out_v[n] = D;
    }
    ++n;
}