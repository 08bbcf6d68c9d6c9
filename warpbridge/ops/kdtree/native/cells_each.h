
const double bx = base[0], by = base[1], bz = base[2];
const bool own = unshifted, later = first_shift > 0;
const int end = B[bin + 1];
for (int t0 = B[bin]; t0 < end; t0 += G) {  // G at a time (the rows are padded)
    GROUP_BITS
    for (; bits; bits &= bits - 1u) {
        const int t = t0 + lowest(bits);
        const int j = A[t];
        if (j == i && own) continue;
        if (!full && !(i < j || (i == j && later))) continue;
        const wp::vec3d D(X[t] + bx, Y[t] + by, Z[t] + bz);
        const double d2 = D[0] * D[0] + D[1] * D[1] + D[2] * D[2];
        VISIT
    }
}
