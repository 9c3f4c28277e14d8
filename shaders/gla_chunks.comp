// gla_chunks and its backward (native/cpu_gla_chunks.cpp has the layouts and formulas): gated
// linear attention in chunks, every chunk's work at once and only the states passed along the
// chunks in order (ssd_pass.comp with a decay per key channel). Variants, each what it writes:
//   DECAYS          per (channel i, chunk) an invocation: E[t, i], F[s, i] (laid out as k) and
//                   the chunk's decay E[n-1, i]
//   PAIRS           per chunk a workgroup: A[t, s] (BACKWARD: dA[t, s] = dy[t] . v[s] too), 0 where s > t
//   OWN_STATES      per 64 x 64 block of a chunk's state a workgroup: X_q[i, j] = sum_s k[s, i] F[s, i] v[s, j]
//   STATE_READS     per (chunk, 64 channels) a workgroup: y's part that reads the start state
//                   (BACKWARD: gv's that reads the end state's gradient)
//   OUTPUTS         per element of y an invocation: the tokens s <= t added
//   START_GRADS     as OWN_STATES: the start state's gradient's own part, g of that start state added
//   STATE_PRODUCTS  per chunk a workgroup: ZY[t, i], ZV[s, i] and W[i]
//   GRADS           per (token, channel) an invocation: gk, gq and glog_gate, and gv's pairs added
// The decays between two tokens are exp of the log gates summed from one token to the other
// (never a difference of two running sums, which loses the digits of gates near 1), so none is
// above 1; a pair's terms are read for s <= t only, so a NaN reaches no earlier token.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats k;        // [S, H, T N]
    Floats v;
    Floats q;
    Floats lg;       // the log gates
    Floats g;        // BACKWARD: the upstream gradient, laid out as the forward's output
    Floats states;   // the states at the chunks' starts Z_q [S S, c, H, N] (OWN_STATES writes X_q there)
    Floats planes;   // BACKWARD: the gradients of the chunks' end states dZ'_q, laid out as states
    Floats scratch;  // decay [S, c, H, N], E, F, A [L L, c, H, N]; BACKWARD: dA, W, ZY, ZV
    Floats o;        // OUTPUTS: y; GRADS: [gk, gv, gq, glog_gate]
    uint S;
    uint H;
    uint T;          // tokens per sequence
    uint N;
    uint L;
    uint c;
    float scale;
} pc;

// The scratch's arrays: Y floats each token-shaped one, P the planes (chunks of every head).
uint Y() { return pc.S * pc.H * pc.T * pc.N; }
uint P() { return pc.c * pc.H * pc.N; }
uint E_at() { return pc.S * P(); }
uint F_at() { return E_at() + Y(); }
uint A_at() { return F_at() + Y(); }
uint dA_at() { return A_at() + pc.L * pc.L * P(); }
uint W_at() { return dA_at() + pc.L * pc.L * P(); }
uint ZY_at() { return W_at() + pc.S * P(); }
uint ZV_at() { return ZY_at() + Y(); }

// This invocation's chunk: its plane (b H + h) c + q, its tokens n, its first token's vector.
uint plane, n, first;
uint stride() { return pc.S * pc.H; }  // a token's vector to the next's
uint tok(uint t) { return first + t * stride(); }

void chunk_of_plane(uint p) {
    plane = p;
    uint q = p % pc.c, bh = p / pc.c, h = bh % pc.H, b = bh / pc.H;
    n = min(pc.L, pc.T - q * pc.L);
    first = ((b * pc.T + q * pc.L) * pc.H + h) * pc.S;
}

// For an element e of a token-shaped array: its chunk, and its token t in the chunk (returned).
uint chunk_of_element(uint e) {
    uint h = (e / pc.S) % pc.H, token = e / stride(), b = token / pc.T, within = token % pc.T;
    uint q = within / pc.L;
    chunk_of_plane((b * pc.H + h) * pc.c + q);
    return within % pc.L;
}

float lg(uint t, uint i) { return pc.lg.v[tok(t) + i]; }
float E(uint t, uint i) { return pc.scratch.v[E_at() + tok(t) + i]; }
float F(uint s, uint i) { return pc.scratch.v[F_at() + tok(s) + i]; }
float A(uint t, uint s) { return pc.scratch.v[A_at() + pc.L * (pc.L * plane + t) + s]; }
float dA(uint t, uint s) { return pc.scratch.v[dA_at() + pc.L * (pc.L * plane + t) + s]; }


