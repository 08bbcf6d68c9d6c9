
const wp::int32* __restrict__ O = (const wp::int32*)tree.order.data;
auto walk = [&](int leaf, int t, int e, auto&& visit) {
    if (leaf == 0) {
        leaf = first_leaf();
        t = start_of(leaf);
        e = start_of(leaf + 1);
    }
    while (leaf > 0) {
        for (; t < e; ++t) {
            const Vec diff = q - P[t];
            if (within(diff) && (skip_self == 0 || O[t] != i)) visit(t, leaf, e);
        }
        leaf = next_leaf(after(leaf));
        t = start_of(leaf);
        e = start_of(leaf + 1);
    }
};
