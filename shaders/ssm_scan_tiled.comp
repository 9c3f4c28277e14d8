// The backward helper of Mamba's selective scan (ggml_ssm_scan) with the state [d_state,
// head_dim] cut into small tiles, one per invocation, held in registers for the whole sequence.
// Sizes, formulas and the packed layouts: native/ssm_scan.hpp and native/cpu_scan.cpp; which
// shapes run here and which on ssm_scan.comp: vk::scan_kernel in native/vulkan/vk_kernels.cpp.
//
// One workgroup per (sequence, head). Invocation tid owns the states n = tn + n_blocks * j
// (j < kStates) of the rows p = tp + p_blocks * i (i < kRows), with tn = tid % n_blocks and
// tp = tid / n_blocks: neighbouring invocations hold neighbouring states, so their writes to the
// shared sums are contiguous. A first walk stores the state at every `chunk`-th token (the
// checkpoints, in the output's scratch region: each invocation reads back only what it wrote).
// The walk back then recomputes, for each token t of a chunk, S_{t-1} from the chunk's
// checkpoint (the decay is never inverted), carries the state gradient G in registers, and sums
// each token's gradients over the rows (gA, gB, gC), the states (gx) and everything (gdt)
// through shared memory, in a fixed order: deterministic, no atomics. The walks read tokens
// from shared-memory stages of up to kTokens tokens: walking forward, the next stage is loaded
// while one is used; walking back, each stage's first state is recomputed from the chunk's
// checkpoint, so chunks may be longer than a stage.
#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require

layout(push_constant) uniform Push {
    Floats s;
    Floats x;
    Floats dt;
    Floats a;
    Floats b;
    Floats c;
    Ints ids;
    Floats g;  // the gradient of the forward output
    Floats o;
    uint d_state;
    uint head_dim;
    uint n_head;
    uint n_tok;
    uint n_seqs;
    uint n_group;
    uint a_rows;  // 1 (Mamba-2) or d_state (Mamba-1)
    uint n_rs;
    uint chunk;           // tokens between checkpoints
    uint n_blocks;        // invocations sharing a row's states: ceil(d_state / kStates)
    uint p_blocks;        // invocations sharing a state's rows: ceil(head_dim / kRows)
    uint scratch_stride;  // floats of scratch per (sequence, head)
} pc;

#include "ssm_scan_common.glsl"

// The stage: `count` tokens from t0, `width` floats each (at most 512): B, C, every row of x,
// every row of dy, softplus(dt) and its slope. Invocation tid loads the fields
// f = tid + 256 r (r < kFields) of every staged token: the addresses are a field's base plus the
// token times its stride, set up once. A token's walk has no load of its own.
const uint kFields = 2;
const uint kStates = 4;    // states n per invocation
const uint kRows = 8;      // rows p per invocation
#if defined(LARGE_STAGE)   // devices with 48 KiB of shared memory
const uint kTokens = 24;   // tokens per stage at most (and kStage / width)
const uint kStage = 5888;  // floats
#else
const uint kTokens = 8;
const uint kStage = 2048;
#endif

shared float stage[kStage];
float prefetched[kFields * kTokens];
uint64_t field_base[kFields];  // the address of the field at token 0 (0: no such field)
uint field_stride[kFields];    // floats between tokens

uint tid, tn, q, h, width;
float rate[kStates];  // A[n] of this invocation's states (A[0, h] for all of them in Mamba-2)

bool has_state(uint j) { return tn + pc.n_blocks * j < pc.d_state; }

uint state_n(uint j) { return tn + pc.n_blocks * j; }

void load_rates() {
    [[unroll]] for (uint j = 0; j < kStates; ++j) rate[j] = has_state(j) ? a_of(h, state_n(j)) : 0.0;
}

float decay_of(uint j, float dts, float shared_decay) {
    return pc.a_rows == 1 ? shared_decay : exp(dts * rate[j]);
}

uint x_base(uint t) { return ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim; }

uint dt_at(uint t) { return (q * pc.n_tok + t) * pc.n_head + h; }

uint64_t float_address(Floats data, uint index) { return uint64_t(data) + 4 * uint64_t(index); }

