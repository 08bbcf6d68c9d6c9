{  // (d, j) into the sorted row of c found (ties to the smaller index); kd, kj: the k-th once full
    int pos = c < k - 1 ? c : k - 1;
    while (pos > 0) {
        const Real dp = D(pos - 1);
        const wp::int64 jp = J(pos - 1);
        if (!(d < dp || (d == dp && j < jp))) break;
        D(pos) = dp;
        J(pos) = jp;
        --pos;
    }
    D(pos) = d;
    J(pos) = j;
    if (c < k) ++c;
    if (c == k) {
        kd = D(k - 1);
        kj = J(k - 1);
    }
}