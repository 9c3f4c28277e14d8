// ssm_scan's chunked form (SSD) and its backward, the work of each chunk (native/cpu_ssd_chunks.cpp
// has the layouts, the formulas and the same order of sums): a workgroup per (chunk, head,
// sequence), all of them at once; only ssd_pass.comp walks the chunks in order. Variants:
//   OWN_STATES   X_q = sum_s B_s (e[s] u_s)^T into the chunk's plane, and the chunk's decay A_q
//   START_GRADS  gZ_q = sum_t C_t (f[t] gy_t)^T into the chunk's plane
//   OUTPUTS      y_t = sum_{s <= t} M[t, s] u_s + f[t] Z_q^T C_t
//   GRADS        gu, glog_decay, and each head's gB and gC (summed over a group's heads by
//                ssd_pass.comp's GROUP_SUM where groups hold several)
// Every product is a blocked one: a 64 x 64 block of its output at a time, each invocation 4 x 4
// of it, its operands staged through shared memory 16 terms at a time. The products over a
// chunk's pairs of tokens (the triangle s <= t) add only the pairs' terms, so a NaN in a token
// never reaches the outputs of the tokens before it.
//
// GRADS, OWN_STATES and START_GRADS have a form on cooperative matrices (ssd_chunks_coopmat.comp
// defines COOPMAT; the backward uses it): their products' operands rounded to f16 or bf16 as they
// are staged, f32 sums. There a triangle's terms outside
// it are zeros, so a chunk with a value the 16-bit type cannot hold (a NaN, an infinity, or past
// f16's 65504) would spread it: such a chunk flags itself in `flags`, and the f32 form runs again
// for the flagged chunks only. EMULATED_COOPMAT is the same form with the fragments' products
// summed by the invocations in f32 from values rounded alike, for devices without cooperative
// matrices (tests on lavapipe: RLKIT_VK_EMULATE_COOPMAT).
#include "common.glsl"

#if defined(COOPMAT) || defined(EMULATED_COOPMAT)
#define FRAGMENTS
#endif

layout(push_constant) uniform Push {
    Floats u;       // [P, H, T, N]
    Floats la;      // the log decays [H, T, N]
    Floats B;       // [D, G, T, N]
    Floats C;
    Floats g;       // START_GRADS, GRADS: the gradient of y, laid out as u
    Floats states;  // OUTPUTS, GRADS: the start states Z [D P, H, c, N]
    Floats aux;     // GRADS: gX [D P, H, c, N]
    Floats o;       // OWN_STATES, START_GRADS: planes [D P, H, c, N]; OUTPUTS: y; GRADS: [gu, glog_decay]
    Floats bc;      // GRADS: gB, then gC, per head [D, H, T, N] each
    Floats decay;   // [H, c, N]: each chunk's decay A_q (written by OWN_STATES)
    Floats flags;   // GRADS: per chunk, 1 where the f32 form must do it (the fragment form's
                    // verdict; 0 there: the f32 form does every chunk)
    uint P;
    uint H;
    uint T;
    uint N;
    uint D;
    uint G;
    uint L;
    uint c;
    uint rounding;  // EMULATED_COOPMAT: the product dtype, 1 f16, 2 bf16
} pc;

const uint LMAX = 64;  // native/ssd_chunks.hpp: kSsdMaxChunk
shared float a[LMAX], f[LMAX], e[LMAX];
shared float pairs[LMAX * LMAX];       // [t * LMAX + s], s <= t
#if !defined(FRAGMENTS)
shared vec4 As[16][17], Bs[16][17];  // a product's staged terms: [term][rows 4 i .. 4 i + 3], [term][columns]
#endif

uint tid, tx, ty, q, h, n, grp, nq, t0, plane;  // this invocation; this chunk: its tokens, the first's index along T N

// This invocation's rows and columns of a 64 x 64 block: 4 consecutive of each (one vec4 of the
// staged terms apiece).
uint ri(uint x) { return 4 * tx + x; }
uint cj(uint y) { return 4 * ty + y; }

