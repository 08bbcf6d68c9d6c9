
const wp::vec4i h = *wp::address(home, i);
if (h[0] < 0) return RESULT;  // not finite: nobody's neighbour
const int b = h[3];
const wp::vec4i g = *wp::address(grid.shape, b), r = *wp::address(grid.reach, b);
const double* __restrict__ X = (const double*)grid.xyz.data;
const int stride_xyz = (int)(grid.xyz.strides[0] / sizeof(double));
const double* __restrict__ Y = X + stride_xyz;
const double* __restrict__ Z = Y + stride_xyz;
const double cut2 = grid.cut2;
#if defined(__CUDA_ARCH__)
constexpr int G = 8;  // a bin's atoms tested at a time (cells_group.h)
auto lowest = [](unsigned bits) -> int { return __ffs(bits) - 1; };  // of a group's bits
auto how_many = [](unsigned bits) -> int { return __popc(bits); };
#else
constexpr int G = 16;
auto lowest = [](unsigned bits) -> int { return __builtin_ctz(bits); };
auto how_many = [](unsigned bits) -> int { return __builtin_popcount(bits); };
#endif
const int full = grid.full;
const int pi = *wp::address(place, i);
const wp::vec3d xi(X[pi], Y[pi], Z[pi]);
const wp::vec3d c0 = *wp::address(grid.cells, b, 0), c1 = *wp::address(grid.cells, b, 1), c2 = *wp::address(grid.cells, b, 2);
const int periodic = r[3];
const wp::int32* __restrict__ A = (const wp::int32*)grid.atoms.data;
const wp::int32* __restrict__ B = (const wp::int32*)grid.bin_start.data;
auto cell_of = [&](int axis, int c, int n, int& s) -> int {  // the bin c along an axis, wrapped; -1 past a wall
    s = 0;
    if (periodic & (1 << axis)) {
        s = c >= 0 ? c / n : -((-c + n - 1) / n);
        return c - s * n;
    }
    return c >= 0 && c < n ? c : -1;
};
for (int ox = -r[0]; ox <= r[0]; ++ox) {
    int sx, sy, sz;
    const int cx = cell_of(0, h[0] + ox, g[0], sx);
    if (cx < 0) continue;
    for (int oy = -r[1]; oy <= r[1]; ++oy) {
        const int cy = cell_of(1, h[1] + oy, g[1], sy);
        if (cy < 0) continue;
        for (int oz = -r[2]; oz <= r[2]; ++oz) {
            const int cz = cell_of(2, h[2] + oz, g[2], sz);
            if (cz < 0) continue;
            const wp::vec3d base = (double)sx * c0 + (double)sy * c1 + (double)sz * c2 - xi;
            const bool unshifted = sx == 0 && sy == 0 && sz == 0;
            const int first_shift = sx != 0 ? sx : sy != 0 ? sy : sz;
            const int bin = g[3] + (cx * g[1] + cy) * g[2] + cz;
            INNER
        }
    }
}
return RESULT;