// For the staged kernels, each 0 outside the chunk's tokens and the channels (common.glsl's element:
// read without a branch): channel i of token t of a token-shaped array that starts `at` floats in
// (0: an input; E_at(), F_at(): the scratch's), element [i, j] of this chunk's state plane, and
// the two products of token vectors that the blocked products take.
float token_element(Floats array, uint at, uint t, uint i) {
    return element(array, at + tok(t) + i, t < n && i < pc.S);
}
float state_element(Floats array, uint i, uint j) {
    return element(array, pc.S * (pc.S * plane + i) + j, i < pc.S && j < pc.S);
}
float kF(uint s, uint i) { return token_element(pc.k, 0, s, i) * token_element(pc.scratch, F_at(), s, i); }
float qE(uint t, uint i) { return pc.scale * token_element(pc.q, 0, t, i) * token_element(pc.scratch, E_at(), t, i); }

#if defined(DECAYS)
void main() {
    uint id = flat_invocation(), i = id % pc.S;
    if (id >= pc.S * P()) return;
    chunk_of_plane(id / pc.S);
    float sum = 0.0;
    for (uint t = 0; t < n; ++t) {  // from the chunk's start through t
        sum += lg(t, i);
        pc.scratch.v[E_at() + tok(t) + i] = exp(sum);
    }
    pc.scratch.v[id] = exp(sum);  // the chunk's decay
    sum = 0.0;
    pc.scratch.v[F_at() + tok(n - 1) + i] = 1.0;
    for (uint s = n - 1; s-- > 0;) {  // from s + 1 through the chunk's last
        sum += lg(s + 1, i);
        pc.scratch.v[F_at() + tok(s) + i] = exp(sum);
    }
}
#endif

#if defined(PAIRS) || defined(STATE_PRODUCTS)
const uint LMAX = 64;  // the longest chunk on the GPU (vk_chunk_kernels.cpp refuses longer)
#endif

#if defined(PAIRS)
// A workgroup per chunk, the channels 16 at a time through shared memory: each invocation one
// token s and the tokens t = s + lane, s + lane + lanes, .. (at most 16), so that it sums the log
// gates from s + 1 up once for all its t.
shared float lgs[LMAX][17], qs[LMAX][17], ks[LMAX][17];  // [token][channel of the block]
#if defined(BACKWARD)
shared float gs[LMAX][17], vs[LMAX][17];
#endif

void main() {
    if (flat_group() >= P()) return;  // a whole workgroup of the folded grid's padding
    chunk_of_plane(flat_group());
    uint tid = gl_LocalInvocationID.x, lanes = 256 / pc.L, s = tid / lanes, lane = tid % lanes;
    float a[16], da[16];
    for (uint m = 0; m < 16; ++m) a[m] = da[m] = 0.0;
    for (uint i0 = 0; i0 < pc.S; i0 += 16) {
        barrier();
        for (uint el = tid; el < LMAX * 16; el += 256) {
            uint t = el / 16, i = i0 + el % 16;
            lgs[t][el % 16] = token_element(pc.lg, 0, t, i);
            qs[t][el % 16] = token_element(pc.q, 0, t, i);
            ks[t][el % 16] = token_element(pc.k, 0, t, i);
#if defined(BACKWARD)
            gs[t][el % 16] = token_element(pc.g, 0, t, i);
            vs[t][el % 16] = token_element(pc.v, 0, t, i);
#endif
        }
        barrier();
        if (s >= n) continue;
        for (uint i = 0; i < 16; ++i) {
            float sum = 0.0;  // the log gates from s + 1 through t
            uint r = s;
            for (uint m = 0; m < 16; ++m) {
                uint t = s + lane + lanes * m;
                if (t >= n) break;
                while (r < t) sum += lgs[++r][i];
                a[m] += qs[t][i] * ks[s][i] * exp(sum);
#if defined(BACKWARD)
                da[m] += gs[t][i] * vs[s][i];
#endif
            }
        }
    }
    uint LL = pc.L * pc.L, at = LL * plane;
    for (uint m = 0; m < 16; ++m) {
        uint t = s + lane + lanes * m;
        if (s >= n || t >= n) break;
        pc.scratch.v[A_at() + at + pc.L * t + s] = pc.scale * a[m];
#if defined(BACKWARD)
        pc.scratch.v[dA_at() + at + pc.L * t + s] = da[m];
#endif
    }
    for (uint p = tid; p < LL; p += 256) {  // the pairs no invocation owns: 0
        uint row = p / pc.L, column = p % pc.L;
        if (row >= n || column > row) {
            pc.scratch.v[A_at() + at + p] = 0.0;
#if defined(BACKWARD)
            pc.scratch.v[dA_at() + at + p] = 0.0;
#endif
        }
    }
}
#endif