uint vec_at(uint t) { return pc.P * (h + pc.H * (t0 + t)); }  // u's, y's, g's token t
uint bc_at(uint t) { return pc.D * (grp + pc.G * (t0 + t)); }  // B's, C's token t
// Each operand's element, 0 outside the chunk and the sizes (and a product's terms past its
// length: no other bound is needed). Read without a branch: an element outside reads its array's
// first and becomes 0. (NVIDIA's compiler waits for a load inside a branch where the branch joins:
// the products' staging loads went one after another.)
float u_(uint t, uint p) {
    uint at = vec_at(t) + p;
    float v = pc.u.v[t < nq && p < pc.P ? at : 0];
    return t < nq && p < pc.P ? v : 0.0;
}
float gy(uint t, uint p) {
    uint at = vec_at(t) + p;
    float v = pc.g.v[t < nq && p < pc.P ? at : 0];
    return t < nq && p < pc.P ? v : 0.0;
}
float B_(uint t, uint d) {
    uint at = bc_at(t) + d;
    float v = pc.B.v[t < nq && d < pc.D ? at : 0];
    return t < nq && d < pc.D ? v : 0.0;
}
float C_(uint t, uint d) {
    uint at = bc_at(t) + d;
    float v = pc.C.v[t < nq && d < pc.D ? at : 0];
    return t < nq && d < pc.D ? v : 0.0;
}
float Z_(uint d, uint p) {
    uint at = plane + d + pc.D * p;
    float v = pc.states.v[d < pc.D && p < pc.P ? at : 0];
    return d < pc.D && p < pc.P ? v : 0.0;
}
float gX(uint d, uint p) {
    uint at = plane + d + pc.D * p;
    float v = pc.aux.v[d < pc.D && p < pc.P ? at : 0];
    return d < pc.D && p < pc.P ? v : 0.0;
}
float pair(uint t, uint s) {  // the triangle s <= t
    float v = pairs[t < nq && s <= t ? t * LMAX + s : 0];
    return t < nq && s <= t ? v : 0.0;
}
float e_(uint t) {
    float v = e[t % LMAX];
    return t < nq ? v : 0.0;
}
float f_(uint t) {
    float v = f[t % LMAX];
    return t < nq ? v : 0.0;
}

// acc[x][y] += sum over k < KN (LOAD_A and LOAD_B are 0 past it) of LOAD_A(i, k) LOAD_B(k, j) where ALLOW(i, j, k), for this
// invocation's i = i0 + ri(x), j = j0 + cj(y); in uniform control flow (barriers). A_K, B_K:
// whether the operand's terms k lie side by side in memory (then consecutive invocations load
// consecutive terms, else consecutive rows or columns: the loads coalesce either way).
#define STAGED_PRODUCT(acc, KN, LOAD_A, A_K, LOAD_B, B_K, ALLOW)                              \
    for (uint k0 = 0; k0 < (KN); k0 += 16) {                                                  \
        barrier();                                                                            \
        for (uint m = 0; m < 4; ++m) {                                                        \
            uint el = tid + 256 * m;                                                          \
            uint ka = A_K ? el % 16 : el / 64, ia = A_K ? el / 16 : el % 64;                  \
            uint kb = B_K ? el % 16 : el / 64, jb = B_K ? el / 16 : el % 64;                  \
            As[ka][ia / 4][ia % 4] = LOAD_A(i0 + ia, k0 + ka);                                \
            Bs[kb][jb / 4][jb % 4] = LOAD_B(k0 + kb, j0 + jb);                                \
        }                                                                                     \
        barrier();                                                                            \
        for (uint kk = 0; kk < 16; ++kk) {                                                    \
            vec4 av = As[kk][tx], bv = Bs[kk][ty];                                            \
            for (uint x = 0; x < 4; ++x)                                                      \
                for (uint y = 0; y < 4; ++y)                                                  \
                    if (ALLOW(i0 + ri(x), j0 + cj(y), k0 + kk)) acc[x][y] += av[x] * bv[y];   \
        }                                                                                     \
    }

