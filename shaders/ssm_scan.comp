// Mamba's selective scan (ggml_ssm_scan) and its backward helper: one workgroup per (sequence q,
// head h). Sizes, formulas and the packed layouts: native/ssm_scan.hpp and native/cpu_scan.cpp.
// The state [d_state, head_dim] is spread over the 256 invocations: `lanes` consecutive
// invocations share the rows p = row + rows * j and split the states n = lane + lanes * k, so
// y[p] = sum_n S[n, p] C[n] is a sum within each invocation and then over `lanes` neighbours.
// Each invocation keeps its part of the state in registers, or (MEMORY variants, for states too
// large for registers) in device memory. In the backward pass the recurrences are per element and
// need no synchronisation; the sums over p and n of a chunk's gradients are done afterwards
// from that chunk's stored states and state gradients, one (token, n) or (token, p) pair per
// invocation, in a fixed order (deterministic, no atomics).
#version 450
#include "common.glsl"

layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer SharedFloats { float v[]; };

layout(push_constant) uniform Push {
    Floats s;
    Floats x;
    Floats dt;
    Floats a;
    Floats b;
    Floats c;
    Ints ids;
    Floats g;  // BACKWARD: the gradient of the forward output
    Floats o;
    uint d_state;
    uint head_dim;
    uint n_head;
    uint n_tok;
    uint n_seqs;
    uint n_group;
    uint a_rows;  // 1 (Mamba-2) or d_state (Mamba-1)
    uint n_rs;
    uint chunk;   // tokens between the backward pass's checkpoints
    uint lanes;   // invocations per row, a power of two
    uint slot_shift;  // log2 of the slots per row (a power of two, some past d_state unused)
} pc;

#include "ssm_scan_common.glsl"

const uint kMaxOwned = 64;  // state elements per invocation held in registers

shared float partial[256];

uint lane, row, rows, slot_mask, owned;

// A block of tokens' B, C, x, softplus(dt) (and in the backward pass the gradient of y) staged in
// shared memory: one device-memory round trip per block instead of one per token and element.
// The MEMORY variants, for states or tokens too large for registers and this stage, read device
// memory instead. Each token's code sets `su` (its offset in the stage) and bc, xt (its offsets
// in B/C and x/y).
const uint kStage = 4096;
#if !defined(MEMORY)
shared float stage[kStage];
uint stage_width;  // floats per staged token
#define B_AT(n) stage[su + (n)]
#define C_AT(n) stage[su + pc.d_state + (n)]
#define X_AT(p) stage[su + 2 * pc.d_state + (p)]
#define GY_AT(p) stage[su + 2 * pc.d_state + pc.head_dim + (p)]
#define DTS_AT(q, t, h) stage[su + stage_width - 1]
#else
#define B_AT(n) pc.b.v[bc + (n)]
#define C_AT(n) pc.c.v[bc + (n)]
#define X_AT(p) pc.x.v[xt + (p)]
#define GY_AT(p) pc.g.v[xt + (p)]
#define DTS_AT(q, t, h) softplus_of(pc.dt.v[((q) * pc.n_tok + (t)) * pc.n_head + (h)])
#endif

#if defined(MEMORY)
uint state_at;  // where the running state lives
#define STATE(i, off) o_coherent.v[state_at + (off)]
#define FOR_OWNED(i) for (uint i = 0; i < owned; ++i)
#else
float st[kMaxOwned];
#define STATE(i, off) st[i]
#define FOR_OWNED(i) for (uint i = 0; i < kMaxOwned; ++i) if (i < owned)
#endif

SharedFloats o_coherent;

// The element (p, n) of owned slot i, and whether it exists.
bool element(uint i, out uint p, out uint n) {
    p = row + rows * (i >> pc.slot_shift);
    n = lane + pc.lanes * (i & slot_mask);
    return p < pc.head_dim && n < pc.d_state;
}

// Head h's decay rates, read once: RATE(n) is A[n or 0, h].
#if !defined(MEMORY)
shared float rates[kStage / 2];  // a_rows <= d_state <= kStage / 2 where the stage fits
#define RATE(n) rates[pc.a_rows == 1 ? 0 : (n)]
void load_rates(uint h) {
    for (uint n = gl_LocalInvocationID.x; n < pc.a_rows; n += gl_WorkGroupSize.x) rates[n] = a_of(h, n);
    barrier();
}
#else
#define RATE(n) a_of(h, n)
void load_rates(uint h) {}
#endif

