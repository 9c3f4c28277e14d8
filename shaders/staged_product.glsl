// A product blocked through shared memory, for the chunked forms' kernels (ssd_chunks.comp,
// gla_chunks.comp): a workgroup of 256 makes a 64 x 64 block of the output, each invocation 4 x 4
// of it (tx its rows, ty its columns, 16 of each), the operands staged 16 terms at a time.
// Included after common.glsl; staged_product_invocation() sets this invocation's place.

shared vec4 As[16][17], Bs[16][17];  // a product's staged terms: [term][rows 4 i .. 4 i + 3], [term][columns]

uint tid, tx, ty;

void staged_product_invocation() {
    tid = gl_LocalInvocationID.x;
    tx = tid % 16;
    ty = tid / 16;
}

// This invocation's rows and columns of a 64 x 64 block: 4 consecutive of each (one vec4 of the
// staged terms apiece).
uint ri(uint x) { return 4 * tx + x; }
uint cj(uint y) { return 4 * ty + y; }

// Where staged element el (of the 64 x 16 a product stages per operand per step) lies: its term
// and its row or column, with the terms side by side (along_k: 16 consecutive invocations, one
// row's 16 terms) or the rows or columns (64 consecutive, one term's).
uint staged_term(uint el, bool along_k) { return along_k ? el % 16 : el / 64; }
uint staged_row(uint el, bool along_k) { return along_k ? el / 16 : el % 64; }

// acc[x][y] += sum over k < KN (LOAD_A and LOAD_B are 0 past it) of LOAD_A(i, k) LOAD_B(k, j) where ALLOW(i, j, k), for this
// invocation's i = i0 + ri(x), j = j0 + cj(y); in uniform control flow (barriers). A_K, B_K:
// whether the operand's terms k lie side by side in memory (then consecutive invocations load
// consecutive terms, else consecutive rows or columns: the loads coalesce either way). The next 16
// terms are loaded into registers before this 16's products, so that their loads' latency passes
// while the products run; the first 16 before the first barrier, so an operand read from shared
// memory must be complete there.
#define STAGED_LOAD(k0, LOAD_A, A_K, LOAD_B, B_K, next_a, next_b)                                   \
    for (uint m = 0; m < 4; ++m) {                                                                  \
        uint el = tid + 256 * m;                                                                    \
        next_a[m] = LOAD_A(i0 + staged_row(el, A_K), (k0) + staged_term(el, A_K));                  \
        next_b[m] = LOAD_B((k0) + staged_term(el, B_K), j0 + staged_row(el, B_K));                  \
    }

#define STAGED_PRODUCT(acc, KN, LOAD_A, A_K, LOAD_B, B_K, ALLOW)                                    \
    {                                                                                               \
        float next_a[4], next_b[4];                                                                 \
        STAGED_LOAD(0, LOAD_A, A_K, LOAD_B, B_K, next_a, next_b)                                    \
        for (uint k0 = 0; k0 < (KN); k0 += 16) {                                                    \
            barrier();                                                                              \
            for (uint m = 0; m < 4; ++m) {                                                          \
                uint el = tid + 256 * m;                                                            \
                uint ia = staged_row(el, A_K), jb = staged_row(el, B_K);                            \
                As[staged_term(el, A_K)][ia / 4][ia % 4] = next_a[m];                               \
                Bs[staged_term(el, B_K)][jb / 4][jb % 4] = next_b[m];                               \
            }                                                                                       \
            barrier();                                                                              \
            if (k0 + 16 < (KN)) STAGED_LOAD(k0 + 16, LOAD_A, A_K, LOAD_B, B_K, next_a, next_b)      \
            for (uint kk = 0; kk < 16; ++kk) {                                                      \
                vec4 av = As[kk][tx], bv = Bs[kk][ty];                                              \
                for (uint x = 0; x < 4; ++x)                                                        \
                    for (uint y = 0; y < 4; ++y)                                                    \
                        if (ALLOW(i0 + ri(x), j0 + cj(y), k0 + kk)) acc[x][y] += av[x] * bv[y];     \
            }                                                                                       \
        }                                                                                           \
    }

#define ANY(i, j, k) true
#define UP_TO_J(i, j, k) ((k) <= (j))     // terms s <= t of column t
#define FROM_J(i, j, k) ((k) >= (j))      // terms t >= s of column s

void clear(inout float acc[4][4]) {
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) acc[x][y] = 0.0;
}
