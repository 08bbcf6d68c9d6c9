
const double bx = base[0], by = base[1], bz = base[2];
const bool own = unshifted, later = first_shift > 0;
const int end = B[bin + 1];
for (int t0 = B[bin]; t0 < end; t0 += G) {  // the fill's groups, counted
    GROUP_BITS
    if (full) {
        count += how_many(bits);
        continue;
    }
    for (; bits; bits &= bits - 1u) {
        const int t = t0 + lowest(bits);
        const int j = A[t];
        count += (i < j) | ((i == j) & later);  // never i itself unshifted (later is false there)
    }
}
count -= (int)(full && own && pi >= B[bin] && pi < end && cut2 > 0.0);  // i itself (distance 0), in its bin unshifted