// Tokens one stage holds (every token at once in the MEMORY variants).
uint stage_capacity(bool with_gy) {
#if !defined(MEMORY)
    return kStage / (2 * pc.d_state + (with_gy ? 2 : 1) * pc.head_dim + 1);
#else
    return 0xffffffffu;
#endif
}

// Stages tokens t0 .. t0 + count - 1 of head h of sequence q (count <= stage_capacity): B, C, x,
// (with_gy) the gradient of y, softplus(dt).
void stage_block(uint q, uint h, uint t0, uint count, bool with_gy) {
#if !defined(MEMORY)
    stage_width = 2 * pc.d_state + (with_gy ? 2 : 1) * pc.head_dim + 1;
    barrier();  // every invocation is done with the previous stage
    for (uint e = gl_LocalInvocationID.x; e < count * stage_width; e += gl_WorkGroupSize.x) {
        uint t = t0 + e / stage_width, f = e % stage_width;
        uint bc = group_base(q, t, h), xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
        float v;
        if (f < pc.d_state) v = pc.b.v[bc + f];
        else if (f < 2 * pc.d_state) v = pc.c.v[bc + f - pc.d_state];
        else if (f < 2 * pc.d_state + pc.head_dim) v = pc.x.v[xt + f - 2 * pc.d_state];
        else if (f + 1 < stage_width) v = pc.g.v[xt + f - 2 * pc.d_state - pc.head_dim];
        else v = softplus_of(pc.dt.v[(q * pc.n_tok + t) * pc.n_head + h]);
        stage[e] = v;
    }
    barrier();
#endif
}

// One token of the recurrence on this invocation's elements (the token at stage offset su).
void step(uint q, uint t, uint h, uint su) {
    uint bc = group_base(q, t, h), xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
    float dts = DTS_AT(q, t, h);
    float shared_decay = exp(dts * RATE(0));
    FOR_OWNED(i) {
        uint p, n;
        if (!element(i, p, n)) continue;
        float decay = pc.a_rows == 1 ? shared_decay : exp(dts * RATE(n));
        STATE(i, p * pc.d_state + n) = STATE(i, p * pc.d_state + n) * decay + B_AT(n) * (X_AT(p) * dts);
    }
}

// Copies this invocation's elements between the running state and device memory at `at`.
void load_state(uint at) {
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) STATE(i, p * pc.d_state + n) = o_coherent.v[at + p * pc.d_state + n];
    }
}

void store_state(uint at) {
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) o_coherent.v[at + p * pc.d_state + n] = STATE(i, p * pc.d_state + n);
    }
}

void setup() {
    lane = gl_LocalInvocationID.x % pc.lanes;
    row = gl_LocalInvocationID.x / pc.lanes;
    rows = gl_WorkGroupSize.x / pc.lanes;
    slot_mask = (1u << pc.slot_shift) - 1u;
    owned = ((pc.head_dim + rows - 1) / rows) << pc.slot_shift;
    o_coherent = SharedFloats(uint64_t(pc.o));
}

#if defined(FORWARD)

