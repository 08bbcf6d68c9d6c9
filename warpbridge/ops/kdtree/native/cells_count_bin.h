
const double bx = base[0], by = base[1], bz = base[2];
const bool own = unshifted, later = first_shift > 0;
int in_bin = 0;
for (int t = B[bin]; t < B[bin + 1]; ++t) {
    const double dx = X[t] + bx, dy = Y[t] + by, dz = Z[t] + bz;
    const int j = A[t];
    const bool kept = (bool)full | (i < j) | ((i == j) & later);
    in_bin += (dx * dx + dy * dy + dz * dz < cut2) & kept & !((j == i) & own);
}
count += in_bin;