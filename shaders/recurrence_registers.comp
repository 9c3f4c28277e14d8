// The matrix-state recurrences of RWKV-6 (WKV6) and gated linear attention (GLA) for head sizes
// S <= 64, the state in registers; recurrence.comp has the formulas, layouts and scratch (and runs
// larger heads with the state in device memory). One workgroup per (sequence, head), a quad of
// invocations (4 neighbouring lanes) per row or column of the state, each lane with 16 of its
// elements (lane p of the quad: elements p + 4m):
//   S[i, j] = w[i] S[i, j] + k[i] v[j]                     (i the key, j the value)
//   y[j]    = sum_i r[i] (S_{t-1}[i, j] + u[i] k[i] v[j])    (WKV6: the state before the token)
//   y[j]    = scale sum_i q[i] S_t[i, j]                     (GLA: the state after it)
// A column of S evolves on its own and y[j] reads only column j, so FORWARD gives quad j column j:
// the tokens' vectors go to shared memory a stage of tokens at a time (their loads in flight
// together, one wait per stage), and y[j] is the quad's sum (two swaps). A row evolves on its own
// too, and the gradients of k, r (q), w (g) and WKV6's u are sums along a row, so BACKWARD gives
// quad i row i of the state and of its gradient D: the forward keeps the state before every
// CHUNK-th token, then per chunk from the last its states are recomputed and walked back; gv[j],
// a sum down a column, goes through shared memory. Every sum is in a fixed order (a quad's swaps
// give its four lanes the same bits).
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "registers_common.glsl"

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

#define CHUNK 16u  // tokens between stored states (kRecurrenceChunk)

uint S, tid, L, b, h;
bool owner;       // line < S

uint vec_at(uint tl) { return ((b * L + tl) * pc.H + h) * S; }  // token tl's vectors start here
uint matrix() { return (b * pc.H + h) * S * S; }                 // this head's state in a state column

void setup() {
    S = pc.S;
    tid = gl_LocalInvocationID.x;
    line = tid / 4u;
    part = tid % 4u;
    owner = line < S;
    L = pc.T / pc.n_seqs;
    b = flat_group() / pc.H;
    h = flat_group() % pc.H;
}

// Tokens read into shared memory at once: their loads in flight together, one wait per stage.
#if defined(BACKWARD)
#define STAGE 8u
#else
#define STAGE 16u
#endif

// w, k, r, v (BACKWARD: and the upstream gradient gy) of up to STAGE tokens, token q's at
// [q * MAX_S + i], zeros past S.
shared float token_w[STAGE * MAX_S], token_k[STAGE * MAX_S], token_r[STAGE * MAX_S], token_v[STAGE * MAX_S];
#if defined(BACKWARD)
shared float token_gy[STAGE * MAX_S];
#endif

// Tokens first .. first + count - 1 (of this sequence) into the stage, every invocation loading.
void load_stage(uint first, uint count) {
    for (uint e = tid; e < count * MAX_S; e += gl_WorkGroupSize.x) {
        uint q = e / MAX_S, i = e % MAX_S, at = vec_at(first + q) + i;
        bool in_head = i < S;
        token_w[e] = in_head ? pc.w.v[at] : 0.0;
        token_k[e] = in_head ? pc.k.v[at] : 0.0;
        token_r[e] = in_head ? pc.r.v[at] : 0.0;
        token_v[e] = in_head ? pc.v.v[at] : 0.0;
#if defined(BACKWARD)
        token_gy[e] = in_head ? pc.g.v[at] : 0.0;
#endif
    }
    barrier();
}

#if !defined(BACKWARD)
shared float bonus_u[MAX_S];

