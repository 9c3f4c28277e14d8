// The matrix-state recurrences of RWKV-6 (WKV6) and gated linear attention (GLA) for head sizes
// S <= 64, the state in registers; recurrence.comp has the formulas, layouts and scratch (and runs
// larger heads with the state in device memory). One workgroup per (sequence, head):
//   S[i, j] = w[i] S[i, j] + k[i] v[j]                     (i the key, j the value)
//   y[j]    = sum_i r[i] (S_{t-1}[i, j] + u[i] k[i] v[j])    (WKV6: the state before the token)
//   y[j]    = scale sum_i q[i] S_t[i, j]                     (GLA: the state after it)
// A column of S evolves on its own and y[j] reads only column j, so FORWARD gives invocation j
// column j: per token the key-side vectors go to shared memory and the rest is its own loops. A row
// evolves on its own too, and the gradients of k, r (q), w (g) and WKV6's u are sums along a row,
// so BACKWARD gives invocation i row i of the state and of its gradient D: the forward keeps the
// state before every CHUNK-th token, then per chunk from the last its states are recomputed and
// walked back; gv[j], a sum down a column, goes through shared memory. Every sum is one
// invocation's, in a fixed order.
#version 450
#extension GL_EXT_control_flow_attributes : require
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

#define MAX_S 64u  // the largest head size: rows of 64 registers (unrolled loops index them)
#define CHUNK 16u  // tokens between stored states (kRecurrenceChunk)

uint S, tid, L, b, h;
bool owner;  // tid < S: this invocation owns a column (FORWARD) or a row (BACKWARD)

uint vec_at(uint tl) { return ((b * L + tl) * pc.H + h) * S; }  // token tl's vectors start here
uint matrix() { return (b * pc.H + h) * S * S; }                 // this head's state in a state column

#if !defined(BACKWARD)
shared float token_w[MAX_S], token_k[MAX_S], token_r[MAX_S], bonus_u[MAX_S];

void main() {
    S = pc.S;
    tid = gl_LocalInvocationID.x;
    owner = tid < S;
    L = pc.T / pc.n_seqs;
    b = flat_group() / pc.H;
    h = flat_group() % pc.H;
    uint j = tid;
    float col[MAX_S];  // S[:, j]
    [[unroll]] for (uint i = 0; i < MAX_S; ++i) col[i] = (owner && i < S) ? pc.state.v[matrix() + i * S + j] : 0.0;
#if defined(WKV6)
    if (tid < MAX_S) bonus_u[tid] = owner ? pc.u.v[h * S + tid] : 0.0;
#endif
    for (uint tl = 0; tl < L; ++tl) {
        uint at = vec_at(tl);
        if (tid < MAX_S) {
            token_w[tid] = owner ? pc.w.v[at + tid] : 0.0;
            token_k[tid] = owner ? pc.k.v[at + tid] : 0.0;
            token_r[tid] = owner ? pc.r.v[at + tid] : 0.0;
        }
        barrier();
        if (owner) {
            float v_j = pc.v.v[at + j], y = 0.0;
            [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
                if (i < S) {
#if defined(WKV6)
                    y += token_r[i] * (col[i] + bonus_u[i] * token_k[i] * v_j);
                    col[i] = token_w[i] * col[i] + token_k[i] * v_j;
#else
                    col[i] = token_w[i] * col[i] + token_k[i] * v_j;
                    y += token_r[i] * col[i];
#endif
                }
            }
#if defined(GLA)
            y *= pc.scale;
#endif
            pc.o.v[at + j] = y;
        }
        barrier();  // before the next token's vectors replace these
    }
    if (owner) [[unroll]] for (uint i = 0; i < MAX_S; ++i) if (i < S) pc.o.v[pc.T * S * pc.H + matrix() + i * S + j] = col[i];
}
#else
shared float token_v[MAX_S], token_gy[MAX_S];
shared float column_terms[MAX_S * MAX_S];  // [i][j], j rotated by i: gv's terms, no bank conflicts

uint terms_at(uint i, uint j) { return i * MAX_S + ((i + j) % MAX_S); }

// Scratch matrix n of this (sequence, head): 1.. n_chunks the stored states, then CHUNK slots for
// the states inside one chunk (recurrence.comp's layout; slab 0 is unused here).
uint slab(uint n) { return pc.off_scratch + ((b * pc.H + h) * (1u + pc.n_chunks + CHUNK) + n) * S * S; }

void stage_v(uint at) {
    if (tid < MAX_S) token_v[tid] = owner ? pc.v.v[at + tid] : 0.0;
    barrier();
}

// Row i = tid of the state after token tl (its v staged): w[i] row + k[i] v.
void advance(inout float row[MAX_S], uint at) {
    float w_i = pc.w.v[at + tid], k_i = pc.k.v[at + tid];
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) row[j] = w_i * row[j] + k_i * token_v[j];
}

