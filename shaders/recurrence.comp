// The matrix-state recurrences of RWKV-6 (WKV6) and gated linear attention (GLA), forward
// (FORWARD) and backward (BACKWARD), as native/cpu_rwkv.cpp computes them; sizes and packed
// layouts in native/recurrence.hpp. One workgroup per (sequence, head), for any head size S (the
// host runs recurrence_registers.comp for S <= 64, the state in registers).
//
// The S x S state is spread over lanes x lanes invocations (lanes = min(S, 16)): invocation
// (a, c) owns rows i = a + lanes*m and columns j = c + lanes*n, and only it ever touches those
// elements, so the state needs no barrier. They live in global memory (the output's new-state
// region forward, the scratch and state-gradient regions backward). Sums over i or over j go through
// shared memory in tiles of TILE rows or columns (16 partial sums each, added in a fixed order:
// deterministic, no atomics, independent of the subgroup size).
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats k;      // [S, H, T]
    Floats v;      // [S, H, T]
    Floats r;      // r (WKV6) or q (GLA) [S, H, T]
    Floats w;      // td (WKV6) or g (GLA) [S, H, T]
    Floats u;      // tf [S, H] (WKV6; unused by GLA)
    Floats state;  // [S*S*H, n_seqs]
    Floats g;      // BACKWARD: the upstream gradient [S*H, T + S*n_seqs]
    Floats o;      // the output
    uint S, H, T, n_seqs, n_chunks;
    uint off_bonus, off_state, off_scratch;  // BACKWARD: regions of the packed output, in elements
    float scale;                             // GLA
} pc;

#define TILE 64u   // rows (or columns) reduced per pass
#define CHUNK 16u  // tokens between stored states (kRecurrenceChunk)
shared float red[4u * 16u * TILE];  // up to 4 quantities x 16 lanes x TILE: 16 KiB

uint S, lanes, per, a, c, tid, L, b, h;

uint vec_at(uint tl) { return ((b * L + tl) * pc.H + h) * S; }  // token tl's vectors start here
// Scratch matrix n of this (sequence, head): 0 the working state, 1.. n_chunks the stored states,
// then CHUNK slots for the states inside one chunk.
uint slab(uint n) { return pc.off_scratch + ((b * pc.H + h) * (1u + pc.n_chunks + CHUNK) + n) * S * S; }
uint partial(uint q, uint lane, uint x) { return (q * 16u + lane) * TILE + x; }

uint st_base;
#define ST(i, j) pc.o.v[st_base + (i) * S + (j)]

#if defined(BACKWARD)
uint dd_base;
#define DD(i, j) pc.o.v[dd_base + (i) * S + (j)]
#endif

// S <- w (.) S + k v^T on the elements this invocation owns.
void advance(uint at) {
    for (uint m = 0; m < per; ++m) {
        uint i = a + lanes * m;
        if (i >= S) continue;
        float wi = pc.w.v[at + i], ki = pc.k.v[at + i];
        for (uint n = 0; n < per; ++n) {
            uint j = c + lanes * n;
            if (j < S) ST(i, j) = wi * ST(i, j) + ki * pc.v.v[at + j];
        }
    }
}

// Copies the owned elements between the working state and a stored matrix at `base`.
void store_state(uint base) {
    for (uint m = 0; m < per; ++m)
        for (uint n = 0; n < per; ++n) {
            uint i = a + lanes * m, j = c + lanes * n;
            if (i < S && j < S) pc.o.v[base + i * S + j] = ST(i, j);
        }
}

void load_state(Floats from, uint base) {
    for (uint m = 0; m < per; ++m)
        for (uint n = 0; n < per; ++n) {
            uint i = a + lanes * m, j = c + lanes * n;
            if (i < S && j < S) ST(i, j) = from.v[base + i * S + j];
        }
}

