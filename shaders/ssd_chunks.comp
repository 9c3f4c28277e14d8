// ssm_scan's chunked form (SSD) and its backward, the work of each chunk (native/cpu_ssd_chunks.cpp
// has the layouts, the formulas and the same order of sums): a workgroup per (chunk, head,
// sequence), all of them at once; only ssd_pass.comp walks the chunks in order. Variants:
//   SCORES      S[t, s] = C_t . B_s of every pair of the chunk's tokens, once per (chunk, group,
//               sequence): a group's heads share B and C, so they share S (read by OUTPUTS,
//               GRADS_U and GRADS_PAIRS)
//   OWN_STATES  X_q = sum_s B_s (e[s] u_s)^T into the chunk's plane, and the chunk's decay A_q
//   START_GRADS gZ_q = sum_t C_t (f[t] gy_t)^T into the chunk's plane
//   OUTPUTS     y_t = sum_{s <= t} M[t, s] u_s + f[t] Z_q^T C_t
//   GRADS_U     gu
//   GRADS_PAIRS each head's pairs' gradient G K, and glog_decay's terms through the pairs and gA
//   STATE_GRADS_C, STATE_GRADS_B  each head's terms of gC (gB) through its states (summed over a
//               group's heads by ssd_pass.comp's GROUP_SUM where groups hold several), and F (E) of
//               its tokens
//   PAIR_GRADS  once per (chunk, group, sequence): the group's heads' G K summed, and the terms of
//               gB and gC through the pairs added to theirs (B and C are the group's: one product
//               of the heads' sum for the group, where each head made its own); the group's heads'
//               terms of glog_decay through E and F added to theirs
// Every product is a blocked one (staged_product.glsl): a 64 x 64 block of its output at a time,
// each invocation 4 x 4 of it, its operands staged through shared memory 16 terms at a time. The products over a
// chunk's pairs of tokens (the triangle s <= t) add only the pairs' terms, so a NaN in a token
// never reaches the outputs of the tokens before it.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats u;       // [P, H, T, N]
    Floats la;      // the log decays [H, T, N]
    Floats B;       // [D, G, T, N]
    Floats C;
    Floats g;       // START_GRADS and the backward's later kernels: the gradient of y, laid out as u
    Floats states;  // OUTPUTS, GRADS_*, STATE_GRADS_*: the start states Z [D P, H, c, N]
    Floats aux;     // GRADS_*, STATE_GRADS_*: gX [D P, H, c, N]
    Floats o;       // SCORES: the scores; OWN_STATES, START_GRADS: planes [D P, H, c, N]; OUTPUTS: y;
                    // GRADS_*, PAIR_GRADS: [gu, glog_decay]
    Floats bc;      // STATE_GRADS_*: gB, then gC, per head [D, H, T, N] each; PAIR_GRADS: the output's [D, G, T, N]
    Floats per_chunk; // OWN_STATES: each chunk's decay A_q [H, c, N]; STATE_GRADS_*: E, then F, of each
                    // head's tokens [L, H, c, N] each (read by PAIR_GRADS)
    Floats scores;  // [L L, G, c, N]: S of each (chunk, group), row t at t L (written by SCORES)
    Floats pairs_g; // [L L, H, c, N]: each head's G K, s <= t only (written by GRADS, read by PAIR_GRADS)
    uint P;
    uint H;
    uint T;
    uint N;
    uint D;
    uint G;
    uint L;
    uint c;
} pc;

const uint LMAX = 64;  // native/ssd_chunks.hpp: kSsdMaxChunk
shared float a[LMAX], f[LMAX], e[LMAX];
const uint ROW = LMAX + 1;  // a row of pairs every 65 floats: at 64 the pairs of one column (s fixed,
                            // t varying) shared a bank, and the invocations of a warp reading them at
                            // once (the sums along rows, the 4 x 4 blocks of pairs) waited on it in turn
shared float pairs[LMAX * ROW];        // [t * ROW + s], s <= t
#include "staged_product.glsl"

uint q, h, n, grp, nq, t0, plane;  // this invocation; this chunk: its tokens, the first's index along T N