#define ANY(i, j, k) true
#define UP_TO_J(i, j, k) ((k) <= (j))     // terms s <= t of column t
#define FROM_J(i, j, k) ((k) >= (j))      // terms t >= s of column s

#if defined(FRAGMENTS)
// The products on 16 x 16 fragments: subgroup sg (8 of 32 invocations) owns the rows 16 (sg % 4)..
// and columns 32 (sg / 4).. of a 64 x 64 block, two fragments side by side, and each invocation's
// 4 x 4 (ri, cj) lies in its own subgroup's fragments (tx, ty in load_decays): the sums pass from a
// fragment to its invocations through a 16 x 16 scratch per subgroup. A product's triangle is its
// pairs' zeros outside it (pair()), so ALLOW is not needed.
uint frag_row, frag_col;
// Operands staged as 16-bit values, two to a word (the word-sized shared arrays the other
// cooperative-matrix kernels load their fragments from): A [64 rows][KS terms], B [KS terms][64
// columns], each row padded by 8 halves (16-byte rows, spread over the banks). `rounding`: 1 f16,
// 2 bf16 (to the nearest, ties to even).
#if defined(COOPMAT)
const uint KS = 32;  // terms staged at a time
#if defined(BF16)
const uint rounding = 2;
#else
const uint rounding = 1;
#endif
#else
const uint KS = 16;  // (lavapipe offers 32 KiB of shared memory)
#define rounding pc.rounding
#endif
const uint A_WORDS = (KS + 8) / 2, B_WORDS = (64 + 8) / 2;  // words per staged row
shared uint stage_a[64 * A_WORDS], stage_b[KS * B_WORDS];
shared float scratch[8 * 256];  // each subgroup's 16 x 16 fragment on its way out, row-major

uint bf16_bits(float v) {
    uint bits = floatBitsToUint(v);
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}
uint pack16(float lo, float hi) {
    return rounding == 2u ? bf16_bits(lo) | (bf16_bits(hi) << 16) : packHalf2x16(vec2(lo, hi));
}
float largest() { return rounding == 2u ? 3.38953139e38 : 65504.0; }  // the type's largest finite value

#if defined(COOPMAT)
#define ACCUMULATORS(f0, f1) FRAGMENT_C f0 = FRAGMENT_C(0.0), f1 = FRAGMENT_C(0.0);
#define FRAGMENT_STEP(f0, f1, kk)                                                                  \
    {                                                                                              \
        FRAGMENT_A fa;                                                                             \
        FRAGMENT_B fb0, fb1;                                                                       \
        LOAD_FRAGMENT(fa, stage_a, frag_row * A_WORDS + (kk) / 2, A_WORDS, ROW_MAJOR);             \
        LOAD_FRAGMENT(fb0, stage_b, (kk) * B_WORDS + frag_col / 2, B_WORDS, ROW_MAJOR);            \
        LOAD_FRAGMENT(fb1, stage_b, (kk) * B_WORDS + (frag_col + 16) / 2, B_WORDS, ROW_MAJOR);     \
        f0 = MUL_ADD(fa, fb0, f0);                                                                 \
        f1 = MUL_ADD(fa, fb1, f1);                                                                 \
    }
