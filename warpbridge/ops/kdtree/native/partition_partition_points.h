
typedef wp::vec_t<NDIM, REAL> Point;
char* pd = (char*)pts.data;
char* od = (char*)order.data;
const size_t ps = (size_t)pts.strides[0], os = (size_t)order.strides[0];
auto P = [&](int t) -> Point& { return *(Point*)(pd + (size_t)t * ps); };
auto O = [&](int t) -> wp::int32& { return *(wp::int32*)(od + (size_t)t * os); };
const Point pivot = P(pick);
const wp::int32 pivot_index = O(pick);
P(pick) = P(right);
O(pick) = O(right);
const REAL key = pivot[axis];
const size_t off = (size_t)axis * sizeof(REAL);
int store = left;
for (int j = left; j < right; ++j) {
    const REAL c = *(const REAL*)(pd + (size_t)j * ps + off);
    const wp::int32 oj = O(j);
    const Point pj = P(j);
    const int below = (c < key) | ((c == key) & (oj < pivot_index));
    P(j) = P(store);
    O(j) = O(store);
    P(store) = pj;
    O(store) = oj;
    store += below;
}
P(right) = P(store);
O(right) = O(store);
P(store) = pivot;
O(store) = pivot_index;
return store;
