// RWKV-7's recurrence (ggml_rwkv_wkv7) and its backward, one workgroup per (sequence, head), any
// head size S. Shapes in ne order: r, w, k, v, a, b [S, H, T] (T tokens of n_seqs equal
// sequences), state [S*S*H, n_seqs] (head h's S x S matrix of sequence s at (s*H + h)*S*S + i*S + j,
// i the value row, j the key column). Per token:
//   sa[i]  = sum_j a[j] S[i, j]
//   S[i,j] = S[i,j] w[j] + v[i] k[j] + sa[i] b[j]
//   y[i]   = sum_j S[i, j] r[j]
// FORWARD:  o = [S*H, T + S*n_seqs], y's T columns then the final states. The state is updated in
//           place in o's state block; sa is kept in the token's y column until y overwrites it.
// BACKWARD: g = the gradient of the forward's o; o = [S*H, 6T + S*n_seqs + scratch], the gradients
//           of r, w, k, v, a, b (T columns each), of state, then per (sequence, head) a scratch region
//           (see ops.def; the host passes its address) holding the adjoint D, the states of one
//           chunk, the checkpoints and sa, gsa: a forward pass keeps the state before every
//           chunk-th token, then chunk by chunk from the end the chunk's states are recomputed
//           from its checkpoint and D walks back through them (reference/vulkan-ssm.md 5.3). The
//           update is never inverted.
// S x S matrices live in global memory, so any S fits: in elementwise passes each element has one
// owner invocation (e = tid + 256 m); row and column sums go through `partial`, each summed in a
// fixed order (deterministic, no atomics).
#version 450
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

shared vec4 partial[256];

// Makes every invocation's global and shared writes visible to the whole workgroup.
void sync() {
    memoryBarrierBuffer();
    barrier();
}

// What a row or column sum adds up, and where its result goes.
const uint SA = 0;         // row:    sa[i] = sum_j a[j] S[i, j]
const uint Y = 1;          // row:    y[i]  = sum_j S[i, j] r[j]
const uint GRAD_ROWS = 2;  // row:    gv[i] = sum_j D k[j],  gsa[i] = sum_j D b[j]
const uint GRAD_COLS = 3;  // column: gr, gw, gk, gb (see term)
const uint GRAD_A = 4;     // column: ga[j] = sum_i gsa[i] S_{t-1}[i, j]

// The current token's vectors start at `vec_at` in r, w, k, v, a, b, y and the gradients; the
// state it reads (S_{t-1}) at `state_at`, of o (FORWARD) or scratch (BACKWARD).
uint vec_at, state_at;
#if defined(BACKWARD)
uint adjoint_at, sa_at, gsa_at, tokens;  // tokens = S*H*T, one gradient block
float state_of(uint e) { return pc.scratch.v[state_at + e]; }
float adjoint_of(uint e) { return pc.scratch.v[adjoint_at + e]; }
float sa_of(uint i) { return pc.scratch.v[sa_at + i]; }
float gsa_of(uint i) { return pc.scratch.v[gsa_at + i]; }
#else
float state_of(uint e) { return pc.o.v[state_at + e]; }
float sa_of(uint i) { return pc.o.v[vec_at + i]; }
#endif

vec4 term(uint what, uint i, uint j) {
    uint e = i * pc.S + j, at = vec_at;
    if (what == SA) return vec4(pc.a.v[at + j] * state_of(e));
    if (what == Y) return vec4(state_of(e) * pc.r.v[at + j]);
#if defined(BACKWARD)
    float d = adjoint_of(e), prev = state_of(e);
    if (what == GRAD_ROWS) return vec4(d * pc.k.v[at + j], d * pc.b.v[at + j], 0.0, 0.0);
    if (what == GRAD_COLS) {
        float next = prev * pc.w.v[at + j] + pc.v.v[at + i] * pc.k.v[at + j] + sa_of(i) * pc.b.v[at + j];  // S_t
        return vec4(pc.g.v[at + i] * next, d * prev, d * pc.v.v[at + i], d * sa_of(i));
    }
    if (what == GRAD_A) return vec4(gsa_of(i) * prev);
#endif
    return vec4(0.0);
}