void set_up_fields() {
    width = 2 * (pc.d_state + pc.head_dim + 1);
    uint group_t0 = group_base(q, 0, h), group_stride = pc.n_group * pc.d_state;
    [[unroll]] for (uint r = 0; r < kFields; ++r) {
        uint f = tid + 256 * r;
        field_base[r] = 0;
        field_stride[r] = 0;
        if (f >= width) continue;
        if (f < pc.d_state) {
            field_base[r] = float_address(pc.b, group_t0 + f);
            field_stride[r] = group_stride;
        } else if (f < 2 * pc.d_state) {
            field_base[r] = float_address(pc.c, group_t0 + f - pc.d_state);
            field_stride[r] = group_stride;
        } else if (f < 2 * pc.d_state + pc.head_dim) {
            field_base[r] = float_address(pc.x, x_base(0) + f - 2 * pc.d_state);
            field_stride[r] = pc.n_head * pc.head_dim;
        } else if (f < 2 * (pc.d_state + pc.head_dim)) {
            field_base[r] = float_address(pc.g, x_base(0) + f - 2 * pc.d_state - pc.head_dim);
            field_stride[r] = pc.n_head * pc.head_dim;
        } else {
            field_base[r] = float_address(pc.dt, dt_at(0));
            field_stride[r] = pc.n_head;
        }
    }
}

// Loads tokens t0 .. t0 + count - 1 into registers; a later store_stage moves them to the stage.
void prefetch(uint t0, uint count) {
    [[unroll]] for (uint r = 0; r < kFields; ++r)
        [[unroll]] for (uint u = 0; u < kTokens; ++u) {
            bool ok = field_base[r] != 0 && u < count;
            prefetched[r * kTokens + u] = ok ? Floats(field_base[r] + 4 * uint64_t(field_stride[r] * (t0 + u))).v[0] : 0.0;
        }
}

void store_stage(uint count) {  // the caller puts a barrier between the stage's last reader and this
    [[unroll]] for (uint r = 0; r < kFields; ++r) {
        uint f = tid + 256 * r;
        if (f >= width) continue;
        [[unroll]] for (uint u = 0; u < kTokens; ++u) {
            if (u >= count) break;
            float v = prefetched[r * kTokens + u];
            if (f == width - 2) v = softplus_of(v);
            else if (f == width - 1) v = softplus_slope(v);
            stage[u * width + f] = v;
        }
    }
}

// Stages tokens t0 .. t0 + count - 1 at once (their loads are not hidden).
void stage_tokens(uint t0, uint count) {
    prefetch(t0, count);
    barrier();  // every invocation is done with the previous stage
    store_stage(count);
    barrier();
}

// One token's per-invocation gradient sums: [quantity][tp][n] for quantity 0: sum_p G x (gB),
// 1: sum_p S dy (gC), 2: sum_p G S_prev (gA); [p][tn] (stride n_blocks + 1) for gx; and each
// invocation's share of gdt, then 16 partial sums of those.
const uint kMaxStates = 1024;  // p_blocks * n_blocks * kStates, since p_blocks * n_blocks <= 256
const uint kMaxRows = 2560;    // p_blocks * kRows * (n_blocks + 1) (the host checks)
shared float state_sums[3 * kMaxStates];
shared float row_sums[kMaxRows];
shared float dt_shares[256];
shared float dt_partials[16];

uint tp;
bool in_head;
const uint kElements = kStates * kRows;

// Element (j, i) = j * kRows + i: state n = state_n(j) of row p = tp + p_blocks * i.
bool has_row(uint i) { return in_head && tp + pc.p_blocks * i < pc.head_dim; }

bool has(uint j, uint i) { return has_state(j) && has_row(i); }

uint state_offset(uint j, uint i) { return (tp + pc.p_blocks * i) * pc.d_state + state_n(j); }

// S <- S * decay + dts * B x^T for the staged token at su.
void step(inout float st[kElements], uint su) {
    float dts = stage[su + width - 2], shared_decay = exp(dts * rate[0]);
    float xs[kRows];
    [[unroll]] for (uint i = 0; i < kRows; ++i)  // zeros past head_dim and d_state keep those elements 0
        xs[i] = has_row(i) ? stage[su + 2 * pc.d_state + tp + pc.p_blocks * i] * dts : 0.0;
    [[unroll]] for (uint j = 0; j < kStates; ++j) {
        float decay = decay_of(j, dts, shared_decay), bn = has_state(j) ? stage[su + state_n(j)] : 0.0;
        [[unroll]] for (uint i = 0; i < kRows; ++i) st[j * kRows + i] = st[j * kRows + i] * decay + bn * xs[i];
    }
}

