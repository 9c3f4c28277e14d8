// RWKV-7's recurrence (ggml_rwkv_wkv7) and its backward for head sizes S <= 64, the state in
// registers: one workgroup per (sequence, head), invocation i < S owning a row or a column of it
// (wkv7.comp has the layouts, formulas and scratch; it runs any S with the state in device memory).
//   sa[i]  = sum_j a[j] S[i, j]
//   S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
//   y[i]   = sum_j S[i, j] r[j]
// A row of S evolves on its own (sa[i] and y[i] read only row i), so FORWARD gives invocation i row
// i, and its only exchange is the tokens' vectors, read into shared memory a stage of tokens at a
// time (their loads in flight together, one wait per stage). BACKWARD first runs the forward the
// same way, keeping the state before every chunk-th token (the checkpoints) and each token's sa
// (in the slots of a's gradient, which the walk overwrites with it); then invocation j owns column
// j of the state and of the adjoint D = dL/dS, which makes the gradients of r, w, k and b sums over
// its own column: per chunk from the last, its states are recomputed from the checkpoint (a column
// needs only sa) and the walk back goes token by token. gv[i] and gsa[i], sums along a row, go
// through shared memory, a row per invocation. Every sum is one invocation's, in a fixed order.
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
    uint chunk;  // tokens between checkpoints (kRecurrenceChunk: a multiple of STAGE)
#endif
} pc;

#define MAX_S 64u  // the largest head size: rows of 64 registers (unrolled loops index them)

// Tokens read into shared memory at once: BACKWARD's stage with its row sums' terms fills
// lavapipe's 32 KiB.
#if defined(BACKWARD)
#define STAGE 8u
#else
#define STAGE 16u
#endif

// The stage: token q's vectors at [q * MAX_S + j], zeros past S (so a padded row or column stays
// 0). BACKWARD stages the upstream gradient dy and sa too; a token's gsa replaces its dy once read.
shared float token_r[STAGE * MAX_S], token_w[STAGE * MAX_S], token_k[STAGE * MAX_S], token_a[STAGE * MAX_S],
    token_b[STAGE * MAX_S], token_v[STAGE * MAX_S];
#if defined(BACKWARD)
shared float token_dy[STAGE * MAX_S], token_sa[STAGE * MAX_S];
#endif

uint S, SS, tid, task, tokens;

uint vec_at(uint t) { return (t * pc.H + task % pc.H) * S; }  // token t's vectors of this head

#if defined(BACKWARD)
uint sa_slot() { return 4 * tokens; }  // token t's sa at sa_slot() + vec_at(t) until its ga replaces it
#endif

// Tokens first .. first + count - 1 into the stage, every invocation loading (BACKWARD: with dy
// and sa where `gradients`).
void load_stage(uint first, uint count, bool gradients) {
    for (uint e = tid; e < count * MAX_S; e += gl_WorkGroupSize.x) {
        uint q = e / MAX_S, j = e % MAX_S, at = vec_at(first + q) + j;
        bool in_head = j < S;
        token_r[e] = in_head ? pc.r.v[at] : 0.0;
        token_w[e] = in_head ? pc.w.v[at] : 0.0;
        token_k[e] = in_head ? pc.k.v[at] : 0.0;
        token_a[e] = in_head ? pc.a.v[at] : 0.0;
        token_b[e] = in_head ? pc.b.v[at] : 0.0;
        token_v[e] = in_head ? pc.v.v[at] : 0.0;
#if defined(BACKWARD)
        if (gradients) {
            token_dy[e] = in_head ? pc.g.v[at] : 0.0;
            token_sa[e] = in_head ? pc.o.v[sa_slot() + at] : 0.0;
        }
#endif
    }
    barrier();
}

// Row `tid`'s update for staged token q: sa (out), the new row, then y (returned).
float advance_row(inout float row[MAX_S], uint q, out float sa_out) {
    uint at = q * MAX_S;
    float v_i = token_v[at + tid];
    float sa = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) sa += token_a[at + j] * row[j];
    float y = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) {
        if (j < S) {
            row[j] = row[j] * token_w[at + j] + v_i * token_k[at + j] + sa * token_b[at + j];
            y += row[j] * token_r[at + j];
        }
    }
    sa_out = sa;
    return y;
}

void load_row(inout float row[MAX_S], uint at) {
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) row[j] = (tid < S && j < S) ? pc.state.v[at + tid * S + j] : 0.0;
}

void setup() {
    task = flat_group();
    tid = gl_LocalInvocationID.x;
    S = pc.S;
    SS = S * S;
    tokens = S * pc.H * pc.T;
}

#if !defined(BACKWARD)
void main() {
    setup();
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len;
    float row[MAX_S];
    load_row(row, task * SS);
    for (uint t = t0; t < t0 + len; t += STAGE) {
        uint count = min(STAGE, t0 + len - t);
        load_stage(t, count, false);
        if (tid < S) {
            for (uint q = 0; q < count; ++q) {
                float sa;
                pc.o.v[vec_at(t + q) + tid] = advance_row(row, q, sa);
            }
        }
        barrier();  // before the next stage replaces this one
    }
    if (tid < S)
        [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) pc.o.v[tokens + task * SS + tid * S + j] = row[j];
}
#else
shared float row_terms[MAX_S * MAX_S];  // [i][j], j rotated by i: the row sums' terms, no bank conflicts

uint terms_at(uint i, uint j) { return i * MAX_S + ((i + j) % MAX_S); }