uint vec_at(uint t) { return pc.P * (h + pc.H * (t0 + t)); }  // u's, y's, g's token t
uint bc_at(uint t) { return pc.D * (grp + pc.G * (t0 + t)); }  // B's, C's token t
// Each operand's element, 0 outside the chunk and the sizes (and past a product's terms: no other
// bound is needed), read without a branch (common.glsl's element).
float u_(uint t, uint p) { return element(pc.u, vec_at(t) + p, t < nq && p < pc.P); }
float gy(uint t, uint p) { return element(pc.g, vec_at(t) + p, t < nq && p < pc.P); }
float B_(uint t, uint d) { return element(pc.B, bc_at(t) + d, t < nq && d < pc.D); }
float C_(uint t, uint d) { return element(pc.C, bc_at(t) + d, t < nq && d < pc.D); }
float Z_(uint d, uint p) { return element(pc.states, plane + d + pc.D * p, d < pc.D && p < pc.P); }
float gX(uint d, uint p) { return element(pc.aux, plane + d + pc.D * p, d < pc.D && p < pc.P); }
// the same for the shared arrays (which GLSL cannot pass)
float pair(uint t, uint s) {
    float v = pairs[t < nq && s < nq ? t * ROW + s : 0];
    return t < nq && s < nq ? v : 0.0;
}
float e_(uint t) {
    float v = e[t % LMAX];
    return t < nq ? v : 0.0;
}
float f_(uint t) {
    float v = f[t % LMAX];
    return t < nq ? v : 0.0;
}

// This workgroup's chunk q of sequence n and its lane (a head, or a group where `lanes` is G).
uint locate_chunk(uint lanes) {
    staged_product_invocation();
    uint group = flat_group();
    q = group % pc.c;
    n = group / (pc.c * lanes);
    nq = min(pc.L, pc.T - q * pc.L);
    t0 = q * pc.L + pc.T * n;
    return (group / pc.c) % lanes;
}

// Where the pairs of chunk q's lane (a group's S, a head's G K) begin: [L L, lanes, c, N]
uint pairs_at(uint lane, uint lanes) { return pc.L * pc.L * (lane + lanes * (q + pc.c * n)); }

// Where E (which 0) or F (which 1) of this chunk's tokens of head `head` begin: [L, H, c, N] each
uint token_terms_at(uint which, uint head) { return pc.L * (which * pc.H * pc.c * pc.N + head + pc.H * (q + pc.c * n)); }

// Where glog_decay of this chunk's token r of head `head` lies in GRADS_PAIRS' and PAIR_GRADS' o (after gu)
uint glog_decay_at(uint head, uint r) { return pc.P * pc.H * pc.T * pc.N + head + pc.H * (t0 + r); }

