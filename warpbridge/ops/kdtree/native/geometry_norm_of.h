
typedef REAL Real;
typedef wp::vec_t<NDIM, Real> Vec;
const Real inf = (Real)INFINITY;
// Over NDIM coordinates, in the order of the 3-D expressions (x * x + y * y) + z * z:
auto square = [&](const Vec& v) -> Real {
    Real s = v[0] * v[0];
    for (int a = 1; a < NDIM; ++a) s += v[a] * v[a];
    return s;
};
auto norm_of = [&](const Vec& v) -> Real {  // as norm
    const Real d2 = square(v);
    if (d2 < inf && d2 >= (Real)1e-30) return wp::sqrt(d2);
    Real a = wp::abs(v[0]);
    for (int b = 1; b < NDIM; ++b) a = wp::max(a, wp::abs(v[b]));
    if (a == (Real)0 || !(a < inf)) return a;
    return a * wp::sqrt(square(v / a));
};
