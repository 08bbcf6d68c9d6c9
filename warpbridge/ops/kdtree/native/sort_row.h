
typedef REAL Real;
char* const dp = (char*)dist.data;
char* const ip = (char*)idx.data;
const size_t ds = (size_t)dist.strides[0], is = (size_t)idx.strides[0];
auto D = [&](int t) -> Real& { return *(Real*)(dp + (size_t)t * ds); };
auto J = [&](int t) -> wp::int64& { return *(wp::int64*)(ip + (size_t)t * is); };
auto less = [](Real da, wp::int64 ja, Real db, wp::int64 jb) { return da < db || (da == db && ja < jb); };
auto swap = [&](int a, int b) {
    const Real d = D(a); D(a) = D(b); D(b) = d;
    const wp::int64 j = J(a); J(a) = J(b); J(b) = j;
};
int los[64], his[64];
#if !defined(__CUDA_ARCH__)
if (sizeof(Real) == 4 && size <= PACKED_ROW) {
    // float32 on the CPU: each entry as one 64-bit key, the distance's bits (a distance is
    // finite and >= 0, so its bits order as it does) above the index, sorted by a quicksort
    // with a branch-free partition, then unpacked.
    wp::uint64 keys[PACKED_ROW];
    for (int t = 0; t < size; ++t) {
        wp::uint32 bits;
        memcpy(&bits, &D(s + t), 4);
        keys[t] = ((wp::uint64)bits << 32) | (wp::uint64)(wp::uint32)J(s + t);
    }
    int sp = 0, lo = 0, hi = size - 1;
    for (;;) {
        while (hi - lo > 16) {
            const int mid = lo + (hi - lo) / 2;
            wp::uint64 x = keys[lo], y = keys[mid], z = keys[hi];
            const wp::uint64 pivot = x < y ? (y < z ? y : (x < z ? z : x)) : (x < z ? x : (y < z ? z : y));
            const int at = pivot == x ? lo : (pivot == y ? mid : hi);
            keys[at] = keys[hi];
            keys[hi] = pivot;
            int store = lo;
            for (int j = lo; j < hi; ++j) {
                const wp::uint64 v = keys[j];
                const int below = v < pivot;
                keys[j] = keys[store];
                keys[store] = v;
                store += below;
            }
            keys[hi] = keys[store];
            keys[store] = pivot;
            if (store - lo < hi - store) { los[sp] = store + 1; his[sp] = hi; ++sp; hi = store - 1; }
            else { los[sp] = lo; his[sp] = store - 1; ++sp; lo = store + 1; }
        }
        for (int a = lo + 1; a <= hi; ++a) {
            const wp::uint64 v = keys[a];
            int b = a;
            while (b > lo && v < keys[b - 1]) { keys[b] = keys[b - 1]; --b; }
            keys[b] = v;
        }
        if (sp == 0) break;
        --sp;
        lo = los[sp];
        hi = his[sp];
    }
    for (int t = 0; t < size; ++t) {
        const wp::uint32 bits = (wp::uint32)(keys[t] >> 32);
        memcpy(&D(s + t), &bits, 4);
        J(s + t) = (wp::int64)(keys[t] & 0xffffffffu);
    }
    return;
}
#endif
int sp = 0, lo = s, hi = s + size - 1;
for (;;) {
    while (hi - lo > 16) {
        const int mid = lo + (hi - lo) / 2;
        if (less(D(mid), J(mid), D(lo), J(lo))) swap(mid, lo);
        if (less(D(hi), J(hi), D(lo), J(lo))) swap(hi, lo);
        if (less(D(hi), J(hi), D(mid), J(mid))) swap(hi, mid);
        const Real pd = D(mid);
        const wp::int64 pj = J(mid);
        int i = lo, j = hi;
        while (i <= j) {
            while (less(D(i), J(i), pd, pj)) ++i;
            while (less(pd, pj, D(j), J(j))) --j;
            if (i <= j) { swap(i, j); ++i; --j; }
        }
        if (j - lo < hi - i) { los[sp] = i; his[sp] = hi; ++sp; hi = j; }
        else { los[sp] = lo; his[sp] = j; ++sp; lo = i; }
    }
    for (int a = lo + 1; a <= hi; ++a) {
        const Real d = D(a);
        const wp::int64 jj = J(a);
        int b = a;
        while (b > lo && less(d, jj, D(b - 1), J(b - 1))) { D(b) = D(b - 1); J(b) = J(b - 1); --b; }
        D(b) = d;
        J(b) = jj;
    }
    if (sp == 0) break;
    --sp;
    lo = los[sp];
    hi = his[sp];
}
