// Mamba's selective scan (ggml_ssm_scan), forward, one subgroup per kRows rows p of a head's
// state: lane l holds the states n = l + subgroup_size * j (j < LANE_STATES) of those rows in
// registers, and y[p] = sum_n S[n, p] C[n] is a subgroupAdd. No shared memory and no barriers:
// a token's B, C, x and dt are loaded while the previous token is computed, and the many
// subgroups (every kRows rows of every head and sequence) hide what latency is left.
// Sizes, formulas and the packed layouts: native/ssm_scan.hpp and native/cpu_scan.cpp; which
// shapes run here: vk::scan_kernel in native/vulkan/vk_kernels.cpp.
#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require

layout(push_constant) uniform Push {
    Floats s;
    Floats x;
    Floats dt;
    Floats a;
    Floats b;
    Floats c;
    Ints ids;
    Floats g;  // unused here
    Floats o;
    uint d_state;
    uint head_dim;
    uint n_head;
    uint n_tok;
    uint n_seqs;
    uint n_group;
    uint a_rows;  // 1 (Mamba-2) or d_state (Mamba-1)
    uint n_rs;
} pc;

#include "ssm_scan_common.glsl"

const uint kRows = 2;                  // rows per subgroup: each B and C read serves both
const uint kStates = LANE_STATES;      // states per lane and row: ceil(d_state / subgroup size)

uint lane, q, h;

bool has_state(uint j) { return lane + gl_SubgroupSize * j < pc.d_state; }

uint state_n(uint j) { return lane + gl_SubgroupSize * j; }

// One token's inputs, loaded one token ahead.
struct Token {
    float b[kStates], c[kStates], x[kRows];
    float dt;  // raw
};

Token load_token(uint t, uint p0) {
    Token k;
    uint bc = group_base(q, t, h), xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
    [[unroll]] for (uint j = 0; j < kStates; ++j) {
        k.b[j] = has_state(j) ? pc.b.v[bc + state_n(j)] : 0.0;
        k.c[j] = has_state(j) ? pc.c.v[bc + state_n(j)] : 0.0;
    }
    [[unroll]] for (uint r = 0; r < kRows; ++r) k.x[r] = p0 + r < pc.head_dim ? pc.x.v[xt + p0 + r] : 0.0;
    k.dt = pc.dt.v[(q * pc.n_tok + t) * pc.n_head + h];
    return k;
}

void main() {
    lane = gl_SubgroupInvocationID;
    uint rows_per_group = kRows * gl_NumSubgroups;
    uint groups_per_task = (pc.head_dim + rows_per_group - 1) / rows_per_group;
    uint task = flat_group() / groups_per_task;
    q = task / pc.n_head;
    h = task % pc.n_head;
    uint p0 = (flat_group() % groups_per_task) * rows_per_group + gl_SubgroupID * kRows;
    uint E = pc.d_state * pc.head_dim, y_size = pc.head_dim * pc.n_head * pc.n_tok * pc.n_seqs;

    float rate[kStates], st[kRows * kStates];
    uint init = initial_state(q, h);
    [[unroll]] for (uint j = 0; j < kStates; ++j) {
        rate[j] = has_state(j) ? a_of(h, state_n(j)) : 0.0;
        [[unroll]] for (uint r = 0; r < kRows; ++r) {
            bool ok = has_state(j) && p0 + r < pc.head_dim;
            st[r * kStates + j] = ok ? pc.s.v[init + (p0 + r) * pc.d_state + state_n(j)] : 0.0;
        }
    }

    Token next = load_token(0, p0);
    for (uint t = 0; t < pc.n_tok; ++t) {
        Token k = next;
        if (t + 1 < pc.n_tok) next = load_token(t + 1, p0);
        float dts = softplus_of(k.dt), shared_decay = exp(dts * rate[0]);
        float acc[kRows];
        [[unroll]] for (uint r = 0; r < kRows; ++r) acc[r] = 0.0;
        [[unroll]] for (uint j = 0; j < kStates; ++j) {
            float decay = pc.a_rows == 1 ? shared_decay : exp(dts * rate[j]);
            [[unroll]] for (uint r = 0; r < kRows; ++r) {
                uint e = r * kStates + j;
                st[e] = st[e] * decay + k.b[j] * (k.x[r] * dts);  // past d_state b = 0: the state stays 0
                acc[r] += st[e] * k.c[j];
            }
        }
        uint xt = ((q * pc.n_tok + t) * pc.n_head + h) * pc.head_dim;
        [[unroll]] for (uint r = 0; r < kRows; ++r) {
            float y = subgroupAdd(acc[r]);
            if (lane == 0 && p0 + r < pc.head_dim) pc.o.v[xt + p0 + r] = y;
        }
    }
    [[unroll]] for (uint j = 0; j < kStates; ++j)
        [[unroll]] for (uint r = 0; r < kRows; ++r)
            if (has_state(j) && p0 + r < pc.head_dim)
                pc.o.v[y_size + task * E + (p0 + r) * pc.d_state + state_n(j)] = st[r * kStates + j];
}
