// RWKV-7's recurrence (ggml_rwkv_wkv7) and its backward for head sizes S <= 64, the state in
// registers: one workgroup per (sequence, head), a quad of invocations (4 neighbouring lanes) per
// row or column of the state, each lane with 16 of its elements (lane p of the quad: elements
// p + 4m). wkv7.comp has the layouts, formulas and scratch (it runs any S, the state in device
// memory).
//   sa[i]  = sum_j a[j] S[i, j]
//   S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
//   y[i]   = sum_j S[i, j] r[j]
// A row of S evolves on its own (sa[i] and y[i] read only row i), so FORWARD gives quad i row i:
// its sums are the quad's (two swaps), and its only other exchange is the tokens' vectors, read
// into shared memory a stage of tokens at a time (their loads in flight together, one wait per
// stage). BACKWARD first runs the forward the same way, keeping the state before every chunk-th
// token (the checkpoints) and each token's sa (in the slots of a's gradient, which the walk
// overwrites with it); then quad j owns column j of the state and of the adjoint D = dL/dS, which
// makes the gradients of r, w, k, b and a sums over its column: per chunk from the last, its
// states are recomputed from the checkpoint (a column needs only sa) and the walk back goes token
// by token. gv[i] and gsa[i], sums along a row, go through shared memory, a row per quad. Every
// sum is in a fixed order (a quad's swaps give its four lanes the same bits).
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "registers_common.glsl"

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

// Tokens read into shared memory at once: BACKWARD's stage with its row sums' terms fills
// lavapipe's 32 KiB.
#if defined(BACKWARD)
#define STAGE 8u
#else
#define STAGE 16u
#endif

// The stage: token q's vectors at [q * MAX_S + j], zeros past S. BACKWARD stages the upstream
// gradient dy and sa too; a token's gsa takes its dy's place once read.
shared float token_r[STAGE * MAX_S], token_w[STAGE * MAX_S], token_k[STAGE * MAX_S], token_a[STAGE * MAX_S],
    token_b[STAGE * MAX_S], token_v[STAGE * MAX_S];
#if defined(BACKWARD)
shared float token_dy[STAGE * MAX_S], token_sa[STAGE * MAX_S];
#endif

uint S, SS, tid, task, tokens;
bool owner;       // line < S

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

// Row `line`'s update for staged token q: sa (out), the lane's part of the new row, then y
// (returned).
float advance_row(inout float row[PER], uint q, out float sa_out) {
    uint x = q * MAX_S;
    float v_i = token_v[x + line];
    float sa = 0.0;
    [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) sa += token_a[x + element(m)] * row[m];
    sa = quad_sum(sa);
    float y = 0.0;
    [[unroll]] for (uint m = 0; m < PER; ++m) {
        uint j = element(m);
        if (j < S) {
            row[m] = row[m] * token_w[x + j] + v_i * token_k[x + j] + sa * token_b[x + j];
            y += row[m] * token_r[x + j];
        }
    }
    sa_out = sa;
    return quad_sum(y);
}

void setup() {
    task = flat_group();
    tid = gl_LocalInvocationID.x;
    S = pc.S;
    SS = S * S;
    tokens = S * pc.H * pc.T;
    line = tid / 4u;
    part = tid % 4u;
    owner = line < S;
}

void load_row(inout float row[PER]) {
    [[unroll]] for (uint m = 0; m < PER; ++m)
        row[m] = (owner && element(m) < S) ? pc.state.v[task * SS + line * S + element(m)] : 0.0;
}

#if !defined(BACKWARD)
void main() {
    setup();
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len;
    float row[PER];
    load_row(row);
    for (uint t = t0; t < t0 + len; t += STAGE) {
        uint count = min(STAGE, t0 + len - t);
        load_stage(t, count, false);
        if (owner) {
            for (uint q = 0; q < count; ++q) {
                float sa, y = advance_row(row, q, sa);
                if (part == 0) pc.o.v[vec_at(t + q) + line] = y;
            }
        }
        barrier();  // before the next stage replaces this one
    }
    if (owner)
        [[unroll]] for (uint m = 0; m < PER; ++m)
            if (element(m) < S) pc.o.v[tokens + task * SS + line * S + element(m)] = row[m];
}
#else
shared float row_terms[MAX_S * MAX_S];  // [i][j], j rotated by i: the row sums' terms

// sum_j row_terms[i][j] for row i = line, after every column's quad wrote its terms.
float row_sum() {
    float sum = 0.0;
    [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) sum += row_terms[terms_at(line, element(m))];
    return quad_sum(sum);
}

