// wkv7_chunk_states and its backward (native/cpu_wkv7_chunks.cpp has the layouts and the
// formulas): rwkv_wkv7's chunked form passing its state from chunk to chunk. One workgroup per
// batch n walks the chunks in order (FORWARD) or from the end (BACKWARD); within a chunk, each
// product's outputs are spread over the invocations (e = tid + 256 m), each summing its terms in
// the CPU kernel's order, so there are no atomics and the results are deterministic. The S x S
// states live in global memory, so any head size fits.
#version 450
#include "common.glsl"

// Storage that invocations of one workgroup write and then read from one another.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Shared { float v[]; };

layout(push_constant) uniform Push {
    Floats W;
    Floats U;
    Floats B;
    Floats K;
    Floats V;
    Floats decay;
    Floats Z0;
    Shared o;
#if defined(BACKWARD)
    Floats g;
    Floats Z;  // the forward's output: the state before each chunk
#endif
    uint L;
    uint S;
    uint N;
    uint c;
} pc;

// Makes every invocation's global writes visible to the whole workgroup.
void sync() {
    memoryBarrierBuffer();
    barrier();
}

uint n, LS, SS;
uint block_at(uint q) { return (n + pc.N * q) * LS; }
uint state_at(uint q) { return (n + pc.N * q) * SS; }

#if defined(FORWARD)
float state(uint at) { return pc.o.v[at]; }
#else
float state(uint at) { return pc.Z.v[at]; }
#endif

// T = W Z + U, the chunk's sa from its start state at z, into `scratch`.
void sa_of_chunk(uint b, uint z, uint scratch) {
    for (uint e = gl_LocalInvocationID.x; e < LS; e += 256) {
        uint l = e % pc.L, j = e / pc.L;
        float t = pc.U.v[b + e];
        for (uint i = 0; i < pc.S; ++i) t += pc.W.v[b + l + i * pc.L] * state(z + i + j * pc.S);
        pc.o.v[scratch + e] = t;
    }
}

void main() {
    n = flat_group();
    LS = pc.L * pc.S;
    SS = pc.S * pc.S;
    uint tid = gl_LocalInvocationID.x;
#if defined(FORWARD)
    uint scratch = SS * pc.N * (pc.c + 1) + n * LS;
    for (uint e = tid; e < SS; e += 256) pc.o.v[state_at(0) + e] = pc.Z0.v[n * SS + e];
    sync();
    for (uint q = 0; q < pc.c; ++q) {
        uint b = block_at(q), z = state_at(q), next = state_at(q + 1), gamma = (n + pc.N * q) * pc.S;
        sa_of_chunk(b, z, scratch);
        sync();
        for (uint e = tid; e < SS; e += 256) {  // Z_{q+1} = decay Z + B^T T + K^T V
            uint i = e % pc.S, j = e / pc.S;
            float acc = pc.decay.v[gamma + i] * pc.o.v[z + e];
            for (uint l = 0; l < pc.L; ++l)
                acc += pc.B.v[b + l + i * pc.L] * pc.o.v[scratch + l + j * pc.L] +
                       pc.K.v[b + l + i * pc.L] * pc.V.v[b + l + j * pc.L];
            pc.o.v[next + e] = acc;
        }
        sync();
    }
    for (uint e = tid; e < LS; e += 256) pc.o.v[scratch + e] = 0.0;  // the output's scratch: zeros on return
#elif defined(BACKWARD)
    uint block = LS * pc.N * pc.c;  // one of gW, gU, gB, gK, gV
    uint gU = block, gB = 2 * block, gK = 3 * block, gV = 4 * block, gdecay = 5 * block;
    uint D = gdecay + pc.S * pc.N * pc.c + n * SS;  // gZ0's block of this batch: the walking gradient
    uint scratch = gdecay + pc.S * pc.N * pc.c + SS * pc.N + n * LS;
    for (uint e = tid; e < SS; e += 256) pc.o.v[D + e] = pc.g.v[state_at(pc.c) + e];
    sync();
    for (uint q = pc.c; q-- > 0;) {
        uint b = block_at(q), z = state_at(q), gamma = (n + pc.N * q) * pc.S;
        sa_of_chunk(b, z, scratch);
        for (uint e = tid; e < LS; e += 256) {  // dT = B D (kept in gU), gV = K D
            uint l = e % pc.L, j = e / pc.L;
            float t = 0.0, v = 0.0;
            for (uint i = 0; i < pc.S; ++i) {
                float d = pc.o.v[D + i + j * pc.S];
                t += pc.B.v[b + l + i * pc.L] * d;
                v += pc.K.v[b + l + i * pc.L] * d;
            }
            pc.o.v[gU + b + e] = t;
            pc.o.v[gV + b + e] = v;
        }
        sync();
        for (uint e = tid; e < LS; e += 256) {  // gB = T D^T, gK = V D^T, gW = dT Z^T
            uint l = e % pc.L, i = e / pc.L;
            float gb = 0.0, gk = 0.0, gw = 0.0;
            for (uint j = 0; j < pc.S; ++j) {
                float d = pc.o.v[D + i + j * pc.S];
                gb += pc.o.v[scratch + l + j * pc.L] * d;
                gk += pc.V.v[b + l + j * pc.L] * d;
                gw += pc.o.v[gU + b + l + j * pc.L] * state(z + i + j * pc.S);
            }
            pc.o.v[gB + b + e] = gb;
            pc.o.v[gK + b + e] = gk;
            pc.o.v[b + e] = gw;
        }
        for (uint i = tid; i < pc.S; i += 256) {  // gdecay[i] = sum_j D[i, j] Z[i, j]
            float gd = 0.0;
            for (uint j = 0; j < pc.S; ++j) gd += pc.o.v[D + i + j * pc.S] * state(z + i + j * pc.S);
            pc.o.v[gdecay + gamma + i] = gd;
        }
        sync();
        for (uint e = tid; e < SS; e += 256) {  // D = decay D + g_q + W^T dT
            uint i = e % pc.S, j = e / pc.S;
            float acc = pc.decay.v[gamma + i] * pc.o.v[D + e] + pc.g.v[z + e];
            for (uint l = 0; l < pc.L; ++l) acc += pc.W.v[b + l + i * pc.L] * pc.o.v[gU + b + l + j * pc.L];
            pc.o.v[D + e] = acc;
        }
        sync();
    }
    for (uint e = tid; e < LS; e += 256) pc.o.v[scratch + e] = 0.0;
#endif
}
