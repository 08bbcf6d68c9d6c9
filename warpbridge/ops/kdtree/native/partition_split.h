
struct Record { REAL p[NDIM]; wp::int32 i; };  // Item's layout (checked in Python)
char* data = (char*)items.data;
const size_t step = (size_t)items.strides[0];
auto at = [&](int t) -> Record& { return *(Record*)(data + (size_t)t * step); };
const Record pivot = at(pick);
at(pick) = at(right);
const REAL key = pivot.p[axis];
const wp::int32 pivot_index = pivot.i;
int store = left;
const size_t off = (size_t)axis * sizeof(REAL);
for (int j = left; j < right; ++j) {
    const char* pj = data + (size_t)j * step;
    const REAL c = *(const REAL*)(pj + off);
    const wp::int32 ri = ((const Record*)pj)->i;
    const Record r = at(j);
    const int below = (c < key) | ((c == key) & (ri < pivot_index));
    at(j) = at(store);
    at(store) = r;
    store += below;
}
at(right) = at(store);
at(store) = pivot;
return store;
