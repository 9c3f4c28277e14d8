// wkv7_chunk_states and its backward (native/cpu_wkv7_chunks.cpp has the layouts and the
// formulas): rwkv_wkv7's chunked form passing its state from chunk to chunk. One workgroup per
// batch n walks the chunks in order (FORWARD) or from the end (BACKWARD); within a chunk, each
// product's outputs are spread over the invocations (e = tid + 256 m), each summing its terms in
// the CPU kernel's order, so there are no atomics and the results are deterministic. The S x S
// states live in global memory, so any head size fits. FORWARD_STAGED (the sizes
// staged_chunk_states_fit allows): the same sums in the same order, one workgroup per batch n
// and block of value columns j (the state's columns pass from chunk to chunk on their own), the
// block's state, the chunk's W, B, K and the block's T and V in shared memory, rows padded to
// an odd length so that invocations reading down a column hit different banks, each chunk's
// inputs loaded into registers while the chunk before is summed. The backward, where
// chunk_states_back_splits allows, in two kernels: BACK_WALK, one workgroup per batch n and block
// of value columns (a gradient's columns, too, pass from chunk to chunk on their own), walks the
// chunks from the end with the block's D and dT in shared memory, writing dT (gU), gV and D
// after each chunk (its STAGED form, where staged_walk_fits allows, holds the chunk's W, B, K
// there too, loaded as the forward's are); BACK_SUMS, one workgroup per chunk and block of key
// rows, sums what mixes the columns (gB, gK, gW, gdecay) with every chunk at once. The same sums
// in BACKWARD's order.
#version 450
#include "common.glsl"
#include "staged_arrays.def"

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
    Floats ends;  // BACK_WALK's D after each chunk [S, S, N, c], for BACK_SUMS
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
uint sa_start() { return SS * pc.N * (pc.c + 1); }  // T [L, S, N, c] in the forward's output, after the states

#if defined(FORWARD_STAGED) || defined(STAGED)
// The staged walks' chunk of W, B and K [L, S]: loaded into registers (by element tid + 256 m)
// while the chunk before is summed, so that the walk waits on no load (unconditionally: NVIDIA's
// compiler waits for a load inside a branch where it joins), then into shared memory.
const uint INPUT_MAX = RK_WKV7_STAGED_INPUTS, INPUT_EACH = (INPUT_MAX + 255) / 256;
shared float Ws[INPUT_MAX], Bs[INPUT_MAX], Ks[INPUT_MAX];  // [l + (L + 1) i]
float W_next[INPUT_EACH], B_next[INPUT_EACH], K_next[INPUT_EACH];

void load_chunk_inputs(uint b) {
    for (uint m = 0; m < INPUT_EACH; ++m) {
        uint e = gl_LocalInvocationID.x + 256 * m;
        W_next[m] = element(pc.W, b + e, e < LS);
        B_next[m] = element(pc.B, b + e, e < LS);
        K_next[m] = element(pc.K, b + e, e < LS);
    }
}

void stage_chunk_inputs() {
    for (uint m = 0; m < INPUT_EACH; ++m) {
        uint e = gl_LocalInvocationID.x + 256 * m, l = e % pc.L, i = e / pc.L;
        if (e >= LS) break;
        Ws[l + (pc.L + 1) * i] = W_next[m];
        Bs[l + (pc.L + 1) * i] = B_next[m];
        Ks[l + (pc.L + 1) * i] = K_next[m];
    }
}
#endif

#if defined(BACK_WALK)
const uint DT_MAX = RK_WKV7_WALK_DT, DT_EACH = (DT_MAX + 255) / 256;
#if defined(STAGED)
const uint CB = RK_WKV7_WALK_STAGED_COLUMNS, D_MAX = RK_WKV7_WALK_STAGED_STATE;
#else
const uint CB = RK_WKV7_WALK_COLUMNS, D_MAX = RK_WKV7_WALK_STATE;
#endif
const uint D_EACH = (D_MAX + 255) / 256;  // D's update's outputs per invocation, at most
shared float Ds[D_MAX];    // [jj + (CB + 1) i]: the block's columns of D, the gradient of the state after the chunk
shared float dTs[DT_MAX];  // [l + (L + 1) jj]: the block's columns of dT
uint L, S, j0, cb, tid;