#define STORE_ACCUMULATOR(f) STORE_FRAGMENT(f, scratch, 256 * (tid / 32), 16, ROW_MAJOR)
#else
// Emulated: invocation `lane` of a subgroup sums a fragment's row lane / 2, columns 8 (lane % 2)..
float staged(uint word, uint half_) {
    uint bits = (word >> (16 * half_)) & 0xffffu;
    return rounding == 2u ? uintBitsToFloat(bits << 16) : unpackHalf2x16(bits).x;
}
float staged_a(uint i, uint k) { return staged(stage_a[i * A_WORDS + k / 2], k % 2); }
float staged_b(uint k, uint j) { return staged(stage_b[k * B_WORDS + j / 2], j % 2); }
void emulated_step(inout float f0[8], inout float f1[8], uint kk) {
    uint lane = tid % 32, r = frag_row + lane / 2, col = frag_col + 8 * (lane % 2);
    for (uint k = kk; k < kk + 16; ++k) {
        float a = staged_a(r, k);
        for (uint x = 0; x < 8; ++x) {
            f0[x] += a * staged_b(k, col + x);
            f1[x] += a * staged_b(k, col + 16 + x);
        }
    }
}
void emulated_store(float f[8]) {
    uint lane = tid % 32, at = 256 * (tid / 32) + 16 * (lane / 2) + 8 * (lane % 2);
    for (uint x = 0; x < 8; ++x) scratch[at + x] = f[x];
}
#define ACCUMULATORS(f0, f1) float f0[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), f1[8] = f0;
#define FRAGMENT_STEP(f0, f1, kk) emulated_step(f0, f1, kk);
#define STORE_ACCUMULATOR(f) emulated_store(f)
#endif

// Whether a staged value is one the 16-bit type cannot hold: then this chunk is the f32 form's.
bool exact_needed;
shared uint chunk_flag;
float checked(float v) {
    if (!(abs(v) <= largest())) exact_needed = true;
    return v;
}

// acc[x][y] += this invocation's elements of the fragment `which` (0: columns frag_col.., 1: 16 further) in the scratch
void take_fragment(inout float acc[4][4], uint which) {
    uint lane = tid % 32, col = 4 * (lane / 4);
    if (col / 16 != which) return;
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) acc[x][y] += scratch[256 * (tid / 32) + 16 * (4 * (lane % 4) + x) + col % 16 + y];
}

// STAGED_PRODUCT's sums on fragments, KS terms staged at a time, each term checked and rounded;
// an invocation stages pairs of consecutive elements of a staged row (A's terms, B's columns),
// consecutive invocations reading consecutive elements of the operand in memory (A_K, B_K as there).
#define PRODUCT(acc, KN, LOAD_A, A_K, LOAD_B, B_K, ALLOW)                                         \
    {                                                                                             \
        ACCUMULATORS(f0, f1)                                                                      \
        for (uint k0 = 0; k0 < (KN); k0 += KS) {                                                  \
            barrier();                                                                            \
            for (uint m = 0; m < 32 * KS / 256; ++m) {                                            \
                uint el = tid + 256 * m;                                                          \
                uint ka = A_K ? 2 * (el % (KS / 2)) : 2 * (el / 64), ia = A_K ? el / (KS / 2) : el % 64; \
                uint kb = B_K ? el % KS : el / 32, jb = B_K ? 2 * (el / KS) : 2 * (el % 32);      \
                float a0 = LOAD_A(i0 + ia, k0 + ka), a1 = LOAD_A(i0 + ia, k0 + ka + 1);           \
                float b0 = LOAD_B(k0 + kb, j0 + jb), b1 = LOAD_B(k0 + kb, j0 + jb + 1);           \
                stage_a[ia * A_WORDS + ka / 2] = pack16(checked(a0), checked(a1));                \
                stage_b[kb * B_WORDS + jb / 2] = pack16(checked(b0), checked(b1));                \
            }                                                                                     \
            barrier();                                                                            \
            for (uint kk = 0; kk < KS; kk += 16) FRAGMENT_STEP(f0, f1, kk)                        \
        }                                                                                         \
        barrier();                                                                                \
        STORE_ACCUMULATOR(f0);                                                                    \
        barrier();                                                                                \
        take_fragment(acc, 0u);                                                                   \
        barrier();                                                                                \
        STORE_ACCUMULATOR(f1);                                                                    \
        barrier();                                                                                \
        take_fragment(acc, 1u);                                                                   \
    }
#define COLUMN_PARTIAL(row, col) scratch[64 * (row) + (col)]