#if defined(FORWARD)
// y_t[j] = sum_i (r[i] S[i,j] + WKV6's bonus r[i] u[i] k[i] v[j]), times GLA's scale.
void emit_y(uint at) {
    for (uint j0 = 0; j0 < S; j0 += TILE) {
        barrier();
        for (uint n = 0; n < per; ++n) {
            uint j = c + lanes * n;
            if (j < j0 || j >= j0 + TILE || j >= S) continue;
            float acc = 0.0;
            for (uint m = 0; m < per; ++m) {
                uint i = a + lanes * m;
                if (i >= S) continue;
                float term = ST(i, j);
#if defined(WKV6)
                term += pc.u.v[h * S + i] * pc.k.v[at + i] * pc.v.v[at + j];
#endif
                acc += pc.r.v[at + i] * term;
            }
            red[partial(0u, a, j - j0)] = acc;
        }
        barrier();
        uint j = j0 + tid;
        if (tid < TILE && j < S) {
            float y = 0.0;
            for (uint l = 0; l < lanes; ++l) y += red[partial(0u, l, tid)];
#if defined(GLA)
            y *= pc.scale;
#endif
            pc.o.v[at + j] = y;
        }
    }
}
#endif

#if defined(BACKWARD)
// The gradients of token tl from D (its state's gradient) and P (the state before it, stored
// at `prev`): per row i, gk, gr-or-gq, gtd-or-gg (and WKV6's u); per column j, gv.
void token_gradients(uint tl, uint prev) {
    uint at = vec_at(tl), plane = S * pc.H * pc.T;
    for (uint i0 = 0; i0 < S; i0 += TILE) {
        barrier();
        for (uint m = 0; m < per; ++m) {
            uint i = a + lanes * m;
            if (i < i0 || i >= i0 + TILE || i >= S) continue;
            float ki = pc.k.v[at + i], ri = pc.r.v[at + i];
            float gk = 0.0, gr = 0.0, gw = 0.0, gu = 0.0;
#if defined(WKV6)
            float ui = pc.u.v[h * S + i];
#else
            float wi = pc.w.v[at + i];
#endif
            for (uint n = 0; n < per; ++n) {
                uint j = c + lanes * n;
                if (j >= S) continue;
                float vj = pc.v.v[at + j], gy = pc.g.v[at + j], p = pc.o.v[prev + i * S + j], d = DD(i, j);
#if defined(WKV6)
                gk += vj * (ui * ri * gy + d);
                gr += gy * (ui * ki * vj + p);
                gu += ri * ki * vj * gy;
#else
                gk += vj * d;
                gr += gy * (wi * p + ki * vj);  // the state after the token
#endif
                gw += d * p;
            }
            red[partial(0u, c, i - i0)] = gk;
            red[partial(1u, c, i - i0)] = gr;
            red[partial(2u, c, i - i0)] = gw;
            red[partial(3u, c, i - i0)] = gu;
        }
        barrier();
        uint i = i0 + tid;
        if (tid < TILE && i < S) {
            float gk = 0.0, gr = 0.0, gw = 0.0, gu = 0.0;
            for (uint l = 0; l < lanes; ++l) {
                gk += red[partial(0u, l, tid)];
                gr += red[partial(1u, l, tid)];
                gw += red[partial(2u, l, tid)];
                gu += red[partial(3u, l, tid)];
            }
#if defined(GLA)
            gr *= pc.scale;
#endif
            pc.o.v[at + i] = gk;
            pc.o.v[2u * plane + at + i] = gr;
            pc.o.v[3u * plane + at + i] = gw;
#if defined(WKV6)
            pc.o.v[pc.off_bonus + (b * pc.H + h) * S + i] += gu;
#endif
        }
    }
    for (uint j0 = 0; j0 < S; j0 += TILE) {
        barrier();
        for (uint n = 0; n < per; ++n) {
            uint j = c + lanes * n;
            if (j < j0 || j >= j0 + TILE || j >= S) continue;
            float gy = pc.g.v[at + j], gv = 0.0;
            for (uint m = 0; m < per; ++m) {
                uint i = a + lanes * m;
                if (i >= S) continue;
                float d = DD(i, j);
#if defined(WKV6)
                d += pc.u.v[h * S + i] * pc.r.v[at + i] * gy;
#endif
                gv += pc.k.v[at + i] * d;
            }
            red[partial(0u, a, j - j0)] = gv;
        }
        barrier();
        uint j = j0 + tid;
        if (tid < TILE && j < S) {
            float gv = 0.0;
            for (uint l = 0; l < lanes; ++l) gv += red[partial(0u, l, tid)];
            pc.o.v[plane + at + j] = gv;
        }
    }
}
#endif

