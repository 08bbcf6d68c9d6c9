while (leaf > 0) {
    for (; t < e; ++t) {
        const Vec diff = q - P[t];
        if (within(diff)) return wp::vec3i(leaf, t, e);
    }
    leaf = next_leaf(after(leaf));
    t = start_of(leaf);
    e = start_of(leaf + 1);
}
return wp::vec3i(0, 0, 0);