// Whether the f32 form must do this chunk instead, this form's verdict: cleared before the chunk's
// work, written after it.
bool f32_form_only() {
    exact_needed = false;
    if (gl_LocalInvocationID.x == 0) chunk_flag = 0;
    return false;
}
void write_verdict() {
    if (exact_needed) atomicOr(chunk_flag, 1u);
    barrier();
    if (gl_LocalInvocationID.x == 0) pc.flags.v[flat_group()] = float(chunk_flag);
}
#else
#define PRODUCT STAGED_PRODUCT
#define COLUMN_PARTIAL(row, col) As[row][(col) / 4][(col) % 4]
// After the fragment form (flags given), only the chunks it flagged.
bool f32_form_only() { return uint64_t(pc.flags) != 0 && pc.flags.v[flat_group()] == 0.0; }
void write_verdict() {}
#endif

void clear(inout float acc[4][4]) {
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) acc[x][y] = 0.0;
}

// The chunk's log decays a, f[t] = exp(a_0 + .. + a_t), e[s] = exp(a_{s+1} + .. + a_{nq-1}).
void load_decays() {
    uint group = flat_group();
    q = group % pc.c;
    h = (group / pc.c) % pc.H;
    n = group / (pc.c * pc.H);
    grp = h / (pc.H / pc.G);
    nq = min(pc.L, pc.T - q * pc.L);
    t0 = q * pc.L + pc.T * n;
    plane = pc.D * pc.P * (h + pc.H * (q + pc.c * n));
    tid = gl_LocalInvocationID.x;
#if defined(FRAGMENTS)
    uint sg = tid / 32, lane = tid % 32;
    tx = 4 * (sg % 4) + lane % 4;
    ty = 8 * (sg / 4) + lane / 4;
    frag_row = 16 * (sg % 4);
    frag_col = 32 * (sg / 4);
#else
    tx = tid % 16;
    ty = tid / 16;
#endif
    if (tid < nq) a[tid] = pc.la.v[h + pc.H * (t0 + tid)];
    barrier();
    if (tid < nq) {
        float sum = 0.0;
        for (uint r = 0; r <= tid; ++r) sum += a[r];
        f[tid] = exp(sum);
        float later = 0.0;
        for (uint r = tid + 1; r < nq; ++r) later += a[r];
        e[tid] = exp(later);
    }
    barrier();
}

// exp(a_{s+1} + .. + a_t): the decay from token s to token t (s <= t)
float K(uint t, uint s) {
    float sum = 0.0;
    for (uint r = s + 1; r <= t; ++r) sum += a[r];
    return exp(sum);
}

// This invocation's pairs (t = ri(x), s = cj(y)) of C_t . B_s (every pair, the triangle's used)
void scores(out float S[4][4]) {
    clear(S);
    uint i0 = 0, j0 = 0;
#define LOAD_C(t, d) C_(t, d)
#define LOAD_B(d, s) B_(s, d)
    PRODUCT(S, pc.D, LOAD_C, true, LOAD_B, true, ANY)
#undef LOAD_C
#undef LOAD_B
}

// pairs[t, s] = value[x][y] times K[t, s] below the diagonal (this invocation's pairs)
void store_decayed(float value[4][4]) {
    barrier();
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);
            if (t < nq && s <= t) pairs[t * LMAX + s] = value[x][y] * K(t, s);
        }
    barrier();
}