#if defined(STAGED)
// The rest of a chunk's inputs in registers, loaded as W, B and K are: gT by dT's outputs; g_q and
// the decays by D's update's outputs, loaded once the update before has read them.
float gT_next[DT_EACH], gT_now[DT_EACH], g_next[D_EACH], decay_next[D_EACH];

void load_inputs(uint q) {
    uint b = block_at(q);
    load_chunk_inputs(b);
    for (uint m = 0; m < DT_EACH; ++m) {
        uint e = tid + 256 * m, l = e % L, jj = e / L;
        gT_next[m] = element(pc.g, sa_start() + b + l + (j0 + jj) * L, e < L * cb);
    }
}

void load_update_terms(uint q) {
    uint z = state_at(q), gamma = (n + pc.N * q) * S;
    for (uint m = 0; m < D_EACH; ++m) {
        uint e = tid + 256 * m, jj = e % cb, i = e / cb;
        g_next[m] = element(pc.g, z + i + (j0 + jj) * S, e < S * cb);
        decay_next[m] = element(pc.decay, gamma + i, e < S * cb);
    }
}

// The loaded chunk into shared memory and the registers it is summed from.
void take_next() {
    stage_chunk_inputs();
    gT_now = gT_next;
}

float W_at(uint b, uint l, uint i) { return Ws[l + (L + 1) * i]; }
float B_at(uint b, uint l, uint i) { return Bs[l + (L + 1) * i]; }
float K_at(uint b, uint l, uint i) { return Ks[l + (L + 1) * i]; }
float g_at(uint m, uint at) { return g_next[m]; }
float decay_at(uint m, uint at) { return decay_next[m]; }
float gT_at(uint m, uint at) { return gT_now[m]; }
#else
float W_at(uint b, uint l, uint i) { return pc.W.v[b + l + i * L]; }
float B_at(uint b, uint l, uint i) { return pc.B.v[b + l + i * L]; }
float K_at(uint b, uint l, uint i) { return pc.K.v[b + l + i * L]; }
float g_at(uint m, uint at) { return pc.g.v[at]; }
float decay_at(uint m, uint at) { return pc.decay.v[at]; }
float gT_at(uint m, uint at) { return pc.g.v[sa_start() + at]; }
#endif