// The chunk's log decays a, f[t] = exp(a_0 + .. + a_t), e[s] = exp(a_{s+1} + .. + a_{nq-1}).
void load_decays() {
    h = locate_chunk(pc.H);
    grp = h / (pc.H / pc.G);
    plane = pc.D * pc.P * (h + pc.H * (q + pc.c * n));
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

// The chunk's pairs row by row, each invocation every 256th: its m-th pair's t and s
uint row_pair_t(uint m) { return (tid + 256 * m) / LMAX; }
uint row_pair_s(uint m) { return (tid + 256 * m) % LMAX; }

// Those pairs' C_t . B_s, as SCORES left them, for s <= t < nq (else 0): read a row at a time
void load_row_scores(out float S[16]) {
    uint at = pairs_at(grp, pc.G);
    for (uint m = 0; m < 16; ++m) {
        uint t = row_pair_t(m), s = row_pair_s(m);
        S[m] = element(pc.scores, at + t * pc.L + s, t < nq && s <= t);
    }
}

#if defined(OUTPUTS) || defined(GRADS_U) || defined(GRADS_PAIRS)
// pairs[t, s] = K[t, s] = exp(a_{s+1} + .. + a_t) (s <= t < nq), the decay from token s to token t,
// until store_M multiplies each by its pair's score: each column s summed down from t = s, in
// the order the CPU sums it (a loop per pair took up to 63 steps for each of an invocation's 16
// pairs, one after another).
void load_pair_decays() {
    if (tid < nq) {
        float sum = 0.0;
        pairs[tid * ROW + tid] = exp(sum);
        uint t = tid + 1;
        for (; t + 4 <= nq; t += 4) {  // 4 tokens' log decays read at once, added in order
            float a0 = a[t], a1 = a[t + 1], a2 = a[t + 2], a3 = a[t + 3];
            float s0 = sum + a0, s1 = s0 + a1, s2 = s1 + a2;
            sum = s2 + a3;
            pairs[t * ROW + tid] = exp(s0);
            pairs[(t + 1) * ROW + tid] = exp(s1);
            pairs[(t + 2) * ROW + tid] = exp(s2);
            pairs[(t + 3) * ROW + tid] = exp(sum);
        }
        for (; t < nq; ++t) {
            sum += a[t];
            pairs[t * ROW + tid] = exp(sum);
        }
    }
    barrier();
}

float K(uint t, uint s) { return pairs[t * ROW + s]; }  // while pairs holds the decays
#endif

#if defined(OUTPUTS) || defined(GRADS_U)
// pairs[t, s] = M[t, s] = S[t, s] K[t, s] below the diagonal, each invocation's pairs every 256th
// of the chunk's in order (the scores read a row at a time; each decay read where it is replaced)
void store_M() {
    float S[16];
    load_row_scores(S);
    for (uint m = 0; m < 16; ++m) {
        uint t = row_pair_t(m), s = row_pair_s(m);
        if (t < nq && s <= t) pairs[t * ROW + s] = S[m] * K(t, s);
    }
    barrier();
}
#endif

#if defined(SCORES)
void main() {
    grp = locate_chunk(pc.G);
    float S[4][4];
    clear(S);
    uint i0 = 0, j0 = 0;
#define LOAD_C(t, d) C_(t, d)
#define LOAD_B(d, s) B_(s, d)
    STAGED_PRODUCT(S, pc.D, LOAD_C, true, LOAD_B, true, ANY)
    uint at = pairs_at(grp, pc.G);
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);
            if (t < nq && s < nq) pc.o.v[at + t * pc.L + s] = S[x][y];
        }
}
#endif

#if defined(OWN_STATES) || defined(START_GRADS)
void main() {
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
            STAGED_PRODUCT(acc, nq, LOAD_L, false, LOAD_R, false, ANY)
            for (uint x = 0; x < 4; ++x)
                for (uint y = 0; y < 4; ++y) {
                    uint d = i0 + ri(x), p = j0 + cj(y);
                    if (d < pc.D && p < pc.P) pc.o.v[plane + d + pc.D * p] = acc[x][y];
                }
        }
#if defined(OWN_STATES)
    if (tid == 0) pc.per_chunk.v[h + pc.H * (q + pc.c * n)] = f[nq - 1];
#endif
}
#endif

#if defined(OUTPUTS)
void main() {
    load_decays();
    load_pair_decays();
    store_M();
    for (uint i0 = 0; i0 < pc.P; i0 += 64) {  // one block of sums at a time, both products into it
        uint j0 = 0;
        float acc[4][4];
        clear(acc);  // Z^T (f[t] C_t), the start state's terms, then the pairs': one store, no read back
#define LOAD_Z(p, d) Z_(d, p)
#define LOAD_FC(d, t) (f_(t) * C_(t, d))
        STAGED_PRODUCT(acc, pc.D, LOAD_Z, true, LOAD_FC, true, ANY)
#define LOAD_U(p, s) u_(s, p)
#define LOAD_M(s, t) pair(t, s)
        STAGED_PRODUCT(acc, nq, LOAD_U, false, LOAD_M, false, UP_TO_J)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint p = i0 + ri(x), t = cj(y);
                if (p < pc.P && t < nq) pc.o.v[vec_at(t) + p] = acc[x][y];
            }
    }
}
#endif

#if defined(GRADS_U)
// gu_s = sum_{t >= s} M[t, s] gy_t + e[s] v_s, v_s = gX^T B_s
void main() {
    load_decays();
    load_pair_decays();
    store_M();
    for (uint i0 = 0; i0 < pc.P; i0 += 64) {  // one block of sums at a time, both products into it
        uint j0 = 0;
        float acc[4][4];
        clear(acc);  // gX^T (e[s] B_s), then the pairs' terms: one store, no read back
#define LOAD_GX(p, d) gX(d, p)
#define LOAD_BD(d, s) (e_(s) * B_(s, d))
        STAGED_PRODUCT(acc, pc.D, LOAD_GX, true, LOAD_BD, true, ANY)
#define LOAD_GYT(p, t) gy(t, p)
#define LOAD_M(t, s) pair(t, s)
        STAGED_PRODUCT(acc, nq, LOAD_GYT, false, LOAD_M, false, FROM_J)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint p = i0 + ri(x), s = cj(y);
                if (p < pc.P && s < nq) pc.o.v[vec_at(s) + p] = acc[x][y];
            }
    }
}
#endif