#if defined(OWN_STATES) || defined(START_GRADS)
void main() {
    if (f32_form_only()) return;  // uniform: the whole workgroup
    load_decays();
    for (uint i0 = 0; i0 < pc.D; i0 += 64)
        for (uint j0 = 0; j0 < pc.P; j0 += 64) {
            float acc[4][4];
            clear(acc);
#if defined(OWN_STATES)
#define LOAD_L(d, t) B_(t, d)
#define LOAD_R(t, p) e_(t) * u_(t, p)
#else
#define LOAD_L(d, t) C_(t, d)
#define LOAD_R(t, p) f_(t) * gy(t, p)
#endif
            PRODUCT(acc, nq, LOAD_L, false, LOAD_R, false, ANY)
            for (uint x = 0; x < 4; ++x)
                for (uint y = 0; y < 4; ++y) {
                    uint d = i0 + ri(x), p = j0 + cj(y);
                    if (d < pc.D && p < pc.P) pc.o.v[plane + d + pc.D * p] = acc[x][y];
                }
        }
#if defined(OWN_STATES)
    if (tid == 0) pc.decay.v[h + pc.H * (q + pc.c * n)] = f[nq - 1];
#endif
    write_verdict();
}
#endif

#if defined(OUTPUTS)
void main() {
    load_decays();
    float S[4][4];
    scores(S);
    store_decayed(S);  // M
    for (uint i0 = 0; i0 < pc.P; i0 += 64) {
        uint j0 = 0;
        float acc[4][4], w[4][4];
        clear(acc);
        clear(w);
#define LOAD_U(p, s) u_(s, p)
#define LOAD_M(s, t) pair(t, s)
        STAGED_PRODUCT(acc, nq, LOAD_U, false, LOAD_M, false, UP_TO_J)
#define LOAD_Z(p, d) Z_(d, p)
#define LOAD_C(d, t) C_(t, d)
        STAGED_PRODUCT(w, pc.D, LOAD_Z, true, LOAD_C, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint p = i0 + ri(x), t = cj(y);
                if (p < pc.P && t < nq) pc.o.v[vec_at(t) + p] = acc[x][y] + f[t] * w[x][y];
            }
    }
}
#endif

#if defined(GRADS)
shared float E[LMAX], F[LMAX], partial[256];

// Sums each column's 16 partials (one per tx) in order: E or F of the column's token, times its decay.
void column_sums(float own[4], bool to_E) {
    barrier();
    for (uint y = 0; y < 4; ++y) COLUMN_PARTIAL(tx, cj(y)) = own[y];
    barrier();
    if (tid < nq) {
        float sum = 0.0;
        for (uint x = 0; x < 16; ++x) sum += COLUMN_PARTIAL(x, tid);
        if (to_E) E[tid] = e[tid] * sum;
        else F[tid] = f[tid] * sum;
    }
}

