
constexpr int ROW = 256;
typedef wp::vec_t<3, wp::int64> vec3l;
// s0: where the row goes; room: how many pairs fit there (arguments)
const bool with_vectors = vectors.shape[0] > 0;
const bool wrapped = grid.wrap.shape[0] > 0;
const vec3l wi = wrapped ? *wp::address(grid.wrap, *wp::address(place, i)) : vec3l();
wp::int64* const out_i = (wp::int64*)pair_i.data + s0;
double* const out_d = (double*)dist.data + s0;
wp::int64* const out_j = (wp::int64*)js.data + s0;
vec3l* const out_s = (vec3l*)shifts.data + s0;
wp::vec3d* const out_v = with_vectors ? (wp::vec3d*)vectors.data + s0 : nullptr;
double row_d[ROW], row_r[ROW], row_v[ROW][3];
int row_j[ROW], row_s[ROW][3];
int n = 0;