void main() {
    setup();
    uint task = flat_group(), q = task / pc.n_head, h = task % pc.n_head;
    load_rates(h);
    uint E = pc.d_state * pc.head_dim, y_size = pc.head_dim * pc.n_head * pc.n_tok * pc.n_seqs;
    uint final_at = y_size + task * E;
#if defined(MEMORY)
    state_at = final_at;
#endif
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) STATE(i, p * pc.d_state + n) = pc.s.v[initial_state(q, h) + p * pc.d_state + n];
    }
    uint per_stage = stage_capacity(false);
    for (uint t0 = 0; t0 < pc.n_tok; t0 += per_stage) {
        uint count = min(per_stage, pc.n_tok - t0);
        stage_block(q, h, t0, count, false);
        for (uint u = 0; u < count; ++u) {
            uint t = t0 + u, su = u * (2 * pc.d_state + pc.head_dim + 1);
            uint bc = group_base(q, t, h), xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
            float dts = DTS_AT(q, t, h), shared_decay = exp(dts * RATE(0)), acc = 0.0;
            FOR_OWNED(i) {
                uint p, n;
                if (element(i, p, n)) {
                    float decay = pc.a_rows == 1 ? shared_decay : exp(dts * RATE(n));
                    float s_new = STATE(i, p * pc.d_state + n) * decay + B_AT(n) * (X_AT(p) * dts);
                    STATE(i, p * pc.d_state + n) = s_new;
                    acc += s_new * C_AT(n);
                }
                if ((i & slot_mask) == slot_mask) {  // a row's last slot (the same i for every invocation)
                    partial[gl_LocalInvocationID.x] = acc;
                    barrier();
                    for (uint width = pc.lanes / 2; width > 0; width /= 2) {
                        if (lane < width) partial[gl_LocalInvocationID.x] += partial[gl_LocalInvocationID.x + width];
                        barrier();
                    }
                    uint y_row = row + rows * (i >> pc.slot_shift);
                    if (lane == 0 && y_row < pc.head_dim) pc.o.v[xt + y_row] = partial[gl_LocalInvocationID.x];
                    acc = 0.0;
                }
            }
        }
    }
#if !defined(MEMORY)
    store_state(final_at);
#endif
}

#elif defined(BACKWARD)

#if defined(MEMORY)
uint grad_at;  // the running state gradient: the task's slot of gs0
#define GRAD(i, off) o_coherent.v[grad_at + (off)]
#else
float gr[kMaxOwned];
#define GRAD(i, off) gr[i]
#endif

