// RWKV-7's recurrence (ggml_rwkv_wkv7) and its backward for head sizes S <= 64, the state in
// registers: one workgroup per (sequence, head), invocation i < S owning a row or a column of it
// (wkv7.comp has the layouts, formulas and scratch; it runs any S with the state in device memory).
//   sa[i]  = sum_j a[j] S[i, j]
//   S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
//   y[i]   = sum_j S[i, j] r[j]
// A row of S evolves on its own (sa[i] and y[i] read only row i), so FORWARD gives invocation i row
// i: per token the token's r, w, k, a, b go to shared memory, then each row's update and sums are
// its owner's loops, with no other exchange. BACKWARD first runs the forward the same way, keeping
// the state before every CHUNK-th token (the checkpoints) and each token's sa (in the slots of a's
// gradient, which the walk overwrites with it); then invocation j owns column j of the state and
// of the adjoint D = dL/dS, which makes the gradients of r, w, k and b sums over its own column:
// per chunk from the last, its states are recomputed from the checkpoint (a column needs only
// sa), and the walk back goes token by token. gv[i] and gsa[i], sums along a row, go through
// shared memory, a row per invocation. Every sum is one invocation's, in a fixed order.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"

// Storage that invocations of one workgroup write and then read from one another.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Shared { float v[]; };

layout(push_constant) uniform Push {
    Floats r;
    Floats w;
    Floats k;
    Floats v;
    Floats a;
    Floats b;
    Floats state;
    Shared o;
#if defined(BACKWARD)
    Floats g;
    Shared scratch;
#endif
    uint S;
    uint H;
    uint T;
    uint n_seqs;
#if defined(BACKWARD)
    uint chunk;  // tokens between checkpoints
#endif
} pc;

#define MAX_S 64u  // the largest head size: rows of 64 registers (unrolled loops index them)

shared float token_r[MAX_S], token_w[MAX_S], token_k[MAX_S], token_a[MAX_S], token_b[MAX_S];

uint S, SS, tid, task, tokens;

uint vec_at(uint t) { return (t * pc.H + task % pc.H) * S; }  // token t's vectors of this head

// Token t's key-side vectors into shared memory, zeros past S (so a padded column stays 0).
void stage_token(uint t) {
    if (tid < MAX_S) {
        bool in_head = tid < S;
        uint at = vec_at(t) + tid;
        token_r[tid] = in_head ? pc.r.v[at] : 0.0;
        token_w[tid] = in_head ? pc.w.v[at] : 0.0;
        token_k[tid] = in_head ? pc.k.v[at] : 0.0;
        token_a[tid] = in_head ? pc.a.v[at] : 0.0;
        token_b[tid] = in_head ? pc.b.v[at] : 0.0;
    }
    barrier();
}

// Row `tid`'s update for token t (its vectors staged): sa, the new row, then y (returned).
float advance_row(inout float row[MAX_S], uint t, out float sa_out) {
    float v_i = pc.v.v[vec_at(t) + tid];
    float sa = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) sa += token_a[j] * row[j];
    float y = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) {
        if (j < S) {
            row[j] = row[j] * token_w[j] + v_i * token_k[j] + sa * token_b[j];
            y += row[j] * token_r[j];
        }
    }
    sa_out = sa;
    return y;
}

void load_row(inout float row[MAX_S], uint at) {
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) row[j] = (tid < S && j < S) ? pc.state.v[at + tid * S + j] : 0.0;
}

#if !defined(BACKWARD)
void main() {
    task = flat_group();
    tid = gl_LocalInvocationID.x;
    S = pc.S;
    SS = S * S;
    tokens = S * pc.H * pc.T;
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len;
    float row[MAX_S];
    load_row(row, task * SS);
    for (uint t = t0; t < t0 + len; ++t) {
        stage_token(t);
        if (tid < S) {
            float sa;
            pc.o.v[vec_at(t) + tid] = advance_row(row, t, sa);
        }
        barrier();  // before the next token's vectors replace these
    }
    if (tid < S)
        [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) pc.o.v[tokens + task * SS + tid * S + j] = row[j];
}
#else
shared float token_dy[MAX_S], token_v[MAX_S], token_sa[MAX_S], token_gsa[MAX_S];
shared float row_terms[MAX_S * MAX_S];  // [i][j], j rotated by i: the row sums' terms, no bank conflicts

uint terms_at(uint i, uint j) { return i * MAX_S + ((i + j) % MAX_S); }

// sum_j row_terms[i][j] for row i = tid, after every column's owner wrote its terms.
float row_sum() {
    float sum = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) sum += row_terms[terms_at(tid, j)];
    return sum;
}