// sum_j row_terms[i][j] for row i = tid, after every column's owner wrote its terms.
float row_sum() {
    float sum = 0.0;
    [[unroll]] for (uint j = 0; j < MAX_S; ++j) if (j < S) sum += row_terms[terms_at(tid, j)];
    return sum;
}

// Staged token q's step back for column j = tid, with col = S_{t-1}[:, j] and adjoint = D[:, j]
// (dL/dS_t without y_t's part): its gradients go to the output at `at`, D becomes dL/dS_{t-1}.
void step_back(inout float adjoint[MAX_S], float col[MAX_S], uint q, uint at) {
    uint j = tid, x = q * MAX_S;
    bool owner = j < S;
    float w_j = 0.0, k_j = 0.0, a_j = 0.0, b_j = 0.0;
    float gr = 0.0, gw = 0.0, gk = 0.0, gb = 0.0;
    if (owner) {
        float r_j = token_r[x + j];
        w_j = token_w[x + j], k_j = token_k[x + j], a_j = token_a[x + j], b_j = token_b[x + j];
        [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
            if (i < S) {
                float dy = token_dy[x + i], v = token_v[x + i], sa = token_sa[x + i];
                adjoint[i] += dy * r_j;  // D += dy r^T
                gr += (col[i] * w_j + v * k_j + sa * b_j) * dy;  // S_t's column
                gw += adjoint[i] * col[i];
                gk += adjoint[i] * v;
                gb += adjoint[i] * sa;
                row_terms[terms_at(i, j)] = adjoint[i] * k_j;
            }
        }
    }
    barrier();
    if (owner) pc.o.v[3 * tokens + at + tid] = row_sum();  // gv[i] = sum_j D[i, j] k[j]
    barrier();
    if (owner) [[unroll]] for (uint i = 0; i < MAX_S; ++i) if (i < S) row_terms[terms_at(i, j)] = adjoint[i] * b_j;
    barrier();
    if (owner) token_dy[x + tid] = row_sum();  // gsa[i] = sum_j D[i, j] b[j], in place of the read dy
    barrier();
    if (owner) {
        float ga = 0.0;
        [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
            if (i < S) {
                float gsa = token_dy[x + i];
                ga += gsa * col[i];
                adjoint[i] = adjoint[i] * w_j + gsa * a_j;  // D = D diag(w) + gsa a^T
            }
        }
        pc.o.v[at + j] = gr;
        pc.o.v[tokens + at + j] = gw;
        pc.o.v[2 * tokens + at + j] = gk;
        pc.o.v[sa_slot() + at + j] = ga;  // this token's sa was staged before
        pc.o.v[5 * tokens + at + j] = gb;
    }
    barrier();  // token_dy and row_terms are read before the next step writes them
}

void main() {
    setup();
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len, n_chunks = (len + pc.chunk - 1) / pc.chunk;
    uint base = task * ((1 + pc.chunk + n_chunks) * SS + 2 * S);  // wkv7.comp's scratch layout
    uint states_at = base + SS, checkpoints_at = states_at + pc.chunk * SS;

    // the forward, rows: the checkpoints and every token's sa
    float row[MAX_S];
    load_row(row, task * SS);
    for (uint t = 0; t < len; t += STAGE) {
        uint count = min(STAGE, len - t);
        if (t % pc.chunk == 0 && tid < S)
            [[unroll]] for (uint j = 0; j < MAX_S; ++j)
                if (j < S) pc.scratch.v[checkpoints_at + (t / pc.chunk) * SS + tid * S + j] = row[j];
        load_stage(t0 + t, count, false);
        if (tid < S) {
            for (uint q = 0; q < count; ++q) {
                float sa;
                advance_row(row, q, sa);
                pc.o.v[sa_slot() + vec_at(t0 + t + q) + tid] = sa;
            }
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
        uint first = t0 + c * pc.chunk, count = min(pc.chunk, len - c * pc.chunk);
        [[unroll]] for (uint i = 0; i < MAX_S; ++i) col[i] = (owner && i < S) ? pc.scratch.v[checkpoints_at + c * SS + i * S + j] : 0.0;
        for (uint s = 0; s < count; s += STAGE) {  // the chunk's states: slot q = before its token q
            uint n = min(STAGE, count - s);
            load_stage(first + s, n, true);
            if (owner) {
                for (uint q = 0; q < n; ++q) {
                    uint x = q * MAX_S;
                    float w_j = token_w[x + j], k_j = token_k[x + j], b_j = token_b[x + j];
                    [[unroll]] for (uint i = 0; i < MAX_S; ++i) {
                        if (i < S) {
                            pc.scratch.v[states_at + (s + q) * SS + i * S + j] = col[i];  // only this invocation reads it back
                            col[i] = col[i] * w_j + token_v[x + i] * k_j + token_sa[x + i] * b_j;
                        }
                    }
                }
            }
            barrier();
        }
        for (uint end = count; end > 0;) {  // stages from the chunk's last
            uint s = end > STAGE ? end - STAGE : 0;
            load_stage(first + s, end - s, true);
            for (uint q = end - s; q-- > 0;) {
                [[unroll]] for (uint i = 0; i < MAX_S; ++i)
                    col[i] = (owner && i < S) ? pc.scratch.v[states_at + (s + q) * SS + i * S + j] : 0.0;  // S_{t-1}
                step_back(adjoint, col, q, vec_at(first + s + q));
            }
            end = s;
        }
    }
    if (owner) [[unroll]] for (uint i = 0; i < MAX_S; ++i) if (i < S) pc.o.v[6 * tokens + task * SS + i * S + j] = adjoint[i];
}
#endif
