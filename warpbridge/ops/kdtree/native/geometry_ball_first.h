
NORM_OF
LEAF_STEPS
if (n == 0) return wp::vec3i(0, 0, 0);
for (int a = 0; a < NDIM; ++a) if (!(wp::abs(q[a]) < inf)) return wp::vec3i(0, 0, 0);  // not finite: no neighbour
int leaf = next_leaf(1), t = start_of(leaf), e = start_of(leaf + 1);
BALL_SCAN
