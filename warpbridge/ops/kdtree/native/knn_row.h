// Query i's row of the k nearest: D(n) and J(n) its n-th distance and index, all set to
// (inf, -1) before the search (knn_query and knn_brute share it).
char* const dr = (char*)dist.data + (size_t)i * (size_t)dist.strides[0];
char* const ir = (char*)idx.data + (size_t)i * (size_t)idx.strides[0];
const size_t ds = (size_t)dist.strides[1], is = (size_t)idx.strides[1];
auto D = [&](int n) -> Real& { return *(Real*)(dr + (size_t)n * ds); };
auto J = [&](int n) -> wp::int64& { return *(wp::int64*)(ir + (size_t)n * is); };
for (int n = 0; n < k; ++n) { D(n) = inf; J(n) = -1; }
