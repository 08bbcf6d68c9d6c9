// Each query's references within the radius (sqrt(d2) <= radius, d2 as the block computes it),
// itself left out with `skip`: the candidates come under a bound a few roundings above
// radius^2, each then tested exactly as the fill tests it.
// @start
const Real r = radius;
const Real margin = sizeof(Real) == 4 ? (Real)1.9073486e-6 : (Real)3.5527137e-15;  // 16 roundings
int found[8];
for (int a = 0; a < 8; ++a) {
    bound[a] = r * r * ((Real)1 + margin);
    found[a] = 0;
}
// @visit
found[a] += wp::sqrt(d) <= r && !(skip && j == i0 + a);
// @end
for (int a = 0; a < qb; ++a) *wp::address(count, i0 + a) = found[a];
