// gla_chunks and its backward (native/cpu_gla_chunks.cpp has the layouts and formulas): gated
// linear attention in chunks, one workgroup per (sequence, head) walking its chunks in order
// (backward: from the last), the state carried in the output (forward: the start states' region;
// backward: two slots of the scratch). Per chunk the decays D and E and the pairs A go to this
// workgroup's scratch, each a running sum of log gates from s up (as the CPU's), then every output
// of the chunk is an invocation's sum over the channels or tokens it reads.
#version 450
#include "common.glsl"

// Storage that invocations of one workgroup write and then read from one another.
layout(buffer_reference, std430, buffer_reference_align = 4) coherent buffer Shared { float v[]; };

layout(push_constant) uniform Push {
#if defined(BACKWARD)
    Floats g;    // the upstream gradient, shaped like the forward's output
    Floats fwd;  // the forward's output: its start states
#else
    Floats state;
#endif
    Floats k;
    Floats v;
    Floats q;
    Floats lg;
    Shared o;
    Shared scratch;
    uint S;
    uint H;
    uint n_tok;   // per sequence
    uint L;       // tokens per chunk (the last chunk may have fewer)
    uint c;       // chunks per sequence
    uint n_seqs;
    float scale;
} pc;

// Makes every invocation's global writes visible to the whole workgroup.
void sync() {
    memoryBarrierBuffer();
    barrier();
}

uint S, n, stride, at;      // channels; this chunk's tokens; a token's vector to the next's; the first's
uint D_at, E_at, A_at;      // this workgroup's scratch: D [s][t][i], E [t][i], A [t][s] (rows of L)

uint tok(uint t) { return at + t * stride; }
float D(uint s, uint t, uint i) { return pc.scratch.v[D_at + (s * pc.L + t) * S + i]; }
float E(uint t, uint i) { return pc.scratch.v[E_at + t * S + i]; }
float A(uint t, uint s) { return pc.scratch.v[A_at + t * pc.L + s]; }

// The chunk's decays, then its pairs A[t, s] = scale sum_i q[t, i] k[s, i] D[s, t, i] (s <= t).
void decays_and_pairs() {
    uint tid = gl_LocalInvocationID.x;
    for (uint i = tid; i < S; i += 256) {
        float sum = 0.0;
        for (uint t = 0; t < n; ++t) {
            sum += pc.lg.v[tok(t) + i];
            pc.scratch.v[E_at + t * S + i] = exp(sum);
        }
    }
    for (uint e = tid; e < n * S; e += 256) {  // range from s, channel i: consecutive invocations, consecutive channels
        uint s = e / S, i = e % S;
        float sum = 0.0;
        pc.scratch.v[D_at + (s * pc.L + s) * S + i] = 1.0;
        for (uint t = s + 1; t < n; ++t) {
            sum += pc.lg.v[tok(t) + i];
            pc.scratch.v[D_at + (s * pc.L + t) * S + i] = exp(sum);
        }
    }
    sync();
    for (uint e = tid; e < n * n; e += 256) {
        uint t = e / n, s = e % n;
        if (s > t) continue;
        float a = 0.0;
        for (uint i = 0; i < S; ++i) a += pc.q.v[tok(t) + i] * pc.k.v[tok(s) + i] * D(s, t, i);
        pc.scratch.v[A_at + t * pc.L + s] = pc.scale * a;
    }
    sync();
}