// Row i of a stored matrix: written and read back by this invocation alone.
void store_row(float row[MAX_S], uint base) {
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) pc.o.v[base + tid * S + j] = row[j];
}

void load_row(inout float row[MAX_S], uint base) {
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) row[j] = pc.o.v[base + tid * S + j];
}

void main() {
    S = pc.S;
    tid = gl_LocalInvocationID.x;
    owner = tid < S;
    L = pc.T / pc.n_seqs;
    b = flat_group() / pc.H;
    h = flat_group() % pc.H;
    uint i = tid, plane = S * pc.H * pc.T;
    float row[MAX_S], adjoint[MAX_S];
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) row[j] = (owner && j < S) ? pc.state.v[matrix() + i * S + j] : 0.0;
    for (uint tl = 0; tl < L; ++tl) {  // the forward, keeping the state before every CHUNK-th token
        if (tl % CHUNK == 0u && owner) store_row(row, slab(1u + tl / CHUNK));
        uint at = vec_at(tl);
        stage_v(at);
        if (owner) advance(row, at);
        barrier();
    }
    [[unroll]] for (uint j = 0; j < MAX_S; ++j)  // D starts as the final state's gradient
        adjoint[j] = (owner && j < S) ? pc.g.v[pc.T * S * pc.H + matrix() + i * S + j] : 0.0;
    float gu = 0.0;  // WKV6's bonus, summed over the tokens from the last
    for (uint chunk = pc.n_chunks; chunk-- > 0u;) {
        uint t0 = chunk * CHUNK, t1 = min(L, t0 + CHUNK);
        if (owner) load_row(row, slab(1u + chunk));
        for (uint tl = t0; tl < t1; ++tl) {  // the states inside the chunk, recomputed forward
            if (owner) store_row(row, slab(1u + pc.n_chunks + tl - t0));
            uint at = vec_at(tl);
            stage_v(at);
            if (owner) advance(row, at);
            barrier();
        }
        for (uint tl = t1; tl-- > t0;) {
            uint at = vec_at(tl);
            if (tid < MAX_S) {
                token_v[tid] = owner ? pc.v.v[at + tid] : 0.0;
                token_gy[tid] = owner ? pc.g.v[at + tid] : 0.0;
            }
            barrier();
            if (owner) {
                load_row(row, slab(1u + pc.n_chunks + tl - t0));  // the state before the token
                float k_i = pc.k.v[at + i], r_i = pc.r.v[at + i], w_i = pc.w.v[at + i];
                float gk = 0.0, gr = 0.0, gw = 0.0;
#if defined(WKV6)
                float u_i = pc.u.v[h * S + i], bonus = 0.0;
#endif
                [[unroll]] for (uint j = 0; j < MAX_S; ++j) {
                    if (j < S) {
                        float v_j = token_v[j], gy = token_gy[j];
#if defined(WKV6)
                        float d = adjoint[j] + u_i * r_i * gy;  // D and the bonus's path to y
                        gk += v_j * d;
                        gr += gy * (u_i * k_i * v_j + row[j]);
                        bonus += r_i * k_i * v_j * gy;
#else
                        adjoint[j] += pc.scale * r_i * gy;  // D_t = the carry + scale q gy^T
                        float d = adjoint[j];
                        gk += v_j * d;
                        gr += gy * (w_i * row[j] + k_i * v_j);  // the state after the token
#endif
                        gw += adjoint[j] * row[j];
                        column_terms[terms_at(i, j)] = k_i * d;
                    }
                }
#if defined(GLA)
                gr *= pc.scale;
#else
                gu += bonus;
#endif
                pc.o.v[at + i] = gk;
                pc.o.v[2u * plane + at + i] = gr;
                pc.o.v[3u * plane + at + i] = gw;
            }
            barrier();
            if (owner) {
                uint j = tid;  // gv[j] = sum_i k[i] D[i, j], down column j
                float gv = 0.0;
                [[unroll]] for (uint m = 0; m < MAX_S; ++m) if (m < S) gv += column_terms[terms_at(m, j)];
                pc.o.v[plane + at + j] = gv;
                float w_i = pc.w.v[at + i];
#if defined(WKV6)
                float r_i = pc.r.v[at + i];
#endif
                [[unroll]] for (uint n = 0; n < MAX_S; ++n) {  // the carry to token tl - 1
                    if (n < S) {
#if defined(WKV6)
                        adjoint[n] = w_i * adjoint[n] + r_i * token_gy[n];
#else
                        adjoint[n] = w_i * adjoint[n];
#endif
                    }
                }
            }
            barrier();
        }
    }
    if (owner) {
        [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) pc.o.v[pc.off_state + matrix() + i * S + j] = adjoint[j];
#if defined(WKV6)
        pc.o.v[pc.off_bonus + (b * pc.H + h) * S + i] = gu;
#endif
    }
}
#endif