void main() {
    tid = gl_LocalInvocationID.x;
    tn = tid % pc.n_blocks;
    tp = tid / pc.n_blocks;
    in_head = tp < pc.p_blocks;
    uint task = flat_group();
    q = task / pc.n_head;
    h = task % pc.n_head;
    uint E = pc.d_state * pc.head_dim, Q = pc.chunk, n_chunks = (pc.n_tok + Q - 1) / Q;
    uint y_size = pc.head_dim * pc.n_head * pc.n_tok * pc.n_seqs, final_size = E * pc.n_head * pc.n_seqs;
    uint per_token = pc.d_state * pc.n_head * pc.n_tok * pc.n_seqs;
    uint gx_at = final_size, gdt_at = gx_at + y_size, ga_at = gdt_at + pc.n_head * pc.n_tok * pc.n_seqs;
    uint gb_at = ga_at + per_token, gc_at = gb_at + per_token;
    uint checkpoints = gc_at + per_token + task * pc.scratch_stride;
    uint n_pad = pc.n_blocks * kStates, row_stride = pc.n_blocks + 1;
    set_up_fields();
    load_rates();
    float reducer_rate[4];  // A[n] for the states n = tid + 256 m this invocation sums (d_state <= 1024)
    [[unroll]] for (uint m = 0; m < 4; ++m) reducer_rate[m] = tid + 256 * m < pc.d_state ? a_of(h, tid + 256 * m) : 0.0;

    // the walk forward: the state at each chunk start
    uint K = min(kTokens, kStage / width);  // tokens per stage (the host checks K >= 1)
    float st[kElements], gr[kElements], block_start[kElements];
    uint init = initial_state(q, h);
    [[unroll]] for (uint j = 0; j < kStates; ++j)
        [[unroll]] for (uint i = 0; i < kRows; ++i)
            st[j * kRows + i] = has(j, i) ? pc.s.v[init + state_offset(j, i)] : 0.0;
    prefetch(0, min(K, pc.n_tok));
    for (uint b0 = 0; b0 < pc.n_tok; b0 += K) {
        uint count = min(K, pc.n_tok - b0);
        barrier();  // every invocation is done with the previous stage
        store_stage(count);
        barrier();
        if (b0 + K < pc.n_tok) prefetch(b0 + K, min(K, pc.n_tok - b0 - K));
        for (uint k = 0; k < count; ++k) {
            uint t = b0 + k;
            if (t % Q == 0) {
                [[unroll]] for (uint j = 0; j < kStates; ++j)
                    [[unroll]] for (uint i = 0; i < kRows; ++i)
                        if (has(j, i)) pc.o.v[checkpoints + (t / Q) * E + state_offset(j, i)] = st[j * kRows + i];
            }
            step(st, k * width);
        }
    }

    // the walk back, from the final state's gradient, a chunk at a time and within it a stage at
    // a time from the last
    [[unroll]] for (uint j = 0; j < kStates; ++j)
        [[unroll]] for (uint i = 0; i < kRows; ++i)
            gr[j * kRows + i] = has(j, i) ? pc.g.v[y_size + task * E + state_offset(j, i)] : 0.0;
    for (uint c = n_chunks; c-- > 0;) {
        uint t0 = c * Q, len = min(Q, pc.n_tok - t0);
        for (uint b0 = (len - 1) / K * K;; b0 -= K) {
            // the state before the stage's first token: the checkpoint, walked over the chunk's
            // earlier stages
            [[unroll]] for (uint j = 0; j < kStates; ++j)
                [[unroll]] for (uint i = 0; i < kRows; ++i)
                    block_start[j * kRows + i] = has(j, i) ? pc.o.v[checkpoints + c * E + state_offset(j, i)] : 0.0;
            for (uint a0 = 0; a0 < b0; a0 += K) {
                stage_tokens(t0 + a0, K);
                for (uint k = 0; k < K; ++k) step(block_start, k * width);
            }
            uint count = min(K, len - b0);
            stage_tokens(t0 + b0, count);
            for (uint k = count; k-- > 0;) {
                uint t = t0 + b0 + k, su = k * width;

                st = block_start;  // S_{t-1}, recomputed from the stage's first state
                for (uint u = 0; u < k; ++u) step(st, u * width);

                float dts = stage[su + width - 2], shared_decay = exp(dts * rate[0]);
                float xs[kRows], dys[kRows], cs[kStates], gx[kRows];
                [[unroll]] for (uint i = 0; i < kRows; ++i) {
                    xs[i] = has_row(i) ? stage[su + 2 * pc.d_state + tp + pc.p_blocks * i] : 0.0;
                    dys[i] = has_row(i) ? stage[su + 2 * pc.d_state + pc.head_dim + tp + pc.p_blocks * i] : 0.0;
                    gx[i] = 0.0;
                }
                [[unroll]] for (uint j = 0; j < kStates; ++j) cs[j] = has_state(j) ? stage[su + pc.d_state + state_n(j)] : 0.0;
                float dt_share = 0.0;
                [[unroll]] for (uint j = 0; j < kStates; ++j) {
                    uint n = state_n(j);
                    float bn = has_state(j) ? stage[su + n] : 0.0, decay = decay_of(j, dts, shared_decay);
                    float gb = 0.0, gc = 0.0, gs = 0.0;
                    [[unroll]] for (uint i = 0; i < kRows; ++i) {
                        uint e = j * kRows + i;
                        gr[e] += cs[j] * dys[i];  // y_t reads S_t
                        gs += gr[e] * st[e];
                        gb += gr[e] * xs[i];
                        gx[i] += gr[e] * bn;
                        st[e] = st[e] * decay + bn * (xs[i] * dts);  // S_t
                        gc += st[e] * dys[i];
                    }
                    if (in_head) {  // elements past d_state or head_dim add zeros
                        state_sums[(0 * pc.p_blocks + tp) * n_pad + n] = gb;
                        state_sums[(1 * pc.p_blocks + tp) * n_pad + n] = gc;
                        state_sums[(2 * pc.p_blocks + tp) * n_pad + n] = gs;
                    }
                    dt_share += rate[j] * decay * gs + bn * gb;
                    [[unroll]] for (uint i = 0; i < kRows; ++i) gr[j * kRows + i] *= decay;  // on to S_{t-1}
                }
                if (in_head) {
                    [[unroll]] for (uint i = 0; i < kRows; ++i) row_sums[(tp + pc.p_blocks * i) * row_stride + tn] = gx[i];
                }
                dt_shares[tid] = in_head ? dt_share : 0.0;
                barrier();
                [[unroll]] for (uint m = 0; m < 4; ++m) {
                    uint n = tid + 256 * m;
                    if (n >= pc.d_state) break;
                    float gb = 0.0, gc = 0.0, gs = 0.0;
                    for (uint r = 0; r < pc.p_blocks; ++r) {
                        gb += state_sums[(0 * pc.p_blocks + r) * n_pad + n];
                        gc += state_sums[(1 * pc.p_blocks + r) * n_pad + n];
                        gs += state_sums[(2 * pc.p_blocks + r) * n_pad + n];
                    }
                    uint at = ((q * pc.n_tok + t) * pc.n_head + h) * pc.d_state + n;
                    pc.o.v[ga_at + at] = dts * exp(dts * reducer_rate[m]) * gs;
                    pc.o.v[gb_at + at] = dts * gb;
                    pc.o.v[gc_at + at] = gc;
                }
                for (uint p = tid; p < pc.head_dim; p += gl_WorkGroupSize.x) {
                    float sum = 0.0;
                    for (uint r = 0; r < pc.n_blocks; ++r) sum += row_sums[p * row_stride + r];
                    pc.o.v[gx_at + x_base(t) + p] = dts * sum;
                }
                if (tid < 16) {
                    float sum = 0.0;
                    for (uint r = 0; r < 16; ++r) sum += dt_shares[tid * 16 + r];
                    dt_partials[tid] = sum;
                }
                barrier();
                if (tid == 0) {
                    float sum = 0.0;
                    for (uint r = 0; r < 16; ++r) sum += dt_partials[r];
                    pc.o.v[gdt_at + dt_at(t)] = sum * stage[su + width - 1];
                }
            }
            if (b0 == 0) break;
        }
    }
    [[unroll]] for (uint j = 0; j < kStates; ++j)
        [[unroll]] for (uint i = 0; i < kRows; ++i)
            if (has(j, i)) pc.o.v[task * E + state_offset(j, i)] = gr[j * kRows + i];
}