void main() {
    setup();
    uint j = line;
    float col[PER];  // S[part + 4m, j]
    [[unroll]] for (uint m = 0; m < PER; ++m)
        col[m] = (owner && element(m) < S) ? pc.state.v[matrix() + element(m) * S + j] : 0.0;
#if defined(WKV6)
    if (tid < MAX_S) bonus_u[tid] = tid < S ? pc.u.v[h * S + tid] : 0.0;
#endif
    for (uint t = 0; t < L; t += STAGE) {
        uint count = min(STAGE, L - t);
        load_stage(t, count);
        if (owner) {
            for (uint q = 0; q < count; ++q) {
                uint x = q * MAX_S;
                float v_j = token_v[x + j], y = 0.0;
                [[unroll]] for (uint m = 0; m < PER; ++m) {
                    uint i = element(m);
                    if (i < S) {
#if defined(WKV6)
                        y += token_r[x + i] * (col[m] + bonus_u[i] * token_k[x + i] * v_j);
                        col[m] = token_w[x + i] * col[m] + token_k[x + i] * v_j;
#else
                        col[m] = token_w[x + i] * col[m] + token_k[x + i] * v_j;
                        y += token_r[x + i] * col[m];
#endif
                    }
                }
                y = quad_sum(y);
#if defined(GLA)
                y *= pc.scale;
#endif
                if (part == 0) pc.o.v[vec_at(t + q) + j] = y;
            }
        }
        barrier();  // before the next stage replaces this one
    }
    if (owner)
        [[unroll]] for (uint m = 0; m < PER; ++m)
            if (element(m) < S) pc.o.v[pc.T * S * pc.H + matrix() + element(m) * S + j] = col[m];
}
#else
shared float column_terms[MAX_S * MAX_S];  // [i][j], j rotated by i: gv's terms

// Scratch matrix n of this (sequence, head): 1.. n_chunks the stored states, then CHUNK slots for
// the states inside one chunk (recurrence.comp's layout; slab 0 is unused here).
uint slab(uint n) { return pc.off_scratch + ((b * pc.H + h) * (1u + pc.n_chunks + CHUNK) + n) * S * S; }

// The lane's part of row i = line of the state after staged token q: w[i] row + k[i] v.
void advance(inout float row[PER], uint q) {
    uint x = q * MAX_S;
    float w_i = token_w[x + line], k_i = token_k[x + line];
    [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) row[m] = w_i * row[m] + k_i * token_v[x + element(m)];
}

// The lane's part of row i of a stored matrix: written and read back by this lane alone.
void store_row(float row[PER], uint base) {
    [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) pc.o.v[base + line * S + element(m)] = row[m];
}

void load_row(inout float row[PER], uint base) {
    [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) row[m] = pc.o.v[base + line * S + element(m)];
}

