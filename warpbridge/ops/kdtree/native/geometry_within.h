// within(diff): |diff| <= radius, as norm_of compares it; the square root only near the radius
// (a squared distance below `inside` is within it: norm_of is sqrt there, and a radius of at
// least 1e-10 is far above what the squares' underflow can hide).
const Real r2 = radius * radius;
const Real inside = r2 >= (Real)1e-20 && r2 < inf ? r2 * (Real)0.9999 : (Real)-1;
auto within = [&](const Vec& diff) -> bool {
    const Real d2 = square(diff);
    return d2 <= reach && (d2 <= inside || norm_of(diff) <= radius);
};