#if defined(OWN_STATES) || defined(START_GRADS)
// A workgroup per 64 x 64 block of a chunk's state, its sum over the chunk's tokens a blocked
// product (staged_product.glsl).
#include "staged_product.glsl"

void main() {
    uint blocks = (pc.S + 63) / 64, group = flat_group(), block = group % (blocks * blocks);
    if (group >= P() * blocks * blocks) return;  // a whole workgroup of the folded grid's padding
    chunk_of_plane(group / (blocks * blocks));
    staged_product_invocation();
    uint i0 = 64 * (block / blocks), j0 = 64 * (block % blocks), SS = pc.S * pc.S;
    float acc[4][4];
    clear(acc);
#if defined(OWN_STATES)
    // X_q[i, j] = sum_s k[s, i] F[s, i] v[s, j]: the chunk's tokens decayed to its end
#define LOAD_KF(i, s) kF(s, i)
#define LOAD_V(s, j) token_element(pc.v, 0, s, j)
    STAGED_PRODUCT(acc, n, LOAD_KF, false, LOAD_V, false, ANY)
#else
    // gZ_q[i, j] = sum_t scale q[t, i] E[t, i] dy[t, j]
#define LOAD_QE(i, t) qE(t, i)
#define LOAD_DY(t, j) token_element(pc.g, 0, t, j)
    STAGED_PRODUCT(acc, n, LOAD_QE, false, LOAD_DY, false, ANY)
#endif
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint i = i0 + ri(x), j = j0 + cj(y), at = SS * plane + pc.S * i + j;
            if (i >= pc.S || j >= pc.S) continue;
#if defined(OWN_STATES)
            pc.states.v[at] = acc[x][y];
#else
            pc.planes.v[at] = pc.g.v[Y() + SS * pc.H * pc.N + at] + acc[x][y];  // g of this start state added
#endif
        }
}
#endif

#if defined(STATE_READS)
// A workgroup per (chunk, 64 channels j): what each token reads of a state, a blocked product
// (staged_product.glsl) over its channels i into the output, which OUTPUTS and GRADS then add to:
// y's part sum_i Z[i, j] scale q[t, i] E[t, i]; BACKWARD: gv's sum_i dZ'[i, j] k[s, i] F[s, i].
#include "staged_product.glsl"

void main() {
    uint blocks = (pc.S + 63) / 64, group = flat_group();
    if (group >= P() * blocks) return;  // a whole workgroup of the folded grid's padding
    chunk_of_plane(group / blocks);
    staged_product_invocation();
    uint i0 = 64 * (group % blocks), j0 = 0;
    float acc[4][4];  // [channel j][token]
    clear(acc);
#if defined(BACKWARD)
#define LOAD_M(j, i) state_element(pc.planes, i, j)
#define LOAD_T(i, t) kF(t, i)
    uint to = Y();  // gv's slot
#else
#define LOAD_M(j, i) state_element(pc.states, i, j)
#define LOAD_T(i, t) qE(t, i)
    uint to = 0;  // y
#endif
    STAGED_PRODUCT(acc, pc.S, LOAD_M, false, LOAD_T, true, ANY)
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint j = i0 + ri(x), t = cj(y);
            if (j < pc.S && t < n) pc.o.v[to + tok(t) + j] = acc[x][y];
        }
}
#endif

#if defined(OUTPUTS)
void main() {
    uint id = flat_invocation();
    if (id >= Y()) return;
    uint t = chunk_of_element(id), j = id % pc.S;
    float y = pc.o.v[id];  // the start state's part (STATE_READS)
    for (uint s = 0; s <= t; ++s) y += A(t, s) * pc.v.v[tok(s) + j];
    pc.o.v[id] = y;
}
#endif

#if defined(STATE_PRODUCTS)
// A workgroup per chunk: each invocation a channel i of a block of 64 and the tokens t = lane,
// lane + 4, .. (at most 16), the sums over j 16 at a time through shared memory (rows of Z and dZ'
// read along j, the tokens' vectors along j: every load coalesces).
shared float Zs[16][65], dZs[16][65];    // [j of the block][i of the block]
shared float gs[16][LMAX + 1], vs[16][LMAX + 1];  // [j of the block][token]