#if !defined(BACKWARD)
void main() {
    uint wg = flat_group(), tid = gl_LocalInvocationID.x;
    if (wg >= pc.n_seqs * pc.H) return;  // a whole workgroup of the folded grid's padding
    uint b = wg / pc.H, h = wg % pc.H, SS = pc.S * pc.S;
    S = pc.S;
    stride = S * pc.H;
    uint ny = stride * pc.n_tok * pc.n_seqs, states = SS * pc.H * pc.n_seqs;
    uint final_at = ny + wg * SS, starts_at = ny + states + wg * pc.c * SS;  // wg = b H + h
    D_at = wg * (pc.L * pc.L * S + pc.L * S + pc.L * pc.L);
    E_at = D_at + pc.L * pc.L * S;
    A_at = E_at + pc.L * S;
    for (uint e = tid; e < SS; e += 256) pc.o.v[starts_at + e] = pc.state.v[wg * SS + e];
    sync();
    for (uint chunk = 0; chunk < pc.c; ++chunk) {
        uint t0 = chunk * pc.L;
        n = min(pc.L, pc.n_tok - t0);
        at = ((b * pc.n_tok + t0) * pc.H + h) * S;
        uint z = starts_at + chunk * SS, z_next = chunk + 1 < pc.c ? z + SS : final_at;
        decays_and_pairs();
        for (uint e = tid; e < n * S; e += 256) {  // y[t, j]: the start state's part, then the chunk's tokens
            uint t = e / S, j = e % S;
            float y = 0.0;
            for (uint i = 0; i < S; ++i) y += pc.scale * pc.q.v[tok(t) + i] * E(t, i) * pc.o.v[z + i * S + j];
            for (uint s = 0; s <= t; ++s) y += A(t, s) * pc.v.v[tok(s) + j];
            pc.o.v[tok(t) + j] = y;
        }
        for (uint e = tid; e < SS; e += 256) {  // the next start state [i, j]
            uint i = e / S, j = e % S;
            float next = E(n - 1, i) * pc.o.v[z + e];
            for (uint s = 0; s < n; ++s) next += pc.k.v[tok(s) + i] * D(s, n - 1, i) * pc.v.v[tok(s) + j];
            pc.o.v[z_next + e] = next;
        }
        sync();
    }
}
#else
uint dA_at, ZY_at, ZV_at, W_at;  // more scratch: dA [t][s], ZY [t][i], ZV [s][i], W [i]

float dA(uint t, uint s) { return pc.scratch.v[dA_at + t * pc.L + s]; }
float ZY(uint t, uint i) { return pc.scratch.v[ZY_at + t * S + i]; }
float ZV(uint s, uint i) { return pc.scratch.v[ZV_at + s * S + i]; }

