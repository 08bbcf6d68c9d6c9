
NORM_OF
const Vec* __restrict__ P = (const Vec*)tree.points.data;  // the tree's arrays are packed
const wp::int32* __restrict__ O = (const wp::int32*)tree.order.data;
const char* const row = (const char*)listed.data + (size_t)i * (size_t)listed.strides[0];
const size_t ls = (size_t)listed.strides[1];
char* const dp = (char*)dist.data;
char* const ip = (char*)idx.data;
const size_t ds = (size_t)dist.strides[0], is = (size_t)idx.strides[0];
for (int t = 0; t < kept; ++t) {
    const int p = *(const wp::int32*)(row + (size_t)t * ls);
    *(Real*)(dp + (size_t)(s + t) * ds) = norm_of(q - P[p]);
    *(wp::int64*)(ip + (size_t)(s + t) * is) = (wp::int64)O[p];
}