void main() {
    if (f32_form_only()) return;  // uniform: the whole workgroup
    load_decays();
    // gA = sum(gX * Z), summed in a fixed tree
    float own = 0.0;
    for (uint i = tid; i < pc.D * pc.P; i += 256) own += pc.aux.v[plane + i] * pc.states.v[plane + i];
    partial[tid] = own;
    for (uint width = 128; width > 0; width /= 2) {
        barrier();
        if (tid < width) partial[tid] += partial[tid + width];
    }
    barrier();
    float gA = partial[0];

    float S[4][4], Gk[4][4];
    scores(S);
    clear(Gk);
    {
        uint i0 = 0, j0 = 0;
#define LOAD_GY(t, p) gy(t, p)
#define LOAD_U(p, s) u_(s, p)
        PRODUCT(Gk, pc.P, LOAD_GY, true, LOAD_U, true, ANY)
    }
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);
            if (t < nq && s <= t) Gk[x][y] *= K(t, s);  // G K
        }

    // gu_s = sum_{t >= s} M[t, s] gy_t + e[s] v_s, v_s = gX^T B_s; E[s] = e[s] u_s . v_s, F[t] = f[t] gy_t . Z^T C_t
    store_decayed(S);  // M
    float e_part[4] = float[4](0.0, 0.0, 0.0, 0.0), f_part[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint i0 = 0; i0 < pc.P; i0 += 64) {
        uint j0 = 0;
        float acc[4][4], v[4][4];
        clear(acc);
        clear(v);
#define LOAD_GYT(p, t) gy(t, p)
#define LOAD_M(t, s) pair(t, s)
        PRODUCT(acc, nq, LOAD_GYT, false, LOAD_M, false, FROM_J)
#define LOAD_GX(p, d) gX(d, p)
#define LOAD_BD(d, s) B_(s, d)
        PRODUCT(v, pc.D, LOAD_GX, true, LOAD_BD, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint p = i0 + ri(x), s = cj(y);
                if (p < pc.P && s < nq) pc.o.v[vec_at(s) + p] = acc[x][y] + e[s] * v[x][y];
                e_part[y] += u_(s, p) * v[x][y];
            }
        clear(v);  // w_t = Z^T C_t
#define LOAD_Z(p, d) Z_(d, p)
#define LOAD_CD(d, t) C_(t, d)
        PRODUCT(v, pc.D, LOAD_Z, true, LOAD_CD, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) f_part[y] += gy(cj(y), i0 + ri(x)) * v[x][y];
    }
    column_sums(e_part, true);
    column_sums(f_part, false);

    // gC_t = sum_{s <= t} G K[t, s] B_s + f[t] Z gy_t; gB_s = sum_{t >= s} G K[t, s] C_t + e[s] gX u_s
    barrier();
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);
            if (t < nq && s <= t) pairs[t * LMAX + s] = Gk[x][y];
        }
    uint per_head = pc.D * pc.H * pc.T * pc.N, head_at = pc.D * (h + pc.H * t0);
    for (uint i0 = 0; i0 < pc.D; i0 += 64) {
        uint j0 = 0;
        float tri[4][4], dense[4][4];
        clear(tri);
        clear(dense);
#define LOAD_BS(d, s) B_(s, d)
#define LOAD_PT(s, t) pair(t, s)
        PRODUCT(tri, nq, LOAD_BS, false, LOAD_PT, false, UP_TO_J)
#define LOAD_ZD(d, p) Z_(d, p)
#define LOAD_GYP(p, t) gy(t, p)
        PRODUCT(dense, pc.P, LOAD_ZD, false, LOAD_GYP, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint d = i0 + ri(x), t = cj(y);
                if (d < pc.D && t < nq) pc.bc.v[per_head + head_at + pc.D * pc.H * t + d] = tri[x][y] + f[t] * dense[x][y];
            }
        clear(tri);
        clear(dense);
#define LOAD_CT(d, t) C_(t, d)
#define LOAD_PS(t, s) pair(t, s)
        PRODUCT(tri, nq, LOAD_CT, false, LOAD_PS, false, FROM_J)
#define LOAD_GXD(d, p) gX(d, p)
#define LOAD_UP(p, s) u_(s, p)
        PRODUCT(dense, pc.P, LOAD_GXD, false, LOAD_UP, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint d = i0 + ri(x), s = cj(y);
                if (d < pc.D && s < nq) pc.bc.v[head_at + pc.D * pc.H * s + d] = tri[x][y] + e[s] * dense[x][y];
            }
    }

    // the pairs' gradient of their log decays, G K S, summed down each column from the end, then
    // glog_decay[r] = sum_{s < r} (those sums at r) + sum_{s < r} E[s] + sum_{t >= r} F[t] + A_q gA
    barrier();
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);
            if (t < nq && s <= t) pairs[t * LMAX + s] = Gk[x][y] * S[x][y];
        }
    barrier();
    if (tid < nq) {
        float sum = 0.0;
        for (uint t = nq - 1; t > tid; --t) pairs[t * LMAX + tid] = (sum += pairs[t * LMAX + tid]);
    }
    barrier();
    if (tid < nq) {
        uint r = tid;
        float within = 0.0, before = 0.0, after = 0.0;
        for (uint s = 0; s < r; ++s) within += pairs[r * LMAX + s];
        for (uint s = 0; s < r; ++s) before += E[s];
        for (uint t = nq; t-- > r;) after += F[t];
        pc.o.v[pc.P * pc.H * pc.T * pc.N + h + pc.H * (t0 + r)] = within + before + after + f[nq - 1] * gA;
    }
    write_verdict();
}
#endif