void store(uint what, uint n, vec4 sum) {
#if defined(BACKWARD)
    if (what == SA) pc.scratch.v[sa_at + n] = sum.x;
    if (what == GRAD_ROWS) {
        pc.o.v[3 * tokens + vec_at + n] = sum.x;  // gv
        pc.scratch.v[gsa_at + n] = sum.y;
    }
    if (what == GRAD_COLS) {
        pc.o.v[vec_at + n] = sum.x;               // gr
        pc.o.v[tokens + vec_at + n] = sum.y;      // gw
        pc.o.v[2 * tokens + vec_at + n] = sum.z;  // gk
        pc.o.v[5 * tokens + vec_at + n] = sum.w;  // gb
    }
    if (what == GRAD_A) pc.o.v[4 * tokens + vec_at + n] = sum.x;
#else
    pc.o.v[vec_at + n] = sum.x;  // SA, then Y, in the token's y column
#endif
}

// Each row's sum is split over `ways` invocations (consecutive ones read consecutive columns),
// `lines` rows per pass; the first invocation of a row adds the parts in order.
void reduce_rows(uint what) {
    uint tid = gl_LocalInvocationID.x, ways = max(1u, 256u / pc.S), lines = 256u / ways;
    uint line = tid / ways, part = tid % ways;
    for (uint first = 0; first < pc.S; first += lines) {
        uint i = first + line;
        bool in_range = line < lines && i < pc.S;
        vec4 acc = vec4(0.0);
        if (in_range)
            for (uint j = part; j < pc.S; j += ways) acc += term(what, i, j);
        partial[tid] = acc;
        barrier();
        if (in_range && part == 0) {
            vec4 sum = vec4(0.0);
            for (uint q = 0; q < ways; ++q) sum += partial[tid + q];
            store(what, i, sum);
        }
        sync();
    }
}

// As reduce_rows, down the columns: consecutive invocations take consecutive columns.
void reduce_cols(uint what) {
    uint tid = gl_LocalInvocationID.x, ways = max(1u, 256u / pc.S), lines = 256u / ways;
    uint line = tid % lines, part = tid / lines;
    for (uint first = 0; first < pc.S; first += lines) {
        uint j = first + line;
        bool in_range = part < ways && j < pc.S;
        vec4 acc = vec4(0.0);
        if (in_range)
            for (uint i = part; i < pc.S; i += ways) acc += term(what, i, j);
        partial[tid] = acc;
        barrier();
        if (in_range && part == 0) {
            vec4 sum = vec4(0.0);
            for (uint q = 0; q < ways; ++q) sum += partial[line + q * lines];
            store(what, j, sum);
        }
        sync();
    }
}

#if defined(BACKWARD)
// dst = the state after the token at vec_at, from the state at state_at (dst may be state_at).
void advance(uint dst) {
    reduce_rows(SA);
    for (uint e = gl_LocalInvocationID.x; e < pc.S * pc.S; e += 256) {
        uint i = e / pc.S, j = e % pc.S;
        pc.scratch.v[dst + e] = state_of(e) * pc.w.v[vec_at + j] + pc.v.v[vec_at + i] * pc.k.v[vec_at + j] +
                                sa_of(i) * pc.b.v[vec_at + j];
    }
    sync();
}

void copy_matrix(uint src, uint dst) {
    for (uint e = gl_LocalInvocationID.x; e < pc.S * pc.S; e += 256) pc.scratch.v[dst + e] = pc.scratch.v[src + e];
    sync();
}
#endif