// Staged token q's step back for row i = line, with row = S_{t-1}[i, :] and adjoint = D[i, :]
// (the lane's columns; GLA: D without y_t's part): the gradients go to the output at `at`
// (WKV6's bonus added to gu), D becomes the gradient of S_{t-1}.
void step_back(inout float adjoint[PER], float row[PER], uint q, uint at, inout float gu) {
    uint i = line, x = q * MAX_S, plane = S * pc.H * pc.T;
    float w_i = 0.0, r_i = 0.0;
    if (owner) {
        float k_i = token_k[x + i];
        w_i = token_w[x + i], r_i = token_r[x + i];
        float gk = 0.0, gr = 0.0, gw = 0.0;
#if defined(WKV6)
        float u_i = pc.u.v[h * S + i], bonus = 0.0;
#endif
        [[unroll]] for (uint m = 0; m < PER; ++m) {
            uint j = element(m);
            if (j < S) {
                float v_j = token_v[x + j], gy = token_gy[x + j];
#if defined(WKV6)
                float d = adjoint[m] + u_i * r_i * gy;  // D and the bonus's path to y
                gk += v_j * d;
                gr += gy * (u_i * k_i * v_j + row[m]);
                bonus += r_i * k_i * v_j * gy;
#else
                adjoint[m] += pc.scale * r_i * gy;  // D_t = the carry + scale q gy^T
                float d = adjoint[m];
                gk += v_j * d;
                gr += gy * (w_i * row[m] + k_i * v_j);  // the state after the token
#endif
                gw += adjoint[m] * row[m];
                column_terms[terms_at(i, j)] = k_i * d;
            }
        }
        gk = quad_sum(gk), gr = quad_sum(gr), gw = quad_sum(gw);
#if defined(GLA)
        gr *= pc.scale;
#else
        gu += quad_sum(bonus);
#endif
        if (part == 0) {
            pc.o.v[at + i] = gk;
            pc.o.v[2u * plane + at + i] = gr;
            pc.o.v[3u * plane + at + i] = gw;
        }
    }
    barrier();
    if (owner) {
        uint j = line;  // gv[j] = sum_i k[i] D[i, j], down column j: the quad's rows part + 4m
        float gv = 0.0;
        [[unroll]] for (uint m = 0; m < PER; ++m) if (element(m) < S) gv += column_terms[terms_at(element(m), j)];
        gv = quad_sum(gv);
        if (part == 0) pc.o.v[plane + at + j] = gv;
        [[unroll]] for (uint m = 0; m < PER; ++m) {  // the carry to token t - 1
            if (element(m) < S) {
#if defined(WKV6)
                adjoint[m] = w_i * adjoint[m] + r_i * token_gy[x + element(m)];
#else
                adjoint[m] = w_i * adjoint[m];
#endif
            }
        }
    }
    barrier();  // column_terms are read before the next step writes them
}

void main() {
    setup();
    uint i = line;
    float row[PER], adjoint[PER];
    [[unroll]] for (uint m = 0; m < PER; ++m)
        row[m] = (owner && element(m) < S) ? pc.state.v[matrix() + i * S + element(m)] : 0.0;
    for (uint t = 0; t < L; t += STAGE) {  // the forward, keeping the state before every CHUNK-th token
        uint count = min(STAGE, L - t);
        if (t % CHUNK == 0u && owner) store_row(row, slab(1u + t / CHUNK));  // STAGE divides CHUNK
        load_stage(t, count);
        if (owner) for (uint q = 0; q < count; ++q) advance(row, q);
        barrier();
    }
    [[unroll]] for (uint m = 0; m < PER; ++m)  // D starts as the final state's gradient
        adjoint[m] = (owner && element(m) < S) ? pc.g.v[pc.T * S * pc.H + matrix() + i * S + element(m)] : 0.0;
    float gu = 0.0;  // WKV6's bonus, summed over the tokens from the last
    for (uint chunk = pc.n_chunks; chunk-- > 0u;) {
        uint t0 = chunk * CHUNK, count = min(L - t0, CHUNK);
        if (owner) load_row(row, slab(1u + chunk));
        for (uint s = 0; s < count; s += STAGE) {  // the states inside the chunk, recomputed forward
            uint n = min(STAGE, count - s);
            load_stage(t0 + s, n);
            if (owner) {
                for (uint q = 0; q < n; ++q) {
                    store_row(row, slab(1u + pc.n_chunks + s + q));
                    advance(row, q);
                }
            }
            barrier();
        }
        for (uint end = count; end > 0;) {  // stages from the chunk's last
            uint s = end > STAGE ? end - STAGE : 0;
            load_stage(t0 + s, end - s);
            for (uint q = end - s; q-- > 0;) {
                if (owner) load_row(row, slab(1u + pc.n_chunks + s + q));  // the state before the token
                step_back(adjoint, row, q, vec_at(t0 + s + q), gu);
            }
            end = s;
        }
    }
    if (owner) {
        [[unroll]] for (uint m = 0; m < PER; ++m)
            if (element(m) < S) pc.o.v[pc.off_state + matrix() + i * S + element(m)] = adjoint[m];
#if defined(WKV6)
        if (part == 0) pc.o.v[pc.off_bonus + (b * pc.H + h) * S + i] = gu;
#endif
    }
}
#endif