#if defined(GRADS_PAIRS)
shared float partial[256];

float gX_Z(uint i) { return pc.aux.v[plane + i] * pc.states.v[plane + i]; }  // element i of the plane's gX * Z

// This head's pairs' gradient G K (G[t, s] = gy_t . u_s) for PAIR_GRADS, which adds the terms through
// the pairs to gB and gC; and glog_decay's terms through the pairs, G K S summed down each column
// from the end, then glog_decay[r] = sum_{s < r} (those sums at r) + A_q gA (PAIR_GRADS adds the
// terms through E and F)
void main() {
    load_decays();
    load_pair_decays();
    float Gk[4][4];
    clear(Gk);
    {
        uint i0 = 0, j0 = 0;
#define LOAD_GY(t, p) gy(t, p)
#define LOAD_U(p, s) u_(s, p)
        STAGED_PRODUCT(Gk, pc.P, LOAD_GY, true, LOAD_U, true, ANY)
    }
    float S[16];
    load_row_scores(S);
    for (uint x = 0; x < 4; ++x)
        for (uint y = 0; y < 4; ++y) {
            uint t = ri(x), s = cj(y);  // G K where its decay was: this invocation's own pair
            if (t < nq && s <= t) pairs[t * ROW + s] = Gk[x][y] * K(t, s);  // (nothing reads those above the diagonal)
        }
    barrier();
    uint pg = pairs_at(h, pc.H);
    for (uint m = 0; m < 16; ++m) {  // G K stored a row at a time, and times S kept
        uint t = row_pair_t(m), s = row_pair_s(m);
        if (t < nq && s <= t) {
            float gk = pairs[t * ROW + s];
            pc.pairs_g.v[pg + t * pc.L + s] = gk;
            pairs[t * ROW + s] = gk * S[m];
        }
    }
    barrier();
    if (tid < nq) {
        float sum = 0.0;
        for (uint t = nq - 1; t > tid; --t) pairs[t * ROW + tid] = (sum += pairs[t * ROW + tid]);
    }
    // gA = sum(gX * Z), summed in a fixed tree
    float own = 0.0;
    uint i = tid, plane_size = pc.D * pc.P;
    for (; i + 768 < plane_size; i += 1024) {  // 4 products' reads at once, added in order
        float x0 = gX_Z(i), x1 = gX_Z(i + 256), x2 = gX_Z(i + 512), x3 = gX_Z(i + 768);
        own += x0;
        own += x1;
        own += x2;
        own += x3;
    }
    for (; i < plane_size; i += 256) own += gX_Z(i);
    partial[tid] = own;
    for (uint width = 128; width > 0; width /= 2) {
        barrier();
        if (tid < width) partial[tid] += partial[tid + width];
    }
    barrier();
    float gA = partial[0];
    if (tid < nq) {
        uint r = tid;
        float within = 0.0;
        for (uint s = 0; s < r; ++s) within += pairs[r * ROW + s];
        pc.o.v[glog_decay_at(h, r)] = within + f[nq - 1] * gA;
    }
}
#endif

#if defined(STATE_GRADS_C) || defined(STATE_GRADS_B)
// Each head's terms of gC and gB through its states, gC_t = f[t] Z gy_t (STATE_GRADS_C) and
// gB_s = e[s] gX u_s (STATE_GRADS_B): kernels of their own beside GRADS_U and GRADS_PAIRS (the same
// level of a program: they write apart), whose few live registers let an SM hold more of their
// workgroups. Also the tokens' terms of glog_decay through the states, F[t] = f[t] gy_t . Z^T C_t
// = C_t . gC_t and E[s] = e[s] u_s . gX^T B_s = B_s . gB_s, from those terms as they are made.
#if defined(STATE_GRADS_C)
#define LOAD_STATE(d, p) Z_(d, p)
#define LOAD_TOKEN(p, t) (f_(t) * gy(t, p))
#define OWN_VECTOR(t, d) C_(t, d)
const uint HALF = 1;  // gC's, and F's, half of pc.bc and pc.per_chunk
#else
#define LOAD_STATE(d, p) gX(d, p)
#define LOAD_TOKEN(p, s) (e_(s) * u_(s, p))
#define OWN_VECTOR(s, d) B_(s, d)
const uint HALF = 0;
#endif