void main() {
    task = flat_group();
    tid = gl_LocalInvocationID.x;
    S = pc.S;
    SS = S * S;
    tokens = S * pc.H * pc.T;
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len, n_chunks = (len + pc.chunk - 1) / pc.chunk;
    uint base = task * ((1 + pc.chunk + n_chunks) * SS + 2 * S);  // wkv7.comp's scratch layout
    uint states_at = base + SS, checkpoints_at = states_at + pc.chunk * SS;
    uint sa_slot = 4 * tokens;  // token t's sa at sa_slot + vec_at(t) until its ga replaces it

    // the forward, rows: the checkpoints and every token's sa
    float row[MAX_S];
    load_row(row, task * SS);
    for (uint t = 0; t < len; ++t) {
        if (t % pc.chunk == 0 && tid < S)
            [[unroll]] for (uint j = 0; j < MAX_S; ++j)
                if (j < S) pc.scratch.v[checkpoints_at + (t / pc.chunk) * SS + tid * S + j] = row[j];
        stage_token(t0 + t);
        if (tid < S) {
            float sa;
            advance_row(row, t0 + t, sa);
            pc.o.v[sa_slot + vec_at(t0 + t) + tid] = sa;
        }
        barrier();
    }
    memoryBarrierBuffer();
    barrier();

    // the walk back, columns: invocation j = tid holds S[:, j] (col) and D[:, j] (adjoint)
    uint j = tid;
    bool owner = j < S;
    float adjoint[MAX_S], col[MAX_S];
    [[unroll]] for (uint i = 0; i < MAX_S; ++i) adjoint[i] = (owner && i < S) ? pc.g.v[tokens + task * SS + i * S + j] : 0.0;
    for (uint c = n_chunks; c-- > 0;) {
        uint count = min(pc.chunk, len - c * pc.chunk);
        [[unroll]] for (uint i = 0; i < MAX_S; ++i) col[i] = (owner && i < S) ? pc.scratch.v[checkpoints_at + c * SS + i * S + j] : 0.0;
        for (uint q = 0; q < count; ++q) {  // the chunk's states: slot q = before its token q
            uint at = vec_at(t0 + c * pc.chunk + q);
            if (tid < MAX_S) {
                token_v[tid] = tid < S ? pc.v.v[at + tid] : 0.0;
                token_sa[tid] = tid < S ? pc.o.v[sa_slot + at + tid] : 0.0;
            }
            barrier();
            if (owner) {
                float w_j = pc.w.v[at + j], k_j = pc.k.v[at + j], b_j = pc.b.v[at + j];
                [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
                    if (i < S) {
                        pc.scratch.v[states_at + q * SS + i * S + j] = col[i];  // only this invocation reads it back
                        col[i] = col[i] * w_j + token_v[i] * k_j + token_sa[i] * b_j;
                    }
                }
            }
            barrier();
        }
        for (uint q = count; q-- > 0;) {
            uint at = vec_at(t0 + c * pc.chunk + q);
            if (tid < MAX_S) {
                token_dy[tid] = tid < S ? pc.g.v[at + tid] : 0.0;
                token_v[tid] = tid < S ? pc.v.v[at + tid] : 0.0;
                token_sa[tid] = tid < S ? pc.o.v[sa_slot + at + tid] : 0.0;
            }
            barrier();
            float r_j = 0.0, w_j = 0.0, k_j = 0.0, a_j = 0.0, b_j = 0.0;
            float gr = 0.0, gw = 0.0, gk = 0.0, gb = 0.0;
            if (owner) {
                r_j = pc.r.v[at + j], w_j = pc.w.v[at + j], k_j = pc.k.v[at + j];
                a_j = pc.a.v[at + j], b_j = pc.b.v[at + j];
                [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
                    if (i < S) {
                        col[i] = pc.scratch.v[states_at + q * SS + i * S + j];  // S_{t-1}[:, j]
                        adjoint[i] += token_dy[i] * r_j;                          // D += dy r^T
                        float next = col[i] * w_j + token_v[i] * k_j + token_sa[i] * b_j;
                        gr += next * token_dy[i];
                        gw += adjoint[i] * col[i];
                        gk += adjoint[i] * token_v[i];
                        gb += adjoint[i] * token_sa[i];
                        row_terms[terms_at(i, j)] = adjoint[i] * k_j;
                    }
                }
            }
            barrier();
            if (owner) pc.o.v[3 * tokens + at + tid] = row_sum();  // gv[i] = sum_j D[i, j] k[j]
            barrier();
            if (owner) [[unroll]] for (uint i = 0; i < MAX_S; ++i) if (i < S) row_terms[terms_at(i, j)] = adjoint[i] * b_j;
            barrier();
            if (owner) token_gsa[tid] = row_sum();  // gsa[i] = sum_j D[i, j] b[j]
            barrier();
            if (owner) {
                float ga = 0.0;
                [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
                    if (i < S) {
                        ga += token_gsa[i] * col[i];
                        adjoint[i] = adjoint[i] * w_j + token_gsa[i] * a_j;  // D = D diag(w) + gsa a^T
                    }
                }
                pc.o.v[at + j] = gr;
                pc.o.v[tokens + at + j] = gw;
                pc.o.v[2 * tokens + at + j] = gk;
                pc.o.v[sa_slot + at + j] = ga;  // sa[j] of this token was staged above
                pc.o.v[5 * tokens + at + j] = gb;
            }
            barrier();
        }
    }
    if (owner) [[unroll]] for (uint i = 0; i < MAX_S; ++i) if (i < S) pc.o.v[6 * tokens + task * SS + i * S + j] = adjoint[i];
}
#endif