void main() {
    S = pc.S;
    lanes = min(S, 16u);
    per = (S + lanes - 1u) / lanes;
    tid = gl_LocalInvocationID.x;
    a = tid / lanes;
    c = tid % lanes;
    if (tid >= lanes * lanes) a = S;  // owns nothing: every row index is out of range
    L = pc.T / pc.n_seqs;
    b = flat_group() / pc.H;
    h = flat_group() % pc.H;
    uint matrix = (b * pc.H + h) * S * S;  // in a state column

#if defined(FORWARD)
    st_base = pc.T * S * pc.H + matrix;  // the new-state region holds the running state
    load_state(pc.state, matrix);
    for (uint tl = 0; tl < L; ++tl) {
        uint at = vec_at(tl);
#if defined(WKV6)
        emit_y(at);  // reads the state before the token
        advance(at);
#else
        advance(at);
        emit_y(at);  // reads the state after the token
#endif
    }

#else  // BACKWARD
    st_base = slab(0u);
    dd_base = pc.off_state + matrix;
    load_state(pc.state, matrix);
    for (uint tl = 0; tl < L; ++tl) {
        if (tl % CHUNK == 0u) store_state(slab(1u + tl / CHUNK));
        advance(vec_at(tl));
    }
    for (uint m = 0; m < per; ++m)  // D starts as the final state's gradient
        for (uint n = 0; n < per; ++n) {
            uint i = a + lanes * m, j = c + lanes * n;
            if (i < S && j < S) DD(i, j) = pc.g.v[pc.T * S * pc.H + matrix + i * S + j];
        }
#if defined(WKV6)
    for (uint i = tid; i < S; i += TILE)  // by the invocation that adds to it below
        if (tid < TILE) pc.o.v[pc.off_bonus + (b * pc.H + h) * S + i] = 0.0;
#endif
    for (uint chunk = pc.n_chunks; chunk-- > 0u;) {
        uint t0 = chunk * CHUNK, t1 = min(L, t0 + CHUNK);
        load_state(pc.o, slab(1u + chunk));
        for (uint tl = t0; tl < t1; ++tl) {  // the states inside the chunk, recomputed forward
            store_state(slab(1u + pc.n_chunks + tl - t0));
            advance(vec_at(tl));
        }
        for (uint tl = t1; tl-- > t0;) {
            uint at = vec_at(tl);
#if defined(GLA)
            for (uint m = 0; m < per; ++m)  // D_t = the carry + scale q_t gy_t^T
                for (uint n = 0; n < per; ++n) {
                    uint i = a + lanes * m, j = c + lanes * n;
                    if (i < S && j < S) DD(i, j) += pc.scale * pc.r.v[at + i] * pc.g.v[at + j];
                }
#endif
            token_gradients(tl, slab(1u + pc.n_chunks + tl - t0));
            for (uint m = 0; m < per; ++m)  // the carry to token tl - 1
                for (uint n = 0; n < per; ++n) {
                    uint i = a + lanes * m, j = c + lanes * n;
                    if (i >= S || j >= S) continue;
                    float carried = pc.w.v[at + i] * DD(i, j);
#if defined(WKV6)
                    carried += pc.r.v[at + i] * pc.g.v[at + j];
#endif
                    DD(i, j) = carried;
                }
        }
    }
#endif
}