void main() {
    L = pc.L, S = pc.S;
    uint blocks = (S + CB - 1) / CB, group = flat_group();
    if (group >= pc.N * blocks) return;  // a whole workgroup of the folded grid's padding
    n = group % pc.N;
    LS = L * S;
    SS = S * S;
    j0 = (group / pc.N) * CB, cb = min(CB, S - j0), tid = gl_LocalInvocationID.x;
    uint rowD = CB + 1, rowT = L + 1, block = LS * pc.N * pc.c;  // block: one of gW, gU, gB, gK, gV
    uint gU = block, gV = 4 * block, gZ0 = 5 * block + S * pc.N * pc.c + n * SS;
    for (uint e = tid; e < S * cb; e += 256) {  // i fastest: coalesced reads
        uint i = e % S, jj = e / S;
        Ds[jj + rowD * i] = pc.g.v[state_at(pc.c) + i + (j0 + jj) * S];
    }
#if defined(STAGED)
    load_inputs(pc.c - 1);
    load_update_terms(pc.c - 1);
#endif
    for (uint q = pc.c; q-- > 0;) {
        uint b = block_at(q), z = state_at(q), gamma = (n + pc.N * q) * S;
#if defined(STAGED)
        take_next();
        barrier();
        load_inputs(max(q, 1) - 1);  // the chunk before (at the first, this one again: unused)
#else
        barrier();
#endif
        for (uint m = 0; m < DT_EACH; ++m) {  // dT = gT + B D (gU), gV = K D: the block's columns
            uint e = tid + 256 * m, l = e % L, jj = e / L, at = b + l + (j0 + jj) * L;
            if (e >= L * cb) break;
            float dt = gT_at(m, at), v = 0.0;
            for (uint i = 0; i < S; ++i) {
                float d = Ds[jj + rowD * i];
                dt += B_at(b, l, i) * d;
                v += K_at(b, l, i) * d;
            }
            pc.o.v[gU + at] = dt;
            pc.o.v[gV + at] = v;
            dTs[l + rowT * jj] = dt;
        }
        for (uint e = tid; e < S * cb; e += 256) {  // D as it stands, for BACK_SUMS, i fastest
            uint i = e % S, jj = e / S;
            pc.ends.v[z + i + (j0 + jj) * S] = Ds[jj + rowD * i];
        }
        barrier();
        for (uint m = 0; m < D_EACH; ++m) {  // D = decay D + g_q + W^T dT, jj fastest
            uint e = tid + 256 * m, jj = e % cb, i = e / cb;
            if (e >= S * cb) break;
            float acc = decay_at(m, gamma + i) * Ds[jj + rowD * i] + g_at(m, z + i + (j0 + jj) * S);
            for (uint l = 0; l < L; ++l) acc += W_at(b, l, i) * dTs[l + rowT * jj];
            Ds[jj + rowD * i] = acc;
        }
#if defined(STAGED)
        load_update_terms(max(q, 1) - 1);
#endif
        barrier();
    }
    for (uint e = tid; e < S * cb; e += 256) {
        uint i = e % S, jj = e / S;
        pc.o.v[gZ0 + i + (j0 + jj) * S] = Ds[jj + rowD * i];
    }
}
#elif defined(BACK_SUMS)
const uint JB = RK_WKV7_SUMS_TERMS, ROWS = RK_WKV7_SUMS_ROWS, OUTPUTS = RK_WKV7_SUMS_OUTPUTS;
shared float Ts[OUTPUTS], Vs[OUTPUTS], dTs[OUTPUTS];  // [l + L jj]: the terms' columns of T, V and dT
shared float Ds[ROWS * JB], Zs[ROWS * JB];             // [ii + IB jj]: the block's rows of D and Z, the terms' columns

void main() {
    uint L = pc.L, S = pc.S, IB = min(S, min(ROWS, OUTPUTS / L)), row_blocks = (S + IB - 1) / IB, group = flat_group();
    if (group >= pc.N * pc.c * row_blocks) return;  // a whole workgroup of the folded grid's padding
    LS = L * S;
    SS = S * S;
    uint nq = group / row_blocks, i0 = (group % row_blocks) * IB, ib = min(IB, S - i0), tid = gl_LocalInvocationID.x;
    uint b = nq * LS, z = nq * SS, block = LS * pc.N * pc.c;
    uint gU = block, gB = 2 * block, gK = 3 * block, gdecay = 5 * block;
    float gb[OUTPUTS / 256], gk[OUTPUTS / 256], gw[OUTPUTS / 256], gd = 0.0;
    for (uint m = 0; m < OUTPUTS / 256; ++m) gb[m] = gk[m] = gw[m] = 0.0;
    for (uint j0 = 0; j0 < S; j0 += JB) {  // the terms j in order, JB at a time
        uint jb = min(JB, S - j0);
        for (uint e = tid; e < L * jb; e += 256) {
            uint at = b + j0 * L + e;
            Ts[e] = pc.Z.v[sa_start() + at];
            Vs[e] = pc.V.v[at];
            dTs[e] = pc.o.v[gU + at];
        }
        for (uint e = tid; e < ib * jb; e += 256) {  // ii fastest: coalesced reads
            uint ii = e % ib, jj = e / ib, at = z + i0 + ii + (j0 + jj) * S;
            Ds[ii + IB * jj] = pc.ends.v[at];
            Zs[ii + IB * jj] = pc.Z.v[at];
        }
        barrier();
        for (uint m = 0; m < OUTPUTS / 256; ++m) {  // gB = T D^T, gK = V D^T, gW = dT Z^T
            uint e = tid + 256 * m, l = e % L, ii = e / L;
            if (e >= L * ib) break;
            for (uint jj = 0; jj < jb; ++jj) {
                float d = Ds[ii + IB * jj];
                gb[m] += Ts[l + L * jj] * d;
                gk[m] += Vs[l + L * jj] * d;
                gw[m] += dTs[l + L * jj] * Zs[ii + IB * jj];
            }
        }
        if (tid < ib)  // gdecay[i] = sum_j D[i, j] Z[i, j]
            for (uint jj = 0; jj < jb; ++jj) gd += Ds[tid + IB * jj] * Zs[tid + IB * jj];
        barrier();
    }
    for (uint m = 0; m < OUTPUTS / 256; ++m) {
        uint e = tid + 256 * m, l = e % L, ii = e / L, at = b + l + (i0 + ii) * L;
        if (e >= L * ib) break;
        pc.o.v[gB + at] = gb[m];
        pc.o.v[gK + at] = gk[m];
        pc.o.v[at] = gw[m];
    }
    if (tid < ib) pc.o.v[gdecay + nq * S + i0 + tid] = gd;
}
#elif defined(FORWARD_STAGED)
const uint BLOCK_STATE_MAX = RK_WKV7_FORWARD_BLOCK_STATE, SMALL_MAX = RK_WKV7_FORWARD_SMALL,
           BLOCK_COLUMNS = RK_WKV7_FORWARD_BLOCK_COLUMNS;
