
const int first = cloud[0], n = cloud[1], depth = cloud[3], leaves = 1 << depth;
const Vec* __restrict__ P = (const Vec*)tree.points.data;  // the tree's arrays are packed
const Vec* __restrict__ LO = (const Vec*)tree.lo.data + cloud[2];
const Vec* __restrict__ HI = (const Vec*)tree.hi.data + cloud[2];
auto near = [&](int node) -> bool {  // false only if no point of the box can be within the radius
    Vec g;
    for (int a = 0; a < NDIM; ++a) g[a] = wp::max(wp::max(LO[node][a] - q[a], q[a] - HI[node][a]), (Real)0);
    if (square(g) > reach) return false;
    return reach < inf || norm_of(g) <= radius * (Real)1.00001;
};
auto after = [](int node) -> int {  // the node after node's subtree (its right sibling, or an ancestor's)
    while (node & 1) node >>= 1;
    return node == 0 ? 0 : node + 1;
};
auto next_leaf = [&](int node) -> int {  // from node on, the first leaf that may hold a point within
    while (node > 0) {
        if (!near(node)) node = after(node);
        else if (node < leaves) node = 2 * node;
        else return node;
    }
    return 0;
};
auto first_leaf = [&]() -> int {  // a walk's first leaf; 0 for an empty cloud or a query that is not finite
    if (n == 0) return 0;
    for (int a = 0; a < NDIM; ++a) if (!(wp::abs(q[a]) < inf)) return 0;
    return next_leaf(1);
};
auto start_of = [&](int leaf) -> int { return first + (int)(((wp::int64)(leaf - leaves) * n) >> depth); };
WITHIN