// Staged token q's step back for column j = line, with col = S_{t-1}[:, j] and adjoint = D[:, j]
// (the lane's rows; D without y_t's part): the gradients go to the output at `at`, D becomes
// dL/dS_{t-1}.
void step_back(inout float adjoint[PER], float col[PER], uint q, uint at) {
    uint j = line, x = q * MAX_S;
    float w_j = 0.0, k_j = 0.0, a_j = 0.0, b_j = 0.0;
    float gr = 0.0, gw = 0.0, gk = 0.0, gb = 0.0;
    if (owner) {
        float r_j = token_r[x + j];
        w_j = token_w[x + j], k_j = token_k[x + j], a_j = token_a[x + j], b_j = token_b[x + j];
        [[unroll]] for (uint m = 0; m < PER; ++m) {
            uint i = element(m);
            if (i < S) {
                float dy = token_dy[x + i], v = token_v[x + i], sa = token_sa[x + i];
                adjoint[m] += dy * r_j;  // D += dy r^T
                gr += (col[m] * w_j + v * k_j + sa * b_j) * dy;  // S_t's column
                gw += adjoint[m] * col[m];
                gk += adjoint[m] * v;
                gb += adjoint[m] * sa;
                row_terms[terms_at(i, j)] = adjoint[m] * k_j;
            }
        }
        gr = quad_sum(gr), gw = quad_sum(gw), gk = quad_sum(gk), gb = quad_sum(gb);
    }
    barrier();
    if (owner) {
        float gv = row_sum();  // gv[i] = sum_j D[i, j] k[j], row i = line
        if (part == 0) pc.o.v[3 * tokens + at + line] = gv;
    }
    barrier();
    if (owner)
        [[unroll]] for (uint m = 0; m < PER; ++m)
            if (element(m) < S) row_terms[terms_at(element(m), j)] = adjoint[m] * b_j;
    barrier();
    if (owner) {
        float gsa = row_sum();  // gsa[i] = sum_j D[i, j] b[j], in place of the read dy
        if (part == 0) token_dy[x + line] = gsa;
    }
    barrier();
    if (owner) {
        float ga = 0.0;
        [[unroll]] for (uint m = 0; m < PER; ++m) {
            uint i = element(m);
            if (i < S) {
                float gsa = token_dy[x + i];
                ga += gsa * col[m];
                adjoint[m] = adjoint[m] * w_j + gsa * a_j;  // D = D diag(w) + gsa a^T
            }
        }
        ga = quad_sum(ga);
        if (part == 0) {
            pc.o.v[at + j] = gr;
            pc.o.v[tokens + at + j] = gw;
            pc.o.v[2 * tokens + at + j] = gk;
            pc.o.v[sa_slot() + at + j] = ga;  // this token's sa was staged before
            pc.o.v[5 * tokens + at + j] = gb;
        }
    }
    barrier();  // token_dy and row_terms are read before the next step writes them
}

void main() {
    setup();
    uint len = pc.T / pc.n_seqs, t0 = (task / pc.H) * len, n_chunks = (len + pc.chunk - 1) / pc.chunk;
    uint base = task * ((1 + pc.chunk + n_chunks) * SS + 2 * S);  // wkv7.comp's scratch layout
    uint states_at = base + SS, checkpoints_at = states_at + pc.chunk * SS;

    // the forward, rows: the checkpoints and every token's sa
    float row[PER];
    load_row(row);
    for (uint t = 0; t < len; t += STAGE) {
        uint count = min(STAGE, len - t);
        if (t % pc.chunk == 0 && owner)
            [[unroll]] for (uint m = 0; m < PER; ++m)
                if (element(m) < S) pc.scratch.v[checkpoints_at + (t / pc.chunk) * SS + line * S + element(m)] = row[m];
        load_stage(t0 + t, count, false);
        if (owner) {
            for (uint q = 0; q < count; ++q) {
                float sa;
                advance_row(row, q, sa);
                if (part == 0) pc.o.v[sa_slot() + vec_at(t0 + t + q) + line] = sa;
            }
        }
        barrier();
    }
    memoryBarrierBuffer();
    barrier();

    // the walk back, columns: quad j = line holds S[:, j] (col) and D[:, j] (adjoint), rows part + 4m
    uint j = line;
    float adjoint[PER], col[PER];
    [[unroll]] for (uint m = 0; m < PER; ++m)
        adjoint[m] = (owner && element(m) < S) ? pc.g.v[tokens + task * SS + element(m) * S + j] : 0.0;
    for (uint c = n_chunks; c-- > 0;) {
        uint first = t0 + c * pc.chunk, count = min(pc.chunk, len - c * pc.chunk);
        [[unroll]] for (uint m = 0; m < PER; ++m)
            col[m] = (owner && element(m) < S) ? pc.scratch.v[checkpoints_at + c * SS + element(m) * S + j] : 0.0;
        for (uint s = 0; s < count; s += STAGE) {  // the chunk's states: slot q = before its token q
            uint n = min(STAGE, count - s);
            load_stage(first + s, n, true);
            if (owner) {
                for (uint q = 0; q < n; ++q) {
                    uint x = q * MAX_S;
                    float w_j = token_w[x + j], k_j = token_k[x + j], b_j = token_b[x + j];
                    [[unroll]] for (uint m = 0; m < PER; ++m) {
                        uint i = element(m);
                        if (i < S) {
                            pc.scratch.v[states_at + (s + q) * SS + i * S + j] = col[m];  // only this lane reads it back
                            col[m] = col[m] * w_j + token_v[x + i] * k_j + token_sa[x + i] * b_j;
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
                [[unroll]] for (uint m = 0; m < PER; ++m)  // S_{t-1}
                    col[m] = (owner && element(m) < S) ? pc.scratch.v[states_at + (s + q) * SS + element(m) * S + j] : 0.0;
                step_back(adjoint, col, q, vec_at(first + s + q));
            }
            end = s;
        }
    }
    if (owner)
        [[unroll]] for (uint m = 0; m < PER; ++m)
            if (element(m) < S) pc.o.v[6 * tokens + task * SS + element(m) * S + j] = adjoint[m];
}
#endif