void main() {
    setup();
    uint task = flat_group(), q = task / pc.n_head, h = task % pc.n_head;
    load_rates(h);
    uint E = pc.d_state * pc.head_dim, Q = pc.chunk, n_chunks = (pc.n_tok + Q - 1) / Q;
    uint y_size = pc.head_dim * pc.n_head * pc.n_tok * pc.n_seqs, final_size = E * pc.n_head * pc.n_seqs;
    uint per_token = pc.d_state * pc.n_head * pc.n_tok * pc.n_seqs;
    uint gx_at = final_size, gdt_at = gx_at + y_size, ga_at = gdt_at + pc.n_head * pc.n_tok * pc.n_seqs;
    uint gb_at = ga_at + per_token, gc_at = gb_at + per_token, scratch_at = gc_at + per_token;
    uint scratch = scratch_at + task * ((n_chunks + 2 * Q + 1) * E + Q * pc.d_state);
    uint checkpoints = scratch, states = scratch + n_chunks * E, grads = states + Q * E;
    uint dt_terms = grads + Q * E;  // [Q][d_state]
#if defined(MEMORY)
    state_at = dt_terms + Q * pc.d_state;
    grad_at = task * E;
#endif

    // the state at each chunk start
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) STATE(i, p * pc.d_state + n) = pc.s.v[initial_state(q, h) + p * pc.d_state + n];
    }
    uint per_stage = stage_capacity(false), width = 2 * pc.d_state + pc.head_dim + 1;
    for (uint t0 = 0; t0 < pc.n_tok; t0 += per_stage) {
        uint count = min(per_stage, pc.n_tok - t0);
        stage_block(q, h, t0, count, false);
        for (uint u = 0; u < count; ++u) {
            uint t = t0 + u;
            if (t % Q == 0) store_state(checkpoints + (t / Q) * E);
            step(q, t, h, u * width);
        }
    }

    // the running gradient of the state, from the final state's gradient
    uint g_final = y_size + task * E;
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) GRAD(i, p * pc.d_state + n) = pc.g.v[g_final + p * pc.d_state + n];
    }
    for (uint c = n_chunks; c-- > 0;) {
        uint t0 = c * Q, len = min(Q, pc.n_tok - t0);
        load_state(checkpoints + c * E);
        for (uint k0 = 0; k0 < len; k0 += per_stage) {  // the states after each token of the chunk
            uint count = min(per_stage, len - k0);
            stage_block(q, h, t0 + k0, count, false);
            for (uint u = 0; u < count; ++u) {
                step(q, t0 + k0 + u, h, u * width);
                store_state(states + (k0 + u) * E);
            }
        }
        uint per_stage_gy = stage_capacity(true), width_gy = 2 * (pc.d_state + pc.head_dim) + 1;
        for (uint end = len; end > 0;) {  // the state gradients, per element, walking back
            uint begin = end - min(end, per_stage_gy);
            stage_block(q, h, t0 + begin, end - begin, true);
            for (uint k = end; k-- > begin;) {
                uint t = t0 + k, su = (k - begin) * width_gy;
                uint bc = group_base(q, t, h), xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
                float dts = DTS_AT(q, t, h), shared_decay = exp(dts * RATE(0));
                FOR_OWNED(i) {
                    uint p, n;
                    if (!element(i, p, n)) continue;
                    uint off = p * pc.d_state + n;
                    float grad = GRAD(i, off) + C_AT(n) * GY_AT(p);  // y_t reads S_t
                    o_coherent.v[grads + k * E + off] = grad;
                    GRAD(i, off) = grad * (pc.a_rows == 1 ? shared_decay : exp(dts * RATE(n)));
                }
            }
            end = begin;
        }
        memoryBarrierBuffer();
        barrier();
        // per (token, n): sums over p of the chunk's gradients -> gA, gB, gC and dt's terms
        for (uint pair = gl_LocalInvocationID.x; pair < len * pc.d_state; pair += gl_WorkGroupSize.x) {
            uint k = pair / pc.d_state, n = pair % pc.d_state, t = t0 + k;
            uint xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
            uint before = k > 0 ? states + (k - 1) * E : checkpoints + c * E;
            float gx_sum = 0.0, gs_sum = 0.0, gc_sum = 0.0;
            for (uint p = 0; p < pc.head_dim; ++p) {
                float grad = o_coherent.v[grads + k * E + p * pc.d_state + n];
                gx_sum += grad * pc.x.v[xt + p];
                gs_sum += grad * o_coherent.v[before + p * pc.d_state + n];
                gc_sum += pc.g.v[xt + p] * o_coherent.v[states + k * E + p * pc.d_state + n];
            }
            float dts = softplus_of(pc.dt.v[(q * pc.n_tok + t) * pc.n_head + h]);
            float an = a_of(h, n), decay = exp(dts * an);
            uint at = ((q * pc.n_tok + t) * pc.n_head + h) * pc.d_state + n;
            pc.o.v[ga_at + at] = dts * decay * gs_sum;
            pc.o.v[gb_at + at] = dts * gx_sum;
            pc.o.v[gc_at + at] = gc_sum;
            o_coherent.v[dt_terms + k * pc.d_state + n] = an * decay * gs_sum + pc.b.v[group_base(q, t, h) + n] * gx_sum;
        }
        // per (token, p): gx = dts * sum_n grad[n, p] B[n]
        for (uint pair = gl_LocalInvocationID.x; pair < len * pc.head_dim; pair += gl_WorkGroupSize.x) {
            uint k = pair / pc.head_dim, p = pair % pc.head_dim, t = t0 + k, bc = group_base(q, t, h);
            float acc = 0.0;
            for (uint n = 0; n < pc.d_state; ++n) acc += o_coherent.v[grads + k * E + p * pc.d_state + n] * pc.b.v[bc + n];
            float dts = softplus_of(pc.dt.v[(q * pc.n_tok + t) * pc.n_head + h]);
            pc.o.v[gx_at + ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim + p] = dts * acc;
        }
        memoryBarrierBuffer();
        barrier();
        for (uint k = gl_LocalInvocationID.x; k < len; k += gl_WorkGroupSize.x) {
            float acc = 0.0;
            for (uint n = 0; n < pc.d_state; ++n) acc += o_coherent.v[dt_terms + k * pc.d_state + n];
            uint at = (q * pc.n_tok + t0 + k) * pc.n_head + h;
            pc.o.v[gdt_at + at] = acc * softplus_slope(pc.dt.v[at]);
        }
        memoryBarrierBuffer();
        barrier();  // the next chunk reuses the scratch
    }
#if !defined(MEMORY)
    FOR_OWNED(i) {
        uint p, n;
        if (element(i, p, n)) pc.o.v[task * E + p * pc.d_state + n] = gr[i];
    }
#endif
}

#endif