// Sums each column's 16 partials (one per tx) in order: the column's token's (tid < nq).
float column_sum(float own[4]) {
    barrier();
    As[tx][ty] = vec4(own[0], own[1], own[2], own[3]);  // row tx, columns cj(0 .. 3)
    barrier();
    float sum = 0.0;
    if (tid < nq)
        for (uint x = 0; x < 16; ++x) sum += As[x][tid / 4][tid % 4];
    return sum;
}

void main() {
    load_decays();
    uint terms_at = HALF * pc.D * pc.H * pc.T * pc.N + pc.D * (h + pc.H * t0);  // this head's token 0
    float part[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint i0 = 0; i0 < pc.D; i0 += 64) {
        uint j0 = 0;
        float dense[4][4];
        clear(dense);
        STAGED_PRODUCT(dense, pc.P, LOAD_STATE, false, LOAD_TOKEN, true, ANY)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint d = i0 + ri(x), t = cj(y);
                if (d < pc.D && t < nq) pc.bc.v[terms_at + pc.D * pc.H * t + d] = dense[x][y];
                part[y] += OWN_VECTOR(t, d) * dense[x][y];
            }
    }
    float sum = column_sum(part);
    if (tid < nq) pc.per_chunk.v[token_terms_at(HALF, h) + tid] = sum;
}
#endif

#if defined(PAIR_GRADS)
// gC_t += sum_{s <= t} P[t, s] B_s, gB_s += sum_{t >= s} P[t, s] C_t, P the group's heads' G K summed
void main() {
    grp = locate_chunk(pc.G);
    uint heads = pc.H / pc.G;
    for (uint i = tid; i < nq * nq; i += 256) {
        uint t = i / nq, s = i % nq;
        float sum = 0.0;
        if (s <= t)
            for (uint j = 0; j < heads; ++j) sum += pc.pairs_g.v[pairs_at(grp * heads + j, pc.H) + t * pc.L + s];
        pairs[t * ROW + s] = sum;
    }
    barrier();
    uint gC_at = pc.D * pc.G * pc.T * pc.N;  // gC after gB in pc.bc
    for (uint i0 = 0; i0 < pc.D; i0 += 64) {
        uint j0 = 0;
        float tri[4][4];
        clear(tri);
#define LOAD_BS(d, s) B_(s, d)
#define LOAD_PT(s, t) pair(t, s)
        STAGED_PRODUCT(tri, nq, LOAD_BS, false, LOAD_PT, false, UP_TO_J)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint d = i0 + ri(x), t = cj(y);
                if (d < pc.D && t < nq) pc.bc.v[gC_at + bc_at(t) + d] += tri[x][y];
            }
        clear(tri);
#define LOAD_CT(d, t) C_(t, d)
#define LOAD_PS(t, s) pair(t, s)
        STAGED_PRODUCT(tri, nq, LOAD_CT, false, LOAD_PS, false, FROM_J)
        for (uint x = 0; x < 4; ++x)
            for (uint y = 0; y < 4; ++y) {
                uint d = i0 + ri(x), s = cj(y);
                if (d < pc.D && s < nq) pc.bc.v[bc_at(s) + d] += tri[x][y];
            }
    }
    // each of the group's heads' glog_decay[r] += sum_{s < r} E[s] + sum_{t >= r} F[t]
    for (uint i = tid; i < heads * nq; i += 256) {
        uint head = grp * heads + i / nq, r = i % nq, E_at = token_terms_at(0, head), F_at = token_terms_at(1, head);
        float before = 0.0, after = 0.0;
        for (uint s = 0; s < r; ++s) before += pc.per_chunk.v[E_at + s];
        for (uint t = nq; t-- > r;) after += pc.per_chunk.v[F_at + t];
        pc.o.v[glog_decay_at(head, r)] += before + after;
    }
}
#endif
