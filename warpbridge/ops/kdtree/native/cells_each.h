
for (int t = B[bin]; t < B[bin + 1]; ++t) {
    const wp::vec3d D(X[t] + base[0], Y[t] + base[1], Z[t] + base[2]);
    const double d2 = D[0] * D[0] + D[1] * D[1] + D[2] * D[2];
    if (!(d2 < cut2)) continue;
    const int j = A[t];
    if (j == i && unshifted) continue;
    if (!full && !(i < j || (i == j && first_shift > 0))) continue;
    VISIT
}