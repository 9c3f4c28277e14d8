// ssm_scan's chunked form (SSD): the states passed along the chunks, and a group's heads' gradients
// summed (native/cpu_ssd_chunks.cpp has the layouts and formulas); gated_linear_attn's chunked form
// (gla_chunks.comp) passes its states here too, with H = 1 and a decay per row of its planes. Variants:
//   FORWARD    in place in the planes [D P, H, c, N]: each holds X_q and leaves with Z_q, the state
//              at its chunk's start (Z_0 from `edge`, the final Z_c to `last`)
//   BACKWARD   each holds gZ_q and leaves with gX_q (gZ'_c from `edge`, gZ'_0 to `last`)
//   GROUP_SUM  gB and gC of each group, the sums of its heads' in order (from per-head [D, H, T, N])
// An invocation per element: of a state (FORWARD, BACKWARD: consecutive invocations, consecutive
// elements, so each chunk's reads and writes coalesce), or of the group's gradients.
#version 450
#include "common.glsl"

layout(push_constant) uniform Push {
    Floats planes;  // GROUP_SUM: the heads' gB, gC
    Floats decay;   // [rows, H, c, N]
    Floats edge;    // GROUP_SUM: the output's gB, then gC
    Floats last;
    uint R;         // a plane's elements, D P (GROUP_SUM: D)
    uint H;
    uint c;         // GROUP_SUM: G
    uint N;         // GROUP_SUM: T N
    uint rows;      // decays per plane, each for R / rows consecutive elements (SSD: 1)
} pc;

#if defined(BACKWARD)
uint chunk_at(uint step) { return pc.c - 1 - step; }  // from the last chunk
#else
uint chunk_at(uint step) { return step; }
#endif

void main() {
    uint id = flat_invocation();
#if defined(GROUP_SUM)
    uint D = pc.R, G = pc.c, TN = pc.N, groups = D * G * TN;
    if (id >= 2 * groups) return;
    uint which = id / groups, e = id % groups, d = e % D, grp = (e / D) % G, t = e / (D * G), heads = pc.H / G;
    uint from = which * D * pc.H * TN + d + D * pc.H * t;
    float sum = 0.0;
    for (uint j = 0; j < heads; ++j) sum += pc.planes.v[from + D * (grp * heads + j)];
    pc.edge.v[id] = sum;
#else
    if (id >= pc.R * pc.H * pc.N) return;
    uint r = id % pc.R, hn = id / pc.R, h = hn % pc.H, n = hn / pc.H, row = r / (pc.R / pc.rows);
    float z = pc.edge.v[id];
    // 4 chunks at a time, their loads before any store (a store to the planes might alias a later
    // load, so the compiler keeps them in order): 4 loads in flight where the walk had one
    for (uint step = 0; step < pc.c; step += 4) {
        float x[4], A[4];
        uint at[4];
        for (uint k = 0; k < 4; ++k) {
            uint q = chunk_at(min(step + k, pc.c - 1));
            at[k] = pc.R * (h + pc.H * (q + pc.c * n)) + r;
            A[k] = pc.decay.v[row + pc.rows * (h + pc.H * (q + pc.c * n))];
            x[k] = pc.planes.v[at[k]];
        }
        for (uint k = 0; k < 4 && step + k < pc.c; ++k) {
            pc.planes.v[at[k]] = z;
#if defined(BACKWARD)
            z = x[k] + A[k] * z;
#else
            z = A[k] * z + x[k];
#endif
        }
    }
    pc.last.v[id] = z;
#endif
}
