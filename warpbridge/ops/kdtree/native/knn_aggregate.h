
typedef REAL Real;
const int k = idx.shape[1];
const int nf = features.shape[1];
const Real nearest = *wp::address(dist, i, 0);
const Real floor = (Real)1e-8;  // sqrt of PyG's 1e-16 floor on the squared distance
const size_t fs = (size_t)features.strides[1], os = (size_t)out.strides[1];
const bool packed = fs == sizeof(Real) && os == sizeof(Real);
char* __restrict__ o = (char*)wp::address(out, i, 0);  // the output row, only ever through o
for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) = (Real)0;
Real total = (Real)0;
for (int n = 0; n < k; ++n) {
    const wp::int64 j = *wp::address(idx, i, n);
    if (j < 0) continue;
    const Real d = *wp::address(dist, i, n);
    Real w;
    if (inverse_square) {
        const Real ratio = wp::max(nearest, floor) / wp::max(d, floor);
        w = ratio * ratio;
    } else {
        w = wp::exp((nearest - d) / sigma);
    }
    total += w;
    const char* __restrict__ row = (const char*)features.data + j * features.strides[0];
    if (packed) {
        for (int f = 0; f < nf; ++f) ((Real*)o)[f] += w * ((const Real*)row)[f];
    } else {
        for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) += w * *(const Real*)(row + f * fs);
    }
}
if (total > (Real)0) {
    const Real scale = (Real)1 / total;
    for (int f = 0; f < nf; ++f) *(Real*)(o + f * os) *= scale;
}
