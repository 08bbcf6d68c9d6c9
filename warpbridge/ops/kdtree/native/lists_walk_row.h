
NORM_OF
BALL_WALK
char* const dp = (char*)dist.data;
char* const ip = (char*)idx.data;
const size_t ds = (size_t)dist.strides[0], is = (size_t)idx.strides[0];
auto D = [&](int t) -> Real& { return *(Real*)(dp + (size_t)t * ds); };
auto J = [&](int t) -> wp::int64& { return *(wp::int64*)(ip + (size_t)t * is); };
int held = size;
walk(at[0], at[1], at[2], [&](int t, int, int) {
    D(s + held) = norm_of(q - P[t]);
    J(s + held) = (wp::int64)O[t];
    ++held;
});
return held;