void main() {
    uint wg = flat_group(), tid = gl_LocalInvocationID.x;
    if (wg >= pc.n_seqs * pc.H) return;  // a whole workgroup of the folded grid's padding
    uint b = wg / pc.H, h = wg % pc.H, SS = pc.S * pc.S;
    S = pc.S;
    stride = S * pc.H;
    uint ny = stride * pc.n_tok * pc.n_seqs, states = SS * pc.H * pc.n_seqs;
    uint final_at = ny + wg * SS, starts_at = ny + states + wg * pc.c * SS;  // in g and in fwd alike
    uint LL = pc.L * pc.L, LS = pc.L * S;
    D_at = wg * (LL * S + 3 * LS + 2 * LL + S + 2 * SS);
    E_at = D_at + LL * S;
    A_at = E_at + LS;
    dA_at = A_at + LL;
    ZY_at = dA_at + LL;
    ZV_at = ZY_at + LS;
    W_at = ZV_at + LS;
    uint slots = W_at + S, dZ = slots, dZ_next = slots + SS;  // the walking gradient, two slots
    for (uint e = tid; e < SS; e += 256) pc.scratch.v[dZ + e] = pc.g.v[final_at + e];
    sync();
    for (uint chunk = pc.c; chunk-- > 0;) {
        uint t0 = chunk * pc.L;
        n = min(pc.L, pc.n_tok - t0);
        at = ((b * pc.n_tok + t0) * pc.H + h) * S;
        uint z = starts_at + chunk * SS;  // this chunk's start state in fwd, its own gradient in g
        decays_and_pairs();
        for (uint e = tid; e < n * n; e += 256) {  // dA[t, s] = dy[t] . v[s]
            uint t = e / n, s = e % n;
            if (s > t) continue;
            float a = 0.0;
            for (uint j = 0; j < S; ++j) a += pc.g.v[tok(t) + j] * pc.v.v[tok(s) + j];
            pc.scratch.v[dA_at + t * pc.L + s] = a;
        }
        for (uint e = tid; e < n * S; e += 256) {  // ZY[t, i] = Z[i] . dy[t], ZV[t, i] = dZ'[i] . v[t]
            uint t = e / S, i = e % S;
            float zy = 0.0, zv = 0.0;
            for (uint j = 0; j < S; ++j) {
                zy += pc.fwd.v[z + i * S + j] * pc.g.v[tok(t) + j];
                zv += pc.scratch.v[dZ + i * S + j] * pc.v.v[tok(t) + j];
            }
            pc.scratch.v[ZY_at + t * S + i] = zy;
            pc.scratch.v[ZV_at + t * S + i] = zv;
        }
        for (uint i = tid; i < S; i += 256) {  // W[i] = Z[i] . dZ'[i]
            float w = 0.0;
            for (uint j = 0; j < S; ++j) w += pc.fwd.v[z + i * S + j] * pc.scratch.v[dZ + i * S + j];
            pc.scratch.v[W_at + i] = w;
        }
        sync();
        for (uint e = tid; e < n * S; e += 256) {  // token x, channel ch: gv, gk, gq and glog_gate
            uint x = e / S, ch = e % S;
            float gv = 0.0;
            for (uint t = x; t < n; ++t) gv += A(t, x) * pc.g.v[tok(t) + ch];
            for (uint i = 0; i < S; ++i) gv += pc.k.v[tok(x) + i] * D(x, n - 1, i) * pc.scratch.v[dZ + i * S + ch];
            float gk = 0.0;
            for (uint t = x; t < n; ++t) gk += dA(t, x) * pc.q.v[tok(t) + ch] * D(x, t, ch);
            gk = pc.scale * gk + D(x, n - 1, ch) * ZV(x, ch);
            float gq = E(x, ch) * ZY(x, ch);
            for (uint s = 0; s <= x; ++s) gq += dA(x, s) * pc.k.v[tok(s) + ch] * D(s, x, ch);
            float span = E(n - 1, ch) * pc.scratch.v[W_at + ch];  // each decay that spans log gate x
            for (uint t = x; t < n; ++t) span += pc.scale * pc.q.v[tok(t) + ch] * E(t, ch) * ZY(t, ch);
            for (uint s = 0; s < x; ++s) {
                float pairs = 0.0;
                for (uint t = x; t < n; ++t) pairs += dA(t, s) * pc.q.v[tok(t) + ch] * D(s, t, ch);
                span += pc.k.v[tok(s) + ch] * (D(s, n - 1, ch) * ZV(s, ch) + pc.scale * pairs);
            }
            pc.o.v[tok(x) + ch] = gk;
            pc.o.v[ny + tok(x) + ch] = gv;
            pc.o.v[2 * ny + tok(x) + ch] = pc.scale * gq;
            pc.o.v[3 * ny + tok(x) + ch] = span;
        }
        for (uint e = tid; e < SS; e += 256) {  // the start state's gradient, its own added
            uint i = e / S, j = e % S;
            float next = E(n - 1, i) * pc.scratch.v[dZ + e] + pc.g.v[z + e];
            for (uint t = 0; t < n; ++t) next += pc.scale * pc.q.v[tok(t) + i] * E(t, i) * pc.g.v[tok(t) + j];
            pc.scratch.v[dZ_next + e] = next;
        }
        sync();
        uint swap = dZ;
        dZ = dZ_next;
        dZ_next = swap;
    }
    for (uint e = tid; e < SS; e += 256) pc.o.v[4 * ny + wg * SS + e] = pc.scratch.v[dZ + e];
}
#endif
