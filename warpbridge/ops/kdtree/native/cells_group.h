// `bits`: which of the bin's atoms t0 .. t0 + G - 1 (before `end`) lie within the cutoff of
// x_i + the bin's shift, bit u for atom t0 + u. On the CPU the squares are computed in the
// compiler's vector type and compared at once (as a loop over u, the compare became ~60
// instructions of lane shuffles); the count and the fill share it, so they agree on every pair.
#if defined(__CUDA_ARCH__)
unsigned bits = 0;
for (int u = 0; u < G; ++u) {
    const double dx = X[t0 + u] + bx, dy = Y[t0 + u] + by, dz = Z[t0 + u] + bz;
    bits |= (unsigned)(dx * dx + dy * dy + dz * dz < cut2) << u;
}
#else
typedef double Group __attribute__((vector_size(8 * G)));
typedef bool Bits __attribute__((ext_vector_type(G)));
Group x, y, z;
__builtin_memcpy(&x, X + t0, sizeof(Group));
__builtin_memcpy(&y, Y + t0, sizeof(Group));
__builtin_memcpy(&z, Z + t0, sizeof(Group));
x += bx;
y += by;
z += bz;
const Group squares = x * x + y * y + z * z;
unsigned bits = __builtin_bit_cast(unsigned short, __builtin_convertvector(squares < cut2, Bits));
#endif
bits &= end - t0 < G ? (1u << (end - t0)) - 1u : (1u << G) - 1u;
