// decayed_pairs and its backward (native/cpu_decayed_pairs.cpp has the layouts and formulas):
// a chunk's pairs of tokens weighted per channel by the decays between them. FORWARD: one
// invocation per pair (t, s) of a chunk, which sums the channels in order in a register, each
// channel's decay the sum of its log decays from s + 1 up. FORWARD_STAGED (chunks of at most 64
// tokens): the same sums, one workgroup per chunk, the channels a block at a time through shared
// memory: the block's inputs read once (coalesced), each range's running sum from s made once and
// its exp kept for every pair that ends in it, then each pair adds the block's channels in order:
// FORWARD's sums in FORWARD's order. BACKWARD: one invocation per (chunk, channel j),
// walking that channel's pairs in the CPU kernel's order; the gradients it writes are its own
// elements (and its own scratch column for the suffix sums), so nothing is shared and there are
// no atomics.
#version 450
#extension GL_EXT_control_flow_attributes : require
#include "common.glsl"
#include "staged_arrays.def"

layout(push_constant) uniform Push {
    Floats left;
    Floats right;
    Floats log_decay;
    Floats o;
#if defined(BACKWARD)
    Floats g;
#endif
    uint S;
    uint L;
    uint B;
    uint through_last;  // 1: s <= t, the steps s < r <= t; 0: s < t, the steps s < r < t
} pc;

// The last step of pair (t, s)'s range (its first is s + 1).
int range_end(int t) { return pc.through_last == 1u ? t : t - 1; }

#if defined(FORWARD_STAGED)
const uint MAX_L = RK_STAGED_PAIRS_TOKENS, DECAYS = RK_STAGED_PAIRS_DECAYS, INPUTS = RK_STAGED_PAIRS_INPUTS;
const uint PAIRS_EACH = MAX_L * MAX_L / 256;
shared float decays[DECAYS];  // the block's decays, [channel][s][t] with rows of L + 1
shared float lefts[INPUTS], rights[INPUTS], logs[INPUTS];  // the block's inputs, [channel][token] with rows of L + 1

// Channels per block: its decays (L + 1 floats per pair row) and inputs fit.
uint block_channels() { return max(1u, min(pc.S, min(DECAYS / (pc.L * (pc.L + 1)), INPUTS / (pc.L + 1)))); }

void main() {
    uint b = flat_group(), tid = gl_LocalInvocationID.x, L = pc.L, row = L + 1;
    if (b >= pc.B) return;  // a whole workgroup of the folded grid's padding
    uint chunk = b * pc.S * L, CB = block_channels();
    float acc[PAIRS_EACH];
    [[unroll]] for (uint m = 0; m < PAIRS_EACH; ++m) acc[m] = 0.0;
    for (uint j0 = 0; j0 < pc.S; j0 += CB) {
        uint cb = min(CB, pc.S - j0);
        for (uint e = tid; e < cb * L; e += 256) {  // consecutive invocations, consecutive channels
            uint jj = e % cb, t = e / cb, at = chunk + j0 + jj + t * pc.S;
            lefts[jj * row + t] = pc.left.v[at];
            rights[jj * row + t] = pc.right.v[at];
            logs[jj * row + t] = pc.log_decay.v[at];
        }
        barrier();
        for (uint e = tid; e < cb * L; e += 256) {  // range (channel jj, from s): its running sum, each end's exp
            uint s = e % L, jj = e / L;
            int first = pc.through_last == 1u ? int(s) : int(s) + 1;
            float sum = 0.0;
            for (int t = first; t < int(L); ++t) {
                if (range_end(t) > int(s)) sum += logs[jj * row + uint(range_end(t))];
                decays[(jj * L + s) * row + uint(t)] = exp(sum);
            }
        }
        barrier();
        [[unroll]] for (uint m = 0; m < PAIRS_EACH; ++m) {
            uint e = tid + 256 * m, t = e % L, s = e / L;
            if (e < L * L && (pc.through_last == 1u ? s <= t : s < t)) {
                float a = acc[m];
                for (uint jj = 0; jj < cb; ++jj)
                    a += lefts[jj * row + t] * rights[jj * row + s] * decays[(jj * L + s) * row + t];
                acc[m] = a;
            }
        }
        barrier();
    }
    [[unroll]] for (uint m = 0; m < PAIRS_EACH; ++m) {
        uint e = tid + 256 * m;
        if (e < L * L) pc.o.v[b * L * L + e] = acc[m];  // [t, s, b] at t + L s + L L b
    }
}
#else
void main() {
    uint id = flat_invocation();
    int L = int(pc.L);
#if defined(FORWARD)
    if (id >= pc.B * pc.L * pc.L) return;
    uint b = id / (pc.L * pc.L), chunk = b * pc.S * pc.L;  // [j, t] of chunk b at chunk + j + t S
    int t = int(id % pc.L), s = int((id / pc.L) % pc.L);
    float acc = 0.0;
    if (pc.through_last == 1u ? s <= t : s < t) {
        for (uint j = 0; j < pc.S; ++j) {
            uint at = chunk + j;
            float sum = 0.0;  // the range's log decays, added from s up as the CPU's running sum adds them
            for (int r = s + 1; r <= range_end(t); ++r) sum += pc.log_decay.v[at + uint(r) * pc.S];
            acc += pc.left.v[at + uint(t) * pc.S] * pc.right.v[at + uint(s) * pc.S] * exp(sum);
        }
    }
    pc.o.v[id] = acc;  // [t, s, b] at t + L s + L L b
#elif defined(BACKWARD)
    if (id >= pc.B * pc.S) return;
    uint b = id / pc.S, at = b * pc.S * pc.L + id % pc.S, block = pc.S * pc.L * pc.B;
    uint g_right = block, g_log_decay = 2 * block, x = 3 * block;  // x: this channel's scratch column
    for (uint t = 0; t < pc.L; ++t) {
        pc.o.v[at + t * pc.S] = 0.0;
        pc.o.v[g_right + at + t * pc.S] = 0.0;
        pc.o.v[g_log_decay + at + t * pc.S] = 0.0;
    }
    for (int s = 0; s < L; ++s) {
        int first = pc.through_last == 1u ? s : s + 1;
        float sum = 0.0, right_s = pc.right.v[at + uint(s) * pc.S];
        for (int t = first; t < L; ++t) {
            if (range_end(t) > s) sum += pc.log_decay.v[at + uint(range_end(t)) * pc.S];
            float weight = pc.g.v[b * pc.L * pc.L + uint(t) + uint(s) * pc.L] * exp(sum);
            float left_t = pc.left.v[at + uint(t) * pc.S];
            pc.o.v[at + uint(t) * pc.S] += weight * right_s;
            pc.o.v[g_right + at + uint(s) * pc.S] += weight * left_t;
            pc.o.v[x + at + uint(t) * pc.S] = weight * left_t * right_s;
        }
        float suffix = 0.0;
        for (int t = L - 1; t >= first; --t) {
            suffix += pc.o.v[x + at + uint(t) * pc.S];
            if (range_end(t) > s) pc.o.v[g_log_decay + at + uint(range_end(t)) * pc.S] += suffix;
        }
    }
    for (uint t = 0; t < pc.L; ++t) pc.o.v[x + at + t * pc.S] = 0.0;  // the scratch: zeros on return
#endif
}
#endif