const uint SMALL_EACH = (SMALL_MAX + 255) / 256, STATE_EACH = (BLOCK_STATE_MAX + 255) / 256;
shared float Zs[BLOCK_STATE_MAX];           // [jj + (cb + 1) i]: the block's state
shared float Ts[SMALL_MAX], Vs[SMALL_MAX];  // [l + (L + 1) jj]: the block's T and V
// The rest of a chunk's inputs in registers, loaded as W, B and K are: V and U by T's outputs,
// the decays by the next state's.
float V_next[SMALL_EACH], U_next[SMALL_EACH], decay_next[STATE_EACH];
uint L, S, j0, cb, tid;

void load_next(uint q) {
    uint b = block_at(q), gamma = (n + pc.N * q) * S;
    load_chunk_inputs(b);
    for (uint m = 0; m < SMALL_EACH; ++m) {
        uint e = tid + 256 * m, at = b + e % L + (j0 + e / L) * L;
        V_next[m] = element(pc.V, at, e < L * cb);
        U_next[m] = element(pc.U, at, e < L * cb);
    }
    for (uint m = 0; m < STATE_EACH; ++m) {
        uint e = tid + 256 * m;
        decay_next[m] = element(pc.decay, gamma + e / cb, e < S * cb);
    }
}

void main() {
    L = pc.L, S = pc.S;
    uint CB = min(BLOCK_COLUMNS, S), blocks = (S + CB - 1) / CB, g = flat_group();
    if (g >= pc.N * blocks) return;  // a whole workgroup of the folded grid's padding
    n = g % pc.N;
    LS = L * S;
    SS = S * S;
    j0 = (g / pc.N) * CB, cb = min(CB, S - j0), tid = gl_LocalInvocationID.x;
    uint rowL = L + 1, rowZ = cb + 1;
    for (uint e = tid; e < S * cb; e += 256) {  // i fastest: coalesced reads and writes
        uint i = e % S, jj = e / S;
        float z = pc.Z0.v[n * SS + i + (j0 + jj) * S];
        Zs[jj + rowZ * i] = z;
        pc.o.v[state_at(0) + i + (j0 + jj) * S] = z;
    }
    load_next(0);
    for (uint q = 0; q < pc.c; ++q) {
        uint b = block_at(q), next = state_at(q + 1);
        stage_chunk_inputs();
        for (uint m = 0; m < SMALL_EACH; ++m) {
            uint e = tid + 256 * m;
            if (e >= L * cb) break;
            Vs[e % L + rowL * (e / L)] = V_next[m];
        }
        float U_now[SMALL_EACH] = U_next, decay_now[STATE_EACH] = decay_next;
        barrier();
        load_next(min(q + 1, pc.c - 1));  // unconditionally (at the last chunk, itself again: unused)
        for (uint m = 0; m < SMALL_EACH; ++m) {  // T = W Z + U, the block's columns
            uint e = tid + 256 * m, l = e % L, jj = e / L;
            if (e >= L * cb) break;
            float t = U_now[m];
            for (uint i = 0; i < S; ++i) t += Ws[l + rowL * i] * Zs[jj + rowZ * i];
            Ts[l + rowL * jj] = t;
            pc.o.v[sa_start() + b + l + (j0 + jj) * L] = t;
        }
        barrier();
        for (uint m = 0; m < STATE_EACH; ++m) {  // Z_{q+1} = decay Z + B^T T + K^T V, jj fastest
            uint e = tid + 256 * m, jj = e % cb, i = e / cb;
            if (e >= S * cb) break;
            float acc = decay_now[m] * Zs[jj + rowZ * i];
            for (uint l = 0; l < L; ++l)
                acc += Bs[l + rowL * i] * Ts[l + rowL * jj] + Ks[l + rowL * i] * Vs[l + rowL * jj];
            Zs[jj + rowZ * i] = acc;
        }
        barrier();
        for (uint e = tid; e < S * cb; e += 256) {  // the state after the chunk out, i fastest
            uint i = e % S, jj = e / S;
            pc.o.v[next + i + (j0 + jj) * S] = Zs[jj + rowZ * i];
        }
    }
}
#else
void main() {
    n = flat_group();
    LS = pc.L * pc.S;
    SS = pc.S * pc.S;
    uint tid = gl_LocalInvocationID.x;
#if defined(FORWARD)
    for (uint e = tid; e < SS; e += 256) pc.o.v[state_at(0) + e] = pc.Z0.v[n * SS + e];
    sync();
    for (uint q = 0; q < pc.c; ++q) {
        uint b = block_at(q), z = state_at(q), next = state_at(q + 1), gamma = (n + pc.N * q) * pc.S;
        uint sa = sa_start() + b;
        for (uint e = tid; e < LS; e += 256) {  // T = W Z + U
            uint l = e % pc.L, j = e / pc.L;
            float t = pc.U.v[b + e];
            for (uint i = 0; i < pc.S; ++i) t += pc.W.v[b + l + i * pc.L] * pc.o.v[z + i + j * pc.S];
            pc.o.v[sa + e] = t;
        }
        sync();
        for (uint e = tid; e < SS; e += 256) {  // Z_{q+1} = decay Z + B^T T + K^T V
            uint i = e % pc.S, j = e / pc.S;
            float acc = pc.decay.v[gamma + i] * pc.o.v[z + e];
            for (uint l = 0; l < pc.L; ++l)
                acc += pc.B.v[b + l + i * pc.L] * pc.o.v[sa + l + j * pc.L] +
                       pc.K.v[b + l + i * pc.L] * pc.V.v[b + l + j * pc.L];
            pc.o.v[next + e] = acc;
        }
        sync();
    }
#elif defined(BACKWARD)
    uint block = LS * pc.N * pc.c;  // one of gW, gU, gB, gK, gV
    uint gU = block, gB = 2 * block, gK = 3 * block, gV = 4 * block, gdecay = 5 * block;
    uint D = gdecay + pc.S * pc.N * pc.c + n * SS;  // gZ0's block of this batch: the walking gradient
    for (uint e = tid; e < SS; e += 256) pc.o.v[D + e] = pc.g.v[state_at(pc.c) + e];
    sync();
    for (uint q = pc.c; q-- > 0;) {
        uint b = block_at(q), z = state_at(q), gamma = (n + pc.N * q) * pc.S, sa = sa_start() + b;
        for (uint e = tid; e < LS; e += 256) {  // dT = gT + B D (kept in gU), gV = K D
            uint l = e % pc.L, j = e / pc.L;
            float t = pc.g.v[sa + e], v = 0.0;
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
                gb += pc.Z.v[sa + l + j * pc.L] * d;
                gk += pc.V.v[b + l + j * pc.L] * d;
                gw += pc.o.v[gU + b + l + j * pc.L] * pc.Z.v[z + i + j * pc.S];
            }
            pc.o.v[gB + b + e] = gb;
            pc.o.v[gK + b + e] = gk;
            pc.o.v[b + e] = gw;
        }
        for (uint i = tid; i < pc.S; i += 256) {  // gdecay[i] = sum_j D[i, j] Z[i, j]
            float gd = 0.0;
            for (uint j = 0; j < pc.S; ++j) gd += pc.o.v[D + i + j * pc.S] * pc.Z.v[z + i + j * pc.S];
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
#endif
}
#endif