void main() {
    uint task = flat_group(), head = task % pc.H, seq = task / pc.H;
    uint tid = gl_LocalInvocationID.x, SS = pc.S * pc.S, len = pc.T / pc.n_seqs, t0 = seq * len;
#if defined(FORWARD)
    state_at = pc.S * pc.H * pc.T + task * SS;
    for (uint e = tid; e < SS; e += 256) pc.o.v[state_at + e] = pc.state.v[task * SS + e];
    sync();
    for (uint t = t0; t < t0 + len; ++t) {
        vec_at = (t * pc.H + head) * pc.S;
        reduce_rows(SA);
        for (uint e = tid; e < SS; e += 256) {
            uint i = e / pc.S, j = e % pc.S;
            pc.o.v[state_at + e] = pc.o.v[state_at + e] * pc.w.v[vec_at + j] +
                                   pc.v.v[vec_at + i] * pc.k.v[vec_at + j] + sa_of(i) * pc.b.v[vec_at + j];
        }
        sync();
        reduce_rows(Y);
    }
#elif defined(BACKWARD)
    uint n_chunks = (len + pc.chunk - 1) / pc.chunk;
    uint base = task * ((1 + pc.chunk + n_chunks) * SS + 2 * pc.S);
    adjoint_at = base;
    uint states_at = base + SS;                  // the chunk's states: slot q = before its token q
    uint checkpoints_at = states_at + pc.chunk * SS;  // checkpoint c = before token c * chunk
    sa_at = checkpoints_at + n_chunks * SS;
    gsa_at = sa_at + pc.S;
    tokens = pc.S * pc.H * pc.T;
    // forward pass keeping the checkpoints
    for (uint e = tid; e < SS; e += 256) pc.scratch.v[checkpoints_at + e] = pc.state.v[task * SS + e];
    sync();
    for (uint c = 0; c + 1 < n_chunks; ++c) {
        uint next = checkpoints_at + (c + 1) * SS;
        copy_matrix(checkpoints_at + c * SS, next);
        state_at = next;
        for (uint q = 0; q < pc.chunk; ++q) {
            vec_at = ((t0 + c * pc.chunk + q) * pc.H + head) * pc.S;
            advance(next);
        }
    }
    // the walk back, from dL/d(final state)
    for (uint e = tid; e < SS; e += 256) pc.scratch.v[adjoint_at + e] = pc.g.v[tokens + task * SS + e];
    sync();
    for (uint c = n_chunks; c-- > 0;) {
        uint count = min(pc.chunk, len - c * pc.chunk);
        copy_matrix(checkpoints_at + c * SS, states_at);
        for (uint q = 1; q < count; ++q) {
            state_at = states_at + (q - 1) * SS;
            vec_at = ((t0 + c * pc.chunk + q - 1) * pc.H + head) * pc.S;
            advance(states_at + q * SS);
        }
        for (uint q = count; q-- > 0;) {
            state_at = states_at + q * SS;  // S_{t-1}
            vec_at = ((t0 + c * pc.chunk + q) * pc.H + head) * pc.S;
            reduce_rows(SA);
            for (uint e = tid; e < SS; e += 256)  // D += gy r^T
                pc.scratch.v[adjoint_at + e] += pc.g.v[vec_at + e / pc.S] * pc.r.v[vec_at + e % pc.S];
            sync();
            reduce_cols(GRAD_COLS);
            reduce_rows(GRAD_ROWS);
            for (uint e = tid; e < SS; e += 256) {  // D = D diag(w) + gsa a^T (GRAD_A does not read D)
                uint i = e / pc.S, j = e % pc.S;
                pc.scratch.v[adjoint_at + e] = adjoint_of(e) * pc.w.v[vec_at + j] + gsa_of(i) * pc.a.v[vec_at + j];
            }
            reduce_cols(GRAD_A);
        }
    }
    for (uint e = tid; e < SS; e += 256) pc.o.v[6 * tokens + task * SS + e] = adjoint_of(e);
#endif
}
