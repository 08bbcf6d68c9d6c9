
NORM_OF
BALL_WALK
char* const row = (char*)listed.data + (size_t)i * (size_t)listed.strides[0];
const size_t ls = (size_t)listed.strides[1];
auto keep = [&](int c, int value) { *(wp::int32*)(row + (size_t)c * ls) = value; };
const int room = listed.shape[1];
int count = 0, kept_leaf = 0, kept_at = 0, kept_end = 0;
walk(0, 0, 0, [&](int t, int leaf, int e) {
    if (count < room) {  // the place; once the row is full, where the walk goes on
        keep(count, t);
    } else if (count == room && room >= RESUMED) {
        keep(room - 3, kept_leaf);
        keep(room - 2, kept_at);
        keep(room - 1, -1 - kept_end);
    }
    if (count == room - RESUMED) {
        kept_leaf = leaf;
        kept_at = t + 1;
        kept_end = e;
    }
    ++count;
});
return count;