void main() {
    if (flat_group() >= P()) return;  // a whole workgroup of the folded grid's padding
    chunk_of_plane(flat_group());
    uint tid = gl_LocalInvocationID.x, ii = tid % 64, lane = tid / 64;
    for (uint i0 = 0; i0 < pc.S; i0 += 64) {
        float zy[16], zv[16], w = 0.0;  // tokens lane + 4 m (every 4 m < n: a uniform bound)
        for (uint m = 0; m < 16; ++m) zy[m] = zv[m] = 0.0;
        for (uint j0 = 0; j0 < pc.S; j0 += 16) {
            barrier();
            for (uint el = tid; el < 1024; el += 256) {
                uint jj = el % 16, j = j0 + jj, i = i0 + el / 16, t = el / 16;
                Zs[jj][el / 16] = state_element(pc.states, i, j);
                dZs[jj][el / 16] = state_element(pc.planes, i, j);
                gs[jj][t] = token_element(pc.g, 0, t, j);
                vs[jj][t] = token_element(pc.v, 0, t, j);
            }
            barrier();
            for (uint jj = 0; jj < 16; ++jj) {
                float z = Zs[jj][ii], dz = dZs[jj][ii];
                w += z * dz;
                for (uint m = 0; m < 16; ++m) {
                    if (4 * m >= n) continue;
                    zy[m] += z * gs[jj][lane + 4 * m];
                    zv[m] += dz * vs[jj][lane + 4 * m];
                }
            }
        }
        uint i = i0 + ii;
        for (uint m = 0; m < 16 && i < pc.S; ++m) {
            uint t = lane + 4 * m;
            if (t >= n) break;
            pc.scratch.v[ZY_at() + tok(t) + i] = zy[m];
            pc.scratch.v[ZV_at() + tok(t) + i] = zv[m];
        }
        if (lane == 0 && i < pc.S) pc.scratch.v[W_at() + pc.S * plane + i] = w;
    }
}
#endif

#if defined(GRADS)
float ZY(uint t, uint i) { return pc.scratch.v[ZY_at() + tok(t) + i]; }
float ZV(uint s, uint i) { return pc.scratch.v[ZV_at() + tok(s) + i]; }

void main() {
    uint id = flat_invocation();
    if (id >= Y()) return;
    uint x = chunk_of_element(id), ch = id % pc.S;
    float gv = pc.o.v[Y() + id];  // the end state's part (STATE_READS)
    for (uint t = x; t < n; ++t) gv += A(t, x) * pc.g.v[tok(t) + ch];

    float gk = 0.0, sum = 0.0;  // sum: the log gates from x + 1 through t
    for (uint t = x; t < n; ++t) {
        if (t > x) sum += lg(t, ch);
        gk += dA(t, x) * pc.q.v[tok(t) + ch] * exp(sum);
    }
    gk = pc.scale * gk + F(x, ch) * ZV(x, ch);

    float gq = E(x, ch) * ZY(x, ch);
    sum = 0.0;  // the log gates from s + 1 through x
    for (uint s = x + 1; s-- > 0;) {
        if (s < x) sum += lg(s + 1, ch);
        gq += dA(x, s) * pc.k.v[tok(s) + ch] * exp(sum);
    }

    // each decay that spans log gate x: the start state's to the tokens t >= x, the tokens s < x
    // to the end, and the pairs s < x <= t
    float span = E(n - 1, ch) * pc.scratch.v[W_at() + pc.S * plane + ch];
    for (uint t = x; t < n; ++t) span += pc.scale * pc.q.v[tok(t) + ch] * E(t, ch) * ZY(t, ch);
    float base = 0.0;  // the log gates from s + 1 through x
    for (uint s = x; s-- > 0;) {
        base += lg(s + 1, ch);
        float pairs = 0.0;
        sum = base;
        for (uint t = x; t < n; ++t) {
            if (t > x) sum += lg(t, ch);
            pairs += dA(t, s) * pc.q.v[tok(t) + ch] * exp(sum);
        }
        span += pc.k.v[tok(s) + ch] * (F(s, ch) * ZV(s, ch) + pc.scale * pairs);
    }
    pc.o.v[id] = gk;
    pc.o.v[Y() + id] = gv;
    pc.o.v[2 * Y() + id] = pc.scale * gq;
    pc.o.v[3 * Y() + id] = span;
}
#endif
